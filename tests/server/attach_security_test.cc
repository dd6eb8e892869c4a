// Who may attach as a rank: fake ranks on the rank port (no proof with the right digest or a
// wrong one; a proof of the secret but a wrong digest, a foreign transport, or a slot a live rank
// holds) are all refused, no Setup or Step reaches them, no Reject carries the digest, and the
// service keeps serving the same bytes throughout. Real rank processes with a wrong secret or
// none do not start serving; a secret file others can read stops the coordinator.
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "config/config.h"
#include "engine/shm_exchange.h"
#include "gcmoe/internal/v1/rank.grpc.pb.h"
#include "server/attach_secret.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

namespace internal = gcmoe::internal::v1;

struct FakeAttach {
  bool challenged = false;
  std::vector<internal::CoordinatorMessage> received;  // everything after the Hello
  grpc::Status status;
};

// Dials the rank port as a rank would, answers the challenge with `hello` (signed with `secret`
// when given, else with 32 bytes of guesswork) and reads until the coordinator ends the stream.
FakeAttach Attach(const std::string& rank_address, internal::Hello hello,
                  const AttachSecret* secret) {
  FakeAttach result;
  auto stub = internal::RankControl::NewStub(
      grpc::CreateChannel(rank_address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + milliseconds(15000));
  auto stream = stub->Attach(&context);
  internal::CoordinatorMessage message;
  if (stream->Read(&message) && message.has_challenge()) {
    result.challenged = true;
    hello.set_attach_proof(secret != nullptr ? secret->Proof(message.challenge().nonce(), hello)
                                             : std::string(32, '\x5a'));
    internal::RankMessage first;
    *first.mutable_hello() = hello;
    if (stream->Write(first)) {
      while (stream->Read(&message)) result.received.push_back(message);
    }
  }
  result.status = stream->Finish();
  return result;
}

internal::Hello FakeHello(int rank, const std::string& digest, const std::string& transport) {
  internal::Hello hello;
  hello.set_rank(rank);
  hello.set_world_size(2);
  hello.set_config_digest(digest);
  hello.set_pid(999999);
  hello.set_incarnation(1234);
  hello.set_transport_name(transport);
  hello.set_host("elsewhere");
  return hello;
}

std::string ReadSecret(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

gcmoe::v1::ForwardRequest Request() {
  RequestSpec r;
  r.num_tokens = 24;
  r.seed = 40;
  return MakeForwardRequest(DefaultModel(), r);
}

TEST(AttachSecurityTest, FakeRanksAreRefusedAndTheServiceKeepsServingTheSameBytes) {
  SeparateProcesses service("attach");
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();
  const std::string digest = config::DefaultConfig().Digest();
  const AttachSecret secret = AttachSecret::FromBytes(ReadSecret(service.secret_file()));
  const std::string instance = secret.InstanceName(digest);

  auto stub = Connect(service.address());
  gcmoe::v1::ForwardResponse reference;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Forward(&context, Request(), &reference).ok()) << service.Logs();
  }

  // Clients keep calling while the fakes knock: every call must come back OK with the bytes
  // the real ranks computed.
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::atomic<int> wrong{0};
  std::thread client([&] {
    auto own_stub = Connect(service.address());
    while (!stop.load()) {
      gcmoe::v1::ForwardResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + milliseconds(20000));
      const grpc::Status status = own_stub->Forward(&context, Request(), &response);
      ++calls;
      if (!status.ok() || response.output().data() != reference.output().data()) ++wrong;
    }
  });

  struct Case {
    std::string name;
    internal::Hello hello;
    bool signed_with_secret;
    bool retryable;
  };
  const std::vector<Case> cases = {
      {"right digest, no proof",
       FakeHello(0, digest, engine::ShmExchange::SegmentName(instance, 0)), false, false},
      {"wrong digest, no proof", FakeHello(1, "0000000000000000", "/gcmoe-x-r1"), false, false},
      {"proof, wrong digest", FakeHello(1, "0000000000000000", "/gcmoe-x-r1"), true, false},
      {"proof, foreign transport", FakeHello(1, digest, "/gcmoe-someone-else-r1"), true, false},
      {"proof, a live rank's slot",
       FakeHello(0, digest, engine::ShmExchange::SegmentName(instance, 0)), true, true},
  };
  for (const Case& c : cases) {
    const FakeAttach fake =
        Attach(service.rank_address(), c.hello, c.signed_with_secret ? &secret : nullptr);
    EXPECT_TRUE(fake.challenged) << c.name;
    ASSERT_EQ(fake.received.size(), 1u) << c.name << ": only a Reject may reach a refused rank";
    ASSERT_TRUE(fake.received[0].has_reject()) << c.name << ": " << fake.received[0].DebugString();
    const internal::Reject& reject = fake.received[0].reject();
    EXPECT_EQ(reject.retryable(), c.retryable) << c.name << ": " << reject.reason();
    EXPECT_EQ(reject.reason().find(digest), std::string::npos) << c.name << ": " << reject.reason();
    EXPECT_EQ(fake.status.error_message().find(digest), std::string::npos) << c.name;
    if (!c.signed_with_secret) {
      EXPECT_EQ(fake.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << c.name;
      EXPECT_NE(reject.reason().find("no valid proof"), std::string::npos) << reject.reason();
    }
    EXPECT_EQ(HealthStatus(service.address()), "SERVING") << c.name;
  }
  // A few more calls after the last fake, then stop the client.
  const int calls_after_fakes = calls.load() + 3;
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(30000);
  while (calls.load() < calls_after_fakes && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  stop = true;
  client.join();
  EXPECT_GE(calls.load(), 3);
  EXPECT_EQ(wrong.load(), 0) << service.Logs();

  // The real ranks were never displaced.
  gcmoe::v1::Stats stats;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetStats(&context, {}, &stats).ok());
  ASSERT_EQ(stats.ranks_size(), 2);
  EXPECT_EQ(stats.ranks(0).restarts(), 0u);
  EXPECT_EQ(stats.ranks(1).restarts(), 0u);
  const std::string log = service.coordinator().Log();
  EXPECT_EQ(log.find("disconnected"), std::string::npos) << log;

  // The exchange segments the real ranks made are theirs alone.
  for (int r = 0; r < 2; ++r) {
    struct stat st {};
    const std::string path = "/dev/shm" + engine::ShmExchange::SegmentName(instance, r);
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
  }
}

TEST(AttachSecurityTest, RankProcessesWithoutTheSecretNeverJoin) {
  SeparateProcesses service("attach-procs");
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(60000))) << service.Logs();

  // Another secret: refused for good (exit code 3), the service unharmed.
  const std::string other = WriteSecretFile("attach-procs-other");
  auto impostor = Process::Start({"rank", "--rank", "1", "--coordinator", service.rank_address(),
                                  "--set", "server.rank_secret_file=" + other},
                                 TempPath("attach-procs.impostor.log"));
  auto status = impostor->Wait(milliseconds(30000));
  ASSERT_TRUE(status.has_value()) << impostor->Log();
  EXPECT_EQ(WEXITSTATUS(*status), 3) << impostor->Log();
  EXPECT_NE(impostor->Log().find("no valid proof"), std::string::npos) << impostor->Log();
  EXPECT_EQ(HealthStatus(service.address()), "SERVING");

  // No secret at all: the rank does not start.
  auto bare = Process::Start({"rank", "--rank", "1", "--coordinator", service.rank_address()},
                             TempPath("attach-procs.bare.log"));
  status = bare->Wait(milliseconds(30000));
  ASSERT_TRUE(status.has_value()) << bare->Log();
  EXPECT_EQ(WEXITSTATUS(*status), 1) << bare->Log();
  EXPECT_NE(bare->Log().find("server.rank_secret_file: not set"), std::string::npos) << bare->Log();
  EXPECT_EQ(HealthStatus(service.address()), "SERVING");
}

TEST(AttachSecurityTest, ASecretOthersCanReadStopsTheCoordinator) {
  const std::string path = WriteSecretFile("attach-open");
  chmod(path.c_str(), 0644);
  auto coordinator = Process::Start({"coordinator", "--listen", "127.0.0.1:0", "--rank-listen",
                                     "127.0.0.1:0", "--set", "server.rank_secret_file=" + path},
                                    TempPath("attach-open.log"));
  const auto status = coordinator->Wait(milliseconds(30000));
  ASSERT_TRUE(status.has_value()) << coordinator->Log();
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  EXPECT_NE(coordinator->Log().find("has mode 0644"), std::string::npos) << coordinator->Log();
}

}  // namespace
}  // namespace gcmoe::server::testing
