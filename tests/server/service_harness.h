// Real gcmoe processes on loopback for the integration tests: start, signal, wait, read logs;
// plus small clients for health and Forward.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "engine/model_spec.h"
#include "gcmoe/v1/moe.grpc.pb.h"

namespace gcmoe::server::testing {

// A gRPC status with the code and a message containing the text.
#define EXPECT_STATUS(status, want_code, want_text)                                         \
  do {                                                                                      \
    const grpc::Status s_ = (status);                                                       \
    EXPECT_EQ(s_.error_code(), want_code) << s_.error_message();                            \
    EXPECT_NE(s_.error_message().find(want_text), std::string::npos) << s_.error_message(); \
  } while (0)

using std::chrono::milliseconds;

// The gcmoe binary under test (set at build time).
std::string GcmoeBinary();
// A path in the test's temp directory unique to this process.
std::string TempPath(const std::string& name);

class Process {
 public:
  // Runs `gcmoe args...` with stdout and stderr appended to `log_path`.
  static std::unique_ptr<Process> Start(const std::vector<std::string>& args,
                                        const std::string& log_path);
  ~Process();  // SIGKILL and reap if still running

  pid_t pid() const { return pid_; }
  void Signal(int signo) const;
  // Exit status as from waitpid (use WIFEXITED etc.), or nullopt if still running at timeout.
  std::optional<int> Wait(milliseconds timeout);
  bool running();
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  bool reaped_ = false;
};

// Waits for a file to appear with content; returns its lines.
std::optional<std::vector<std::string>> WaitForFile(const std::string& path, milliseconds timeout);

// The decimal number right after the first `prefix` in `text` (a value read from a log line,
// e.g. "started rank 1 (pid "); nullopt when the prefix is absent or no digit follows it.
std::optional<long> NumberAfter(const std::string& text, const std::string& prefix);

// "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", or "UNREACHABLE". `credentials` null: plaintext.
std::string HealthStatus(const std::string& address, const std::string& service = "",
                         std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
bool WaitForHealth(const std::string& address, const std::string& want, milliseconds timeout,
                   std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

std::unique_ptr<gcmoe::v1::MoeService::Stub> Connect(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
// Connect, and wait until the channel is connected (at most 10 s), so that a call made on it
// goes out at once: for tests whose calls must arrive in the order they are made.
std::unique_ptr<gcmoe::v1::MoeService::Stub> ConnectNow(const std::string& address);
// Sends n Forward calls at once, each from its own thread on a channel connected beforehand,
// `spacing` apart, so that they arrive in order (their rows' order in a merged step); returns
// when all are answered (deadline 60 s each).
void ForwardInOrder(const std::string& address, int n, const gcmoe::v1::ForwardRequest* requests,
                    gcmoe::v1::ForwardResponse* responses, grpc::Status* statuses,
                    milliseconds spacing);

// MoeService.UnregisterMemory of `name`, with `token` as bearer token unless empty.
grpc::Status Unregister(const std::string& address, const std::string& name,
                        const std::string& token = "");

// A `gcmoe serve` with the embedded default model plus overrides, waited until SERVING (asked
// over `credentials` when the overrides put the public port on TLS).
struct Service {
  std::unique_ptr<Process> process;
  std::string address;
  std::string log_path;
};
std::optional<Service> StartServe(const std::vector<std::string>& extra_args,
                                  const std::string& name, milliseconds timeout,
                                  std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// A fresh attach secret in a 0600 file of the test's temp directory (server.rank_secret_file).
std::string WriteSecretFile(const std::string& name);

// A coordinator and its ranks started separately, as systemd or Kubernetes would, sharing an
// attach secret; `extra` goes to every process.
class SeparateProcesses {
 public:
  explicit SeparateProcesses(const std::string& name, std::vector<std::string> extra = {},
                             int ranks = 2);

  void StartRank(int r);
  const std::string& address() const { return address_; }
  const std::string& rank_address() const { return rank_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& secret_file() const { return secret_file_; }
  Process& rank(int r) { return *ranks_[r]; }
  Process& coordinator() { return *coordinator_; }
  std::string Logs();

 private:
  std::string name_;
  std::vector<std::string> extra_;
  std::string secret_file_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> ranks_;
  std::string address_;
  std::string rank_address_;
  std::string metrics_address_;
};

// Random unit-scale activations, distinct experts per token (a slot in `unused_every` is -1).
struct RequestSpec {
  int num_tokens = 8;
  int layer = 0;
  gcmoe::v1::DType dtype = gcmoe::v1::FP32;
  gcmoe::v1::DType output_dtype = gcmoe::v1::FP32;
  int unused_every = 0;  // 0: every slot used
  int hot_expert = -1;   // >= 0: every token's first slot
  uint64_t seed = 1;
};
gcmoe::v1::ForwardRequest MakeForwardRequest(const engine::ModelSpec& spec,
                                             const RequestSpec& request);

// The data-path tests' mix for the default model: 15 requests of 1-29 tokens, every input
// dtype, both output dtypes, both layers, some slots unused; seeds from `seed`, ids
// `id_prefix` + index.
std::vector<gcmoe::v1::ForwardRequest> DataPathRequests(uint64_t seed,
                                                        const std::string& id_prefix);

// `gcmoe serve` arguments for two ranks with one engine thread each, then `more`.
std::vector<std::string> TwoRanksWith(const std::vector<std::string>& more);

// The service's activations as floats (what it sees after decoding the request's dtype).
std::vector<float> HiddenAsFloats(const gcmoe::v1::ForwardRequest& request);
std::vector<double> OutputAsDoubles(const gcmoe::v1::ForwardResponse& response);

// The embedded default config's model (tiny-cpu.json).
engine::ModelSpec DefaultModel();

}  // namespace gcmoe::server::testing
