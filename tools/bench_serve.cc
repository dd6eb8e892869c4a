// `gcmoe bench serve`: starts `gcmoe serve` (or attaches to one) and, per token count and number
// of concurrent callers, measures the transport floor (Echo: the same request and response bytes,
// nothing computed), Forward at the client, the engine's time inside the service, and where the
// rest of each call went, stage by stage, from the ForwardStats of every response.
#include "tools/bench_serve.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/channel.h"
#include "client/requests.h"
#include "client/tensors.h"
#include "common/flags.h"
#include "gcmoe/v1/moe.grpc.pb.h"
#include "tools/bench_registered_buffers.h"
#include "tools/bench_util.h"

namespace gcmoe::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kSummary =
    "Measures what the service adds to its engine. Starts `gcmoe serve --config FILE` with\n"
    "server.echo on (or uses the service at --addr, which must run with server.echo on for the\n"
    "transport floor), and for each token count per rank T and number of concurrent callers C:\n"
    "  echo      Echo calls with the same request and response bytes as Forward: the gRPC floor\n"
    "  forward   Forward calls (unary; `stream` rows: one ForwardStream per caller;\n"
    "            `registered` rows: unary calls whose tensors and output are in registered\n"
    "            shared memory; `gpu` rows: whose activations and output are in this process's\n"
    "            GPU memory registered as cuda_ipc, the routing inline (cuda backend only);\n"
    "            both need server.allow_registered_memory, set when it starts the service)\n"
    "  engine    the slowest rank's engine time inside the service (ForwardStats.engine_ns)\n"
    "  overhead  (forward p50 - echo p50 - engine p50) / (echo p50 + engine p50)\n"
    "and the p50 of every stage of ForwardStats: validation, queueing, coordinator to rank, the\n"
    "rank's host work, host-to-device, device, device-to-host, rank to coordinator, response\n"
    "assembly. T counts tokens per rank: a call carries T x parallel.ranks tokens.\n"
    "--json FILE writes one object per (T, C, mode). A row some of whose calls failed is printed\n"
    "from the calls that succeeded, marked, with its first error on stderr, and the benchmark\n"
    "exits 1 when every row is done: its numbers are not the service's.";

struct Options {
  std::string config;
  std::vector<std::string> overrides;
  std::string addr;
  std::string tokens = "1,4,16,64,256";
  std::string concurrency = "1";
  int connections = 1;
  std::string modes = "unary";
  std::string dtype = "bf16";
  int requests = 200;
  int warmup = 20;
  int timeout_ms = 30000;
  std::string json;
};

// One call's view: its latency and, for Forward, the server's stages.
struct Sample {
  double us = 0.0;
  v1::ForwardStats stats;
};

struct Run {
  std::vector<Sample> samples;
  double wall_s = 0.0;
  int errors = 0;
  std::string first_error;
};

double P(std::vector<double> v, double q) {
  std::vector<float> f(v.begin(), v.end());
  return Percentile(std::move(f), q);
}

// `calls` calls over `concurrency` workers; `call(worker, sample)` does one and says whether it
// succeeded (its error in *error otherwise).
template <typename CallFn>
Run RunCalls(int concurrency, int calls, CallFn call) {
  Run run;
  std::mutex mu;
  std::atomic<int> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w) {
    workers.emplace_back([&, w] {
      std::vector<Sample> mine;
      int errors = 0;
      std::string first_error;
      while (next.fetch_add(1) < calls) {
        Sample s;
        std::string error;
        const auto t0 = Clock::now();
        const bool ok = call(w, &s, &error);
        s.us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (ok) {
          mine.push_back(std::move(s));
        } else if (errors++ == 0) {
          first_error = error;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      run.samples.insert(run.samples.end(), std::make_move_iterator(mine.begin()),
                         std::make_move_iterator(mine.end()));
      run.errors += errors;
      if (run.first_error.empty()) run.first_error = first_error;
    });
  }
  for (auto& t : workers) t.join();
  run.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

// The service this benchmark started: a `gcmoe serve` child, stopped with SIGTERM.
class ServeChild {
 public:
  ~ServeChild() { Stop(); }

  Result<std::string> Start(const Options& o) {
    char dir_template[] = "/tmp/gcmoe-bench-serve-XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (dir == nullptr) return Unavailable("mkdtemp failed");
    dir_ = dir;
    const std::string address_file = dir_ + "/address";
    std::vector<std::string> args = {"gcmoe",          "serve",
                                     "--address-file", address_file,
                                     "--set",          "server.echo=true",
                                     "--set",          "server.listen=127.0.0.1:0",
                                     "--set",          "server.metrics_listen=127.0.0.1:0"};
    if (o.modes.find("registered") != std::string::npos ||
        o.modes.find("gpu") != std::string::npos) {
      args.insert(args.end(), {"--set", "server.allow_registered_memory=true"});
    }
    if (!o.config.empty()) args.insert(args.end(), {"--config", o.config});
    for (const std::string& s : o.overrides) args.insert(args.end(), {"--set", s});
    pid_ = fork();
    if (pid_ < 0) return Unavailable("fork failed");
    if (pid_ == 0) {
      std::vector<char*> c_args;
      for (std::string& a : args) c_args.push_back(a.data());
      c_args.push_back(nullptr);
      execv("/proc/self/exe", c_args.data());
      std::perror("gcmoe bench serve: exec");
      _exit(127);
    }
    // The address file appears once the service is serving.
    const auto deadline = Clock::now() + std::chrono::minutes(10);
    while (Clock::now() < deadline) {
      std::ifstream in(address_file);
      std::string address;
      if (in && std::getline(in, address) && !address.empty()) return address;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Unavailable("gcmoe serve exited before serving (its log is above)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return DeadlineExceeded("gcmoe serve did not start serving within 10 minutes");
  }

  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
      dir_.clear();
    }
  }

 private:
  pid_t pid_ = -1;
  std::string dir_;
};

struct Row {
  int tokens_per_rank = 0;
  int tokens = 0;
  int concurrency = 0;
  std::string mode;
  double echo_p50 = NAN;
  double forward_p50 = 0, forward_p99 = 0, engine_p50 = 0, overhead_pct = NAN;
  double tokens_per_s = 0, batched_mean = 0;
  bool shared_memory_io = false;
  int errors = 0;
  std::map<std::string, double> stages;  // p50 µs
};

// The stages in the order a call meets them.
const std::vector<std::pair<std::string, int64_t (v1::ForwardStats::*)() const>>& Stages() {
  static const std::vector<std::pair<std::string, int64_t (v1::ForwardStats::*)() const>> s = {
      {"validate", &v1::ForwardStats::validate_ns},
      {"queue", &v1::ForwardStats::queue_ns},
      {"to_ranks", &v1::ForwardStats::to_ranks_ns},
      {"host", &v1::ForwardStats::host_ns},
      {"h2d", &v1::ForwardStats::h2d_ns},
      {"device", &v1::ForwardStats::device_ns},
      {"d2h", &v1::ForwardStats::d2h_ns},
      {"from_ranks", &v1::ForwardStats::from_ranks_ns},
      {"assemble", &v1::ForwardStats::assemble_ns},
      {"total", &v1::ForwardStats::total_ns}};
  return s;
}

// JSON has no NaN: a value not measured is null.
nlohmann::ordered_json NumberOrNull(double v) {
  return std::isnan(v) ? nlohmann::ordered_json() : nlohmann::ordered_json(v);
}

bool ParseList(const std::string& flag, const std::string& text, std::vector<int>* out) {
  Result<std::vector<int>> list = ParseTokenList(text);
  if (!list.ok()) {
    std::fprintf(stderr, "gcmoe bench serve: --%s: %s\n", flag.c_str(),
                 list.status().message().c_str());
    return false;
  }
  *out = *list;
  return true;
}

}  // namespace

int RunBenchServe(int argc, char** argv) {
  Options o;
  Flags flags("gcmoe bench serve [--config FILE | --addr HOST:PORT]", kSummary);
  flags.String("config", &o.config, "config of the service to start (default: the embedded one)");
  flags.Repeated("set", &o.overrides, "override a config key of the started service");
  flags.String("addr", &o.addr, "measure the service at this address instead of starting one");
  flags.String("tokens-per-rank", &o.tokens, "token counts per rank, e.g. 1,4,16,64,256");
  flags.String("concurrency", &o.concurrency, "numbers of concurrent callers, e.g. 1,8,32");
  flags.Int("connections", &o.connections,
            "TCP connections the callers share, caller i on connection i % N (a connection's "
            "calls go through one HTTP/2 transport on each side)");
  flags.String("modes", &o.modes,
               "unary, stream (ForwardStream per caller), registered (tensors in registered "
               "shared memory), gpu (activations and output in registered GPU memory), or a "
               "comma-separated list");
  flags.String("dtype", &o.dtype, "hidden dtype: bf16, fp32 or fp8");
  flags.Int("requests", &o.requests, "calls measured per row (after the warm-up)");
  flags.Int("warmup", &o.warmup, "calls before measuring each row");
  flags.Int("timeout-ms", &o.timeout_ms, "deadline of each call");
  flags.String("json", &o.json, "write the rows to this JSON file");
  if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;
  std::vector<int> token_list, concurrency_list;
  if (!ParseList("tokens-per-rank", o.tokens, &token_list) ||
      !ParseList("concurrency", o.concurrency, &concurrency_list)) {
    return 2;
  }
  if (o.connections < 1 || o.connections > 256) {
    std::fprintf(stderr, "gcmoe bench serve: --connections: expected 1 to 256, got %d\n",
                 o.connections);
    return 2;
  }
  const bool unary = o.modes.find("unary") != std::string::npos;
  const bool stream = o.modes.find("stream") != std::string::npos;
  const bool registered = o.modes.find("registered") != std::string::npos;
  const bool gpu = o.modes.find("gpu") != std::string::npos;
  v1::DType dtype;
  if (!client::ParseDTypeName(o.dtype, &dtype) || (!unary && !stream && !registered && !gpu) ||
      o.requests < 1 || o.warmup < 0) {
    std::fprintf(stderr, "gcmoe bench serve: bad --dtype, --modes, --requests or --warmup\n");
    return 2;
  }

  ServeChild child;
  std::string addr = o.addr;
  if (addr.empty()) {
    std::fprintf(stderr, "gcmoe bench serve: starting gcmoe serve ...\n");
    Result<std::string> started = child.Start(o);
    if (!started.ok()) {
      std::fprintf(stderr, "gcmoe bench serve: %s\n", started.status().message().c_str());
      return 1;
    }
    addr = *started;
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::MoeService::Stub>> stubs;
  for (int i = 0; i < o.connections; ++i) {
    channels.push_back(
        client::MakeChannel(addr, client::kDefaultMaxMessageBytes, /*own_connection=*/true));
    stubs.push_back(v1::MoeService::NewStub(channels.back()));
  }
  const std::shared_ptr<grpc::Channel>& channel = channels.front();
  const std::unique_ptr<v1::MoeService::Stub>& stub = stubs.front();
  v1::ModelInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(client::DeadlineIn(o.timeout_ms));
    const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (!status.ok()) {
      std::fprintf(stderr, "gcmoe bench serve: %s\n",
                   client::DescribeFailure(addr, "GetModelInfo", channel.get(), status).c_str());
      return 1;
    }
  }
  const int ranks = static_cast<int>(info.ranks());
  std::printf(
      "# gcmoe bench serve: %s backend, %u rank(s), H %u, E %u, top-%u, %s hidden, "
      "%d calls per row\n",
      info.backend().c_str(), info.ranks(), info.hidden(), info.experts(), info.top_k(),
      o.dtype.c_str(), o.requests);
  std::printf(
      "# overhead = (forward p50 - echo p50 - engine p50) / (echo p50 + engine p50); "
      "stage columns: p50 us\n");
  std::printf("%5s %6s %4s %10s %9s %9s %9s %9s %8s %10s %5s", "T/rk", "T", "C", "mode", "echo50",
              "fwd50", "fwd99", "engine50", "ovh%", "tok/s", "batch");
  for (const auto& [name, field] : Stages()) std::printf(" %9s", name.c_str());
  std::printf("\n");

  std::vector<Row> rows;
  int failed_rows = 0;      // every call failed: no row
  int incomplete_rows = 0;  // some Forward or Echo calls failed: a row from the others
  for (int per_rank : token_list) {
    const int T = per_rank * ranks;
    if (T > static_cast<int>(info.max_tokens())) {
      std::fprintf(stderr,
                   "gcmoe bench serve: T/rank %d is over the service's capacity (%u "
                   "tokens per call); skipped\n",
                   per_rank, info.max_tokens());
      continue;
    }
    // A few distinct requests, cycled through.
    std::vector<v1::ForwardRequest> requests;
    for (int v = 0; v < 4; ++v) {
      client::RandomRequestOptions ro;
      ro.tokens = T;
      ro.hidden = static_cast<int>(info.hidden());
      ro.experts = static_cast<int>(info.experts());
      ro.top_k = static_cast<int>(info.top_k());
      ro.seed = 1000 + v;
      Result<v1::ForwardRequest> r = client::BuildForwardRequest(
          client::RandomRequest(ro), 0, dtype, v1::BF16, "bench-" + std::to_string(v));
      if (!r.ok()) {
        std::fprintf(stderr, "gcmoe bench serve: %s\n", r.status().message().c_str());
        return 1;
      }
      requests.push_back(std::move(*r));
    }
    for (int c : concurrency_list) {
      // Echo: the transport floor at the same concurrency.
      // Each worker reads into its own response, reused, in Echo and Forward alike: the
      // client's allocation of a T = 256 output costs as much as a stage, and must not differ.
      std::vector<v1::ForwardResponse> responses(static_cast<size_t>(c));
      auto echo = [&](int w, Sample*, std::string* error) {
        v1::ForwardResponse& response = responses[static_cast<size_t>(w)];
        grpc::ClientContext context;
        context.set_deadline(client::DeadlineIn(o.timeout_ms));
        response.Clear();
        const grpc::Status s =
            stubs[w % stubs.size()]->Echo(&context, requests[w % requests.size()], &response);
        if (!s.ok()) *error = client::GrpcCodeName(s.error_code()) + ": " + s.error_message();
        return s.ok();
      };
      RunCalls(c, o.warmup, echo);
      const Run echo_run = RunCalls(c, o.requests, echo);
      std::vector<double> echo_us;
      for (const Sample& s : echo_run.samples) echo_us.push_back(s.us);
      const bool have_echo = echo_run.errors == 0;
      if (!have_echo) {
        std::fprintf(stderr,
                     "gcmoe bench serve: T %d C %d: %d of %d Echo call(s) failed, first: %s; no "
                     "transport floor\n",
                     T, c, echo_run.errors, o.requests, echo_run.first_error.c_str());
      }

      for (const std::string mode : {"unary", "stream", "registered", "gpu"}) {
        if ((mode == "unary" && !unary) || (mode == "stream" && !stream) ||
            (mode == "registered" && !registered) || (mode == "gpu" && !gpu)) {
          continue;
        }
        // Each caller's requests with their tensors and output in registered memory.
        std::unique_ptr<RegisteredBuffers> buffers;
        if (mode == "registered" || mode == "gpu") {
          Result<std::unique_ptr<RegisteredBuffers>> made = RegisteredBuffers::Create(
              stub.get(), requests, c, static_cast<int64_t>(T) * info.hidden() * 2, o.timeout_ms,
              mode == "gpu" ? RegisteredBuffers::Memory::kGpu
                            : RegisteredBuffers::Memory::kPosixShm);
          if (!made.ok()) {
            std::fprintf(stderr, "gcmoe bench serve: T %d C %d %s: %s\n", T, c, mode.c_str(),
                         made.status().message().c_str());
            ++failed_rows;
            continue;
          }
          buffers = std::move(*made);
        }
        // Each worker's stream, opened before timing.
        struct Streamer {
          grpc::ClientContext context;
          std::unique_ptr<grpc::ClientReaderWriter<v1::ForwardRequest, v1::ForwardStreamResponse>>
              stream;
          v1::ForwardStreamResponse reply;
        };
        std::vector<std::unique_ptr<Streamer>> streams;
        if (mode == "stream") {
          for (int w = 0; w < c; ++w) {
            auto s = std::make_unique<Streamer>();
            s->stream = stubs[w % stubs.size()]->ForwardStream(&s->context);
            streams.push_back(std::move(s));
          }
        }
        std::atomic<int> call_index{0};
        auto forward = [&](int w, Sample* sample, std::string* error) {
          const int index = static_cast<int>((w + call_index++) % requests.size());
          const v1::ForwardRequest& request =
              buffers ? buffers->request(w, index) : requests[index];
          if (mode == "stream") {
            v1::ForwardStreamResponse& reply = streams[w]->reply;
            reply.Clear();
            if (!streams[w]->stream->Write(request) || !streams[w]->stream->Read(&reply)) {
              *error = "the stream broke";
              return false;
            }
            if (reply.code() != 0) {
              *error = reply.message();
              return false;
            }
            sample->stats = std::move(*reply.mutable_response()->mutable_stats());
            return true;
          }
          grpc::ClientContext context;
          context.set_deadline(client::DeadlineIn(o.timeout_ms));
          v1::ForwardResponse& response = responses[static_cast<size_t>(w)];
          response.Clear();
          const grpc::Status s = stubs[w % stubs.size()]->Forward(&context, request, &response);
          if (!s.ok()) {
            *error = client::GrpcCodeName(s.error_code()) + ": " + s.error_message();
            return false;
          }
          sample->stats = std::move(*response.mutable_stats());
          return true;
        };
        RunCalls(c, o.warmup, forward);
        const Run run = RunCalls(c, o.requests, forward);
        for (auto& s : streams) {
          s->stream->WritesDone();
          s->stream->Finish();
        }
        Row row;
        row.tokens_per_rank = per_rank;
        row.tokens = T;
        row.concurrency = c;
        row.mode = mode;
        row.errors = run.errors;
        if (run.samples.empty()) {
          std::fprintf(stderr, "gcmoe bench serve: T %d C %d %s: every call failed (%s)\n", T, c,
                       mode.c_str(), run.first_error.c_str());
          ++failed_rows;
          continue;
        }
        std::vector<double> us, engine, batched;
        for (const Sample& s : run.samples) {
          us.push_back(s.us);
          engine.push_back(s.stats.engine_ns() / 1e3);
          batched.push_back(s.stats.batched_calls());
          row.shared_memory_io = s.stats.shared_memory_io();
        }
        row.forward_p50 = P(us, 0.5);
        row.forward_p99 = P(us, 0.99);
        row.engine_p50 = P(engine, 0.5);
        if (have_echo) {
          row.echo_p50 = P(echo_us, 0.5);
          row.overhead_pct = 100.0 * (row.forward_p50 - row.echo_p50 - row.engine_p50) /
                             (row.echo_p50 + row.engine_p50);
        }
        row.tokens_per_s = run.samples.size() * static_cast<double>(T) / run.wall_s;
        double sum = 0;
        for (double b : batched) sum += b;
        row.batched_mean = sum / batched.size();
        for (const auto& [name, field] : Stages()) {
          std::vector<double> v;
          for (const Sample& s : run.samples) v.push_back((s.stats.*field)() / 1e3);
          row.stages[name] = P(v, 0.5);
        }
        if (run.errors > 0) {
          std::fprintf(stderr,
                       "gcmoe bench serve: T %d C %d %s: %d of %d call(s) failed, first: %s\n", T,
                       c, mode.c_str(), run.errors, o.requests, run.first_error.c_str());
        }
        if (run.errors > 0 || !have_echo) ++incomplete_rows;
        std::printf("%5d %6d %4d %10s %9.1f %9.1f %9.1f %9.1f %8.1f %10.0f %5.1f", per_rank, T, c,
                    mode.c_str(), row.echo_p50, row.forward_p50, row.forward_p99, row.engine_p50,
                    row.overhead_pct, row.tokens_per_s, row.batched_mean);
        for (const auto& [name, field] : Stages()) std::printf(" %9.1f", row.stages[name]);
        if (run.errors > 0) std::printf("  # %d of %d calls failed", run.errors, o.requests);
        if (!have_echo) std::printf("  # Echo failed");
        std::printf("\n");
        std::fflush(stdout);
        rows.push_back(std::move(row));
      }
    }
  }
  if (!o.json.empty()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json j;
      j["backend"] = info.backend();
      j["ranks"] = ranks;
      j["tokens_per_rank"] = r.tokens_per_rank;
      j["tokens"] = r.tokens;
      j["concurrency"] = r.concurrency;
      j["connections"] = o.connections;
      j["mode"] = r.mode;
      j["echo_p50_us"] = NumberOrNull(r.echo_p50);
      j["forward_p50_us"] = r.forward_p50;
      j["forward_p99_us"] = r.forward_p99;
      j["engine_p50_us"] = r.engine_p50;
      j["overhead_pct"] = NumberOrNull(r.overhead_pct);
      j["tokens_per_s"] = r.tokens_per_s;
      j["batched_calls_mean"] = r.batched_mean;
      j["shared_memory_io"] = r.shared_memory_io;
      j["errors"] = r.errors;
      nlohmann::ordered_json stages;
      for (const auto& [name, field] : Stages()) stages[name + "_p50_us"] = r.stages.at(name);
      j["stages"] = stages;
      out.push_back(j);
    }
    std::ofstream file(o.json);
    file << out.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "gcmoe bench serve: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  if (failed_rows > 0 || incomplete_rows > 0) {
    std::fprintf(stderr,
                 "gcmoe bench serve: %d row(s) with no successful call, %d with failed calls "
                 "(errors above): not a measurement of the service\n",
                 failed_rows, incomplete_rows);
    return 1;
  }
  return 0;
}

}  // namespace gcmoe::tools
