// The coordinator's side of registered GPU memory (cuda_ipc), with ranks that speak the attach
// protocol from this test instead of opening anything: a `gcmoe coordinator` configured for the
// cuda backend (it holds no CUDA context itself), two scripted ranks on its host. (The last test
// uses them for the coordinator's check of the outputs it assembles.) They check
// what the coordinator asks of the ranks and what it answers the client: every rank is asked to
// open a registration before RegisterMemory answers, one rank's refusal refuses it (and the
// others close it again), each rank gets its own rows of a call as a range of the registration,
// a bad value a rank found on the GPU fails that call only, unregistering closes the memory on
// every rank, a restarted rank is handed every live registration, and one it cannot open again
// is refused to the calls that name it. The GPU side (opening, copying, checking) is
// CudaIpcMemoryTest's, on a GPU.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/status.h"
#include "config/config.h"
#include "gcmoe/internal/v1/rank.grpc.pb.h"
#include "server/attach_secret.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

namespace internal = gcmoe::internal::v1;

constexpr int kRanks = 2;

// A rank on this host that answers Setup with Ready (declining the I/O region, so steps come on
// the stream), each DeviceRegion with RegionOpened (refusing while refuse_opens is set), and
// each Step with a zero output of the right shape, and records what it was sent.
class ScriptedRank {
 public:
  struct Options {
    bool refuse_opens = false;
    std::set<uint64_t> cannot_reopen;  // Setup's regions it reports as unopened
    // Sent with every step's result, for its Step.device_rows[value_error_range] when it has
    // that range.
    std::string value_error;
    uint32_t value_error_range = 0;
    // A NaN in its (inline) output at this shard row and column; -1: none.
    int nan_row = -1;
    int nan_col = 0;
  };

  ScriptedRank(const std::string& rank_address, int rank, const AttachSecret& secret,
               const std::string& digest, int hidden, Options options)
      : hidden_(hidden), options_(std::move(options)) {
    stub_ = internal::RankControl::NewStub(
        grpc::CreateChannel(rank_address, grpc::InsecureChannelCredentials()));
    thread_ = std::thread([this, rank, secret, digest] { Run(rank, secret, digest); });
  }
  ~ScriptedRank() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_.store(true);
      if (context_ != nullptr) context_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }
  std::vector<internal::DeviceRegion> opened() {
    std::lock_guard<std::mutex> lock(mu_);
    return opened_;
  }
  std::vector<uint64_t> closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  std::vector<uint64_t> setup_regions() {
    std::lock_guard<std::mutex> lock(mu_);
    return setup_regions_;
  }
  std::vector<internal::Step> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  void set_value_error(const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    options_.value_error = error;
  }

 private:
  void Run(int rank, const AttachSecret& secret, const std::string& digest) {
    // A rank whose predecessor the coordinator has not let go yet is refused for now.
    while (!Attach(rank, secret, digest) && !stopped_.load()) {
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  // One attach; false when the coordinator refused it for now.
  bool Attach(int rank, const AttachSecret& secret, const std::string& digest) {
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_.load()) return true;
      context_ = &context;
    }
    const bool attached = Serve(&context, rank, secret, digest);
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
    return attached;
  }

  bool Serve(grpc::ClientContext* context, int rank, const AttachSecret& secret,
             const std::string& digest) {
    auto stream = stub_->Attach(context);
    internal::CoordinatorMessage message;
    if (!stream->Read(&message) || !message.has_challenge()) return true;
    internal::Hello hello;
    hello.set_rank(rank);
    hello.set_world_size(kRanks);
    hello.set_config_digest(digest);
    hello.set_pid(getpid());
    hello.set_incarnation(1000 + rank);
    // A CUDA rank's transport name (engine/cuda_ipc.h); nobody maps it in this test.
    hello.set_transport_name("cuda-ipc:" + std::to_string(getpid()) + ":0:7f0000000000:4096:none");
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    hello.set_host(host);  // this host: GPU memory is served only there
    hello.set_attach_proof(secret.Proof(message.challenge().nonce(), hello));
    internal::RankMessage first;
    *first.mutable_hello() = hello;
    if (!stream->Write(first)) return true;
    while (stream->Read(&message)) {
      if (message.has_reject()) {
        stream->Finish();
        return !message.reject().retryable();
      }
      internal::RankMessage reply;
      std::lock_guard<std::mutex> lock(mu_);
      if (message.has_setup()) {
        internal::Ready* ready = reply.mutable_ready();
        ready->set_epoch(message.setup().epoch());
        ready->set_io_error("this test's rank takes its tensors inline");
        for (const internal::DeviceRegion& region : message.setup().device_regions()) {
          setup_regions_.push_back(region.id());
          if (options_.cannot_reopen.count(region.id()) > 0) {
            internal::RegionOpened* lost = ready->add_unopened_regions();
            lost->set_id(region.id());
            lost->set_code(static_cast<int>(StatusCode::kInvalidArgument));
            lost->set_error("cuda_ipc.ipc_handle: does not open (its exporter has exited)");
          }
        }
      } else if (message.has_open_region()) {
        opened_.push_back(message.open_region());
        internal::RegionOpened* opened = reply.mutable_region_opened();
        opened->set_id(message.open_region().id());
        if (options_.refuse_opens) {
          opened->set_code(static_cast<int>(StatusCode::kInvalidArgument));
          opened->set_error("cuda_ipc.device_id: 0, but the allocation is on device 1");
        }
      } else if (message.has_close_region()) {
        closed_.push_back(message.close_region().id());
        continue;
      } else if (message.has_step()) {
        const internal::Step& step = message.step();
        steps_.push_back(step);
        internal::StepResult* result = reply.mutable_step_result();
        result->set_generation(step.generation());
        const int rows = static_cast<int>(step.tokens_per_rank(rank));
        const bool fp32 = step.output_dtype() == gcmoe::v1::FP32;
        gcmoe::v1::Tensor* out = result->mutable_output();
        out->set_dtype(fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
        out->add_shape(rows);
        out->add_shape(hidden_);
        int device_output_rows = 0;
        for (const internal::DeviceRows& d : step.device_rows()) {
          if (d.output().region() != 0) device_output_rows += static_cast<int>(d.rows());
        }
        if (device_output_rows < rows) {
          std::string data(static_cast<size_t>(rows) * hidden_ * (fp32 ? 4 : 2), '\0');
          if (options_.nan_row >= 0 && options_.nan_row < rows) {
            const size_t at = (static_cast<size_t>(options_.nan_row) * hidden_ + options_.nan_col);
            const uint32_t nan = 0x7FC00000u;  // FP32 quiet NaN; its high half is BF16's
            if (fp32) {
              std::memcpy(&data[4 * at], &nan, 4);
            } else {
              const uint16_t high = static_cast<uint16_t>(nan >> 16);
              std::memcpy(&data[2 * at], &high, 2);
            }
          }
          out->set_data(std::move(data));
        }
        for (int r = 0; r < kRanks; ++r) {
          result->add_load_before(0);
          result->add_load_after(0);
        }
        if (!options_.value_error.empty() &&
            options_.value_error_range < static_cast<uint32_t>(step.device_rows_size())) {
          internal::ValueError* error = result->add_value_errors();
          error->set_range(options_.value_error_range);
          error->set_message(options_.value_error);
        }
      } else {
        continue;
      }
      if (!stream->Write(reply)) break;
    }
    stream->Finish();
    return true;
  }

  const int hidden_;
  std::unique_ptr<internal::RankControl::Stub> stub_;
  grpc::ClientContext* context_ = nullptr;  // the attach in progress, under mu_
  std::atomic<bool> stopped_{false};
  std::thread thread_;
  std::mutex mu_;
  Options options_;
  std::vector<internal::DeviceRegion> opened_;
  std::vector<uint64_t> closed_;
  std::vector<uint64_t> setup_regions_;
  std::vector<internal::Step> steps_;
};

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

grpc::Status RegisterGpu(const std::string& address, const std::string& name,
                         const std::string& handle, uint64_t offset, uint64_t bytes,
                         gcmoe::v1::RegisterMemoryResponse* response) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  gcmoe::v1::RegisterMemoryRequest request;
  request.set_name(name);
  request.mutable_cuda_ipc()->set_ipc_handle(handle);
  request.mutable_cuda_ipc()->set_device_id(0);
  request.mutable_cuda_ipc()->set_offset(offset);
  request.mutable_cuda_ipc()->set_byte_size(bytes);
  return stub->RegisterMemory(&context, request, response);
}

grpc::Status Forward(const std::string& address, const gcmoe::v1::ForwardRequest& request,
                     gcmoe::v1::ForwardResponse* response) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub->Forward(&context, request, response);
}

constexpr uint64_t kInline = ~0ull;

// `request` with hidden at `hidden_at` and the output at `output_at` of registration `name`
// (kInline: that one stays in the messages).
gcmoe::v1::ForwardRequest OnGpu(gcmoe::v1::ForwardRequest request, const std::string& name,
                                uint64_t hidden_at, uint64_t output_at) {
  const uint64_t size = request.hidden().data().size();
  if (hidden_at != kInline) {
    request.mutable_hidden()->clear_data();
    request.mutable_hidden()->mutable_region()->set_region(name);
    request.mutable_hidden()->mutable_region()->set_offset(hidden_at);
    request.mutable_hidden()->mutable_region()->set_byte_size(size);
  }
  if (output_at == kInline) return request;
  request.mutable_output_region()->set_region(name);
  request.mutable_output_region()->set_offset(output_at);
  request.mutable_output_region()->set_byte_size(size);  // BF16 in, BF16 out
  return request;
}

// Stops `rank` and waits until the coordinator has seen it go, then attaches its successor.
void Restart(std::unique_ptr<ScriptedRank>* rank, const SeparateProcesses& service,
             const std::function<std::unique_ptr<ScriptedRank>()>& successor) {
  rank->reset();
  ASSERT_TRUE(WaitForHealth(service.address(), "NOT_SERVING", milliseconds(10000)));
  *rank = successor();
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000)));
}

// Waits until `done` holds (the ranks' messages arrive on their own threads).
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 500 && !done(); ++i) std::this_thread::sleep_for(milliseconds(10));
  return done();
}

// A `gcmoe coordinator` configured for the cuda backend with registered memory allowed (plus
// `extra` flags), no rank processes, and what a scripted rank needs to attach to it.
struct CudaCoordinator {
  CudaCoordinator(const std::string& name, std::vector<std::string> extra)
      : service(
            name,
            [&] {
              std::vector<std::string> flags = {"--set", "engine.backend=cuda", "--set",
                                                "server.allow_registered_memory=true"};
              flags.insert(flags.end(), extra.begin(), extra.end());
              return flags;
            }(),
            /*ranks=*/0),
        secret(AttachSecret::FromBytes(ReadLine(service.secret_file()))) {
    config::Config config = config::DefaultConfig();
    config.engine.backend = "cuda";
    digest = config.Digest();
  }
  std::unique_ptr<ScriptedRank> Rank(int r, ScriptedRank::Options options) {
    return std::make_unique<ScriptedRank>(service.rank_address(), r, secret, digest,
                                          DefaultModel().hidden, std::move(options));
  }

  SeparateProcesses service;
  AttachSecret secret;
  std::string digest;
};

TEST(DeviceRegionProtocolTest, RanksOpenCloseAndReopenWhatTheCoordinatorRegisters) {
  CudaCoordinator coordinator("device-regions", {});
  SeparateProcesses& service = coordinator.service;
  const engine::ModelSpec model = DefaultModel();
  const int H = model.hidden;
  auto rank0 = coordinator.Rank(0, {});
  auto rank1 = coordinator.Rank(1, {});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  const std::string handle(64, '\x11');
  const std::string address = service.address();

  // Registered once every rank has opened it, with what the client sent.
  gcmoe::v1::RegisterMemoryResponse registered;
  ASSERT_TRUE(RegisterGpu(address, "gpu", handle, 4096, 1 << 20, &registered).ok())
      << service.Logs();
  EXPECT_EQ(registered.byte_size(), uint64_t{1} << 20);
  for (ScriptedRank* rank : {rank0.get(), rank1.get()}) {
    ASSERT_EQ(rank->opened().size(), 1u);
    const internal::DeviceRegion region = rank->opened()[0];
    EXPECT_EQ(region.ipc_handle(), handle);
    EXPECT_EQ(region.offset(), 4096u);
    EXPECT_EQ(region.byte_size(), uint64_t{1} << 20);
  }
  const uint64_t id = rank0->opened()[0].id();
  EXPECT_EQ(rank1->opened()[0].id(), id);

  // A call's activations and output there: each rank gets its rows as a range of the
  // registration, in no message bytes, and the response carries no output bytes.
  RequestSpec rs;
  rs.num_tokens = 7;  // shards of 4 and 3 rows
  rs.dtype = gcmoe::v1::BF16;
  rs.output_dtype = gcmoe::v1::BF16;
  const gcmoe::v1::ForwardRequest request = OnGpu(MakeForwardRequest(model, rs), "gpu", 256, 65536);
  gcmoe::v1::ForwardResponse response;
  const grpc::Status status = Forward(address, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << service.Logs();
  EXPECT_TRUE(response.output().data().empty());
  EXPECT_EQ(response.output().shape(0), 7);
  const uint64_t row = static_cast<uint64_t>(H) * 2;
  const uint64_t first_rows[kRanks] = {0, 4};
  const uint64_t rows[kRanks] = {4, 3};
  for (int r = 0; r < kRanks; ++r) {
    ScriptedRank* rank = r == 0 ? rank0.get() : rank1.get();
    ASSERT_EQ(rank->steps().size(), 1u);
    const internal::Step step = rank->steps()[0];
    EXPECT_TRUE(step.hidden().data().empty());
    ASSERT_EQ(step.device_rows_size(), 1);
    const internal::DeviceRows& d = step.device_rows(0);
    EXPECT_EQ(d.shard_row(), 0u);
    EXPECT_EQ(d.rows(), rows[r]);
    EXPECT_EQ(d.call_row(), first_rows[r]);
    EXPECT_EQ(d.hidden().region(), id);
    EXPECT_EQ(d.hidden().offset(), 256 + first_rows[r] * row);
    EXPECT_EQ(d.hidden().byte_size(), rows[r] * row);
    EXPECT_EQ(d.output().region(), id);
    EXPECT_EQ(d.output().offset(), 65536 + first_rows[r] * row);
    EXPECT_EQ(d.output().byte_size(), rows[r] * row);
    EXPECT_EQ(step.topk_ids().data().size(), rows[r] * model.top_k * 4);  // routing inline
  }

  // A value a rank found bad on the GPU fails the call with its words; the next call runs.
  rank1->set_value_error("hidden: element [5, 17] is NaN, expected finite activations");
  EXPECT_STATUS(Forward(address, request, &response), grpc::StatusCode::INVALID_ARGUMENT,
                "hidden: element [5, 17] is NaN");
  rank1->set_value_error("");
  EXPECT_TRUE(Forward(address, request, &response).ok());

  // One rank refuses: RegisterMemory gets its error, and the rank that opened it closes it.
  auto rank_with = [&](ScriptedRank::Options options) {
    return [&, options] { return coordinator.Rank(1, options); };
  };
  ASSERT_NO_FATAL_FAILURE(
      Restart(&rank1, service, rank_with(ScriptedRank::Options{.refuse_opens = true})))
      << service.Logs();
  EXPECT_EQ(rank1->setup_regions(), std::vector<uint64_t>{id}) << "a new rank gets the live ones";
  EXPECT_STATUS(RegisterGpu(address, "refused", handle, 0, 4096, &registered),
                grpc::StatusCode::INVALID_ARGUMENT, "cuda_ipc.device_id: 0, but the allocation");
  ASSERT_EQ(rank0->opened().size(), 2u);
  const uint64_t refused = rank0->opened()[1].id();
  EXPECT_TRUE(Eventually([&] {
    const auto closed = rank0->closed();
    return std::find(closed.begin(), closed.end(), refused) != closed.end();
  }));
  {
    gcmoe::v1::ForwardResponse r;
    EXPECT_STATUS(Forward(address, OnGpu(MakeForwardRequest(model, rs), "refused", 0, 8192), &r),
                  grpc::StatusCode::NOT_FOUND, "\"refused\" is not a registered region");
  }

  // Unregistered: every rank closes it.
  ASSERT_TRUE(Unregister(address, "gpu").ok());
  EXPECT_TRUE(Eventually([&] {
    const auto c0 = rank0->closed();
    const auto c1 = rank1->closed();
    return std::find(c0.begin(), c0.end(), id) != c0.end() &&
           std::find(c1.begin(), c1.end(), id) != c1.end();
  })) << service.Logs();

  // A restarted rank that cannot open a registration again: calls naming it are refused, the
  // service serves the rest, and the name can still be unregistered.
  ASSERT_NO_FATAL_FAILURE(Restart(&rank1, service, rank_with(ScriptedRank::Options{})))
      << service.Logs();
  ASSERT_TRUE(RegisterGpu(address, "gpu2", handle, 0, 1 << 20, &registered).ok());
  const uint64_t id2 = rank1->opened().back().id();
  ASSERT_NO_FATAL_FAILURE(
      Restart(&rank1, service, rank_with(ScriptedRank::Options{.cannot_reopen = {id2}})))
      << service.Logs();
  EXPECT_EQ(rank1->setup_regions(), std::vector<uint64_t>{id2});
  EXPECT_STATUS(Forward(address, OnGpu(MakeForwardRequest(model, rs), "gpu2", 0, 65536), &response),
                grpc::StatusCode::FAILED_PRECONDITION, "no longer open on every rank (rank 1");
  EXPECT_TRUE(Forward(address, MakeForwardRequest(model, rs), &response).ok());
  EXPECT_TRUE(Unregister(address, "gpu2").ok());
}

// Calls with GPU memory merge with each other and with inline calls: each rank gets one range
// per piece of such a call, in row order, with the rows inline calls send; each caller gets its
// own answer, and a value a rank refuses fails only the call whose range it names.
TEST(DeviceRegionProtocolTest, CallsWithGpuMemoryShareAStepAndFailAlone) {
  // A step waits (up to 1 s) until three calls are pending, so the three calls below share one.
  CudaCoordinator coordinator("device-regions-merged", {"--set", "server.batch_window_us=1000000",
                                                        "--set", "server.max_batch_calls=3"});
  SeparateProcesses& service = coordinator.service;
  const engine::ModelSpec model = DefaultModel();
  const int H = model.hidden;
  auto rank0 = coordinator.Rank(0, {});
  auto rank1 = coordinator.Rank(
      1, {.value_error = "hidden: element [2, 5] is NaN, expected finite activations"});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  const std::string address = service.address();
  gcmoe::v1::RegisterMemoryResponse registered;
  ASSERT_TRUE(RegisterGpu(address, "gpu", std::string(64, '\x22'), 0, 1 << 20, &registered).ok())
      << service.Logs();
  const uint64_t id = rank0->opened().at(0).id();

  // A: 7 rows, activations and output on the GPU; B: 5 rows inline; C: 4 rows, activations on
  // the GPU, output inline. 16 rows in shards of 8: rank 0 has A[0, 7) and B[0, 1), rank 1
  // B[1, 5) and C[0, 4).
  const uint64_t row = static_cast<uint64_t>(H) * 2;
  auto spec = [](int tokens) {
    RequestSpec rs;
    rs.num_tokens = tokens;
    rs.dtype = gcmoe::v1::BF16;
    rs.output_dtype = gcmoe::v1::BF16;
    return rs;
  };
  const gcmoe::v1::ForwardRequest requests[3] = {
      OnGpu(MakeForwardRequest(model, spec(7)), "gpu", 0, 65536),
      MakeForwardRequest(model, spec(5)),
      OnGpu(MakeForwardRequest(model, spec(4)), "gpu", 131072, kInline)};
  gcmoe::v1::ForwardResponse responses[3];
  grpc::Status statuses[3];
  ForwardInOrder(address, 3, requests, responses, statuses, milliseconds(100));

  ASSERT_EQ(rank0->steps().size(), 1u) << service.Logs();
  ASSERT_EQ(rank1->steps().size(), 1u);
  const internal::Step s0 = rank0->steps()[0];
  const internal::Step s1 = rank1->steps()[0];
  // Inline rows travel as before; GPU rows' activations travel in the messages' padding only.
  EXPECT_EQ(s0.hidden().data().size(), 8 * row);
  EXPECT_EQ(s1.hidden().data().size(), 8 * row);
  EXPECT_EQ(s0.hidden().data().substr(7 * row), requests[1].hidden().data().substr(0, row));
  EXPECT_EQ(s1.hidden().data().substr(0, 4 * row), requests[1].hidden().data().substr(row));
  ASSERT_EQ(s0.device_rows_size(), 1);
  const internal::DeviceRows& a = s0.device_rows(0);
  EXPECT_EQ(a.shard_row(), 0u);
  EXPECT_EQ(a.rows(), 7u);
  EXPECT_EQ(a.call_row(), 0u);
  EXPECT_EQ(a.hidden().region(), id);
  EXPECT_EQ(a.hidden().offset(), 0u);
  EXPECT_EQ(a.hidden().byte_size(), 7 * row);
  EXPECT_EQ(a.output().region(), id);
  EXPECT_EQ(a.output().offset(), 65536u);
  EXPECT_EQ(a.output().byte_size(), 7 * row);
  ASSERT_EQ(s1.device_rows_size(), 1);
  const internal::DeviceRows& c = s1.device_rows(0);
  EXPECT_EQ(c.shard_row(), 4u);
  EXPECT_EQ(c.rows(), 4u);
  EXPECT_EQ(c.call_row(), 0u);
  EXPECT_EQ(c.hidden().region(), id);
  EXPECT_EQ(c.hidden().offset(), 131072u);
  EXPECT_EQ(c.hidden().byte_size(), 4 * row);
  EXPECT_EQ(c.output().region(), 0u);

  // Rank 1 refused a value of C's range: C fails with its words, A and B are answered.
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].error_message();
  EXPECT_TRUE(responses[0].output().data().empty());
  EXPECT_EQ(responses[0].stats().batched_calls(), 3u);
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].error_message();
  EXPECT_EQ(responses[1].output().data(), std::string(5 * row, '\0'));
  EXPECT_EQ(responses[1].stats().batched_calls(), 3u);
  EXPECT_STATUS(statuses[2], grpc::StatusCode::INVALID_ARGUMENT, "hidden: element [2, 5] is NaN");
}

// The coordinator checks every output it assembles: a rank's NaN fails the one call whose rows
// hold it, with its element named in the call's rows, and the calls merged with it are answered
// with their bytes. The outputs are large enough (over 256 KiB) that the copies and checks are
// split over server.copy_threads.
TEST(DeviceRegionProtocolTest, AssembledOutputsAreCheckedPerCall) {
  CudaCoordinator coordinator("assembled-outputs",
                              {"--set", "server.batch_window_us=1000000", "--set",
                               "server.max_batch_calls=2", "--set", "server.copy_threads=4"});
  SeparateProcesses& service = coordinator.service;
  const engine::ModelSpec model = DefaultModel();
  const int H = model.hidden;
  // 700 + 600 rows in shards of 650: rank 1's shard row 100 is call B's row 50.
  auto rank0 = coordinator.Rank(0, {});
  auto rank1 = coordinator.Rank(1, {.nan_row = 100, .nan_col = 17});
  ASSERT_TRUE(WaitForHealth(service.address(), "SERVING", milliseconds(30000))) << service.Logs();
  const std::string address = service.address();
  for (const gcmoe::v1::DType out : {gcmoe::v1::BF16, gcmoe::v1::FP32}) {
    SCOPED_TRACE(out == gcmoe::v1::BF16 ? "BF16 output" : "FP32 output");
    const size_t row = static_cast<size_t>(H) * (out == gcmoe::v1::FP32 ? 4 : 2);
    auto spec = [out](int tokens) {
      RequestSpec rs;
      rs.num_tokens = tokens;
      rs.dtype = gcmoe::v1::BF16;
      rs.output_dtype = out;
      return rs;
    };
    const gcmoe::v1::ForwardRequest requests[2] = {MakeForwardRequest(model, spec(700)),
                                                   MakeForwardRequest(model, spec(600))};
    gcmoe::v1::ForwardResponse responses[2];
    grpc::Status statuses[2];
    ForwardInOrder(address, 2, requests, responses, statuses, milliseconds(100));
    ASSERT_TRUE(statuses[0].ok()) << statuses[0].error_message() << "\n" << service.Logs();
    EXPECT_EQ(responses[0].stats().batched_calls(), 2u);
    EXPECT_EQ(responses[0].output().data().size(), 700 * row);
    EXPECT_EQ(responses[0].output().data().find_first_not_of('\0'), std::string::npos);
    EXPECT_STATUS(statuses[1], grpc::StatusCode::INVALID_ARGUMENT,
                  "output: element [50, 17] is NaN: the layer overflowed FP32");
    EXPECT_TRUE(responses[1].output().data().empty());
  }
  // Alone, the call holding the NaN fails, and the service goes on serving.
  RequestSpec rs;
  rs.num_tokens = 1300;
  rs.dtype = gcmoe::v1::BF16;
  rs.output_dtype = gcmoe::v1::BF16;
  gcmoe::v1::ForwardResponse response;
  EXPECT_STATUS(Forward(address, MakeForwardRequest(model, rs), &response),
                grpc::StatusCode::INVALID_ARGUMENT, "output: element [750, 17] is NaN");
  rs.num_tokens = 100;  // rank 1's shard has 50 rows: no NaN
  ASSERT_TRUE(Forward(address, MakeForwardRequest(model, rs), &response).ok()) << service.Logs();
  EXPECT_EQ(response.output().data(), std::string(100 * static_cast<size_t>(H) * 2, '\0'));
}

}  // namespace
}  // namespace gcmoe::server::testing
