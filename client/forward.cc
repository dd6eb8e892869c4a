// `gcmoe client forward`: builds requests from the served model's shape (or .npy files), sends
// them with C calls in flight, and prints the client's and the server's view of the run.
#include "client/forward.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "client/channel.h"
#include "client/npy.h"
#include "client/requests.h"
#include "client/summary.h"
#include "client/tensors.h"
#include "common/flags.h"
#include "gcmoe/v1/moe.grpc.pb.h"

namespace gcmoe::client {
namespace {

// Distinct random batches cycled through: enough that the server does not see one batch over
// and over, few enough to hold the largest batches (tens of MB each) in memory.
constexpr int kMaxVariants = 4;

constexpr const char* kSummary =
    "Sends Forward requests to the service and prints a summary: calls by status, tokens/s,\n"
    "client-side latency percentiles, the server's engine time and per-rank load before and\n"
    "after balancing, and the outputs' mean |y| and NaN count. Exit status 0 when every call\n"
    "succeeded with a finite output.\n"
    "\n"
    "Random requests take H, E and k from GetModelInfo: activations ~ N(0, 1), k distinct\n"
    "experts per token (uniform, or Zipf-skewed with --skew), softmax routing weights. Up to 4\n"
    "distinct batches are cycled through.\n"
    "\n"
    "--input DIR sends one request read from NumPy files instead:\n"
    "  DIR/hidden.npy        [T, H] float32 (or float64, float16), encoded as --dtype\n"
    "  DIR/topk_ids.npy      [T, k] int32 (or int64), expert ids, -1 = unused slot\n"
    "  DIR/topk_weights.npy  [T, k] float32 (or float64)\n"
    "e.g. np.save(\"req/hidden.npy\", x.astype(np.float32)); likewise topk_ids, topk_weights.\n"
    "--save FILE writes the last response's output as a [T, H] float32 .npy: np.load(FILE).";

struct Options {
  std::string addr = "127.0.0.1:50051";
  int tokens = 64;
  int layer = 0;
  std::string dtype = "bf16";
  std::string output_dtype = "bf16";
  int requests = 20;
  int concurrency = 1;
  int warmup = 1;
  int64_t seed = 1;
  double skew = 0.0;
  std::string input;
  std::string save;
  int deadline_ms = 0;
  int timeout_ms = 10000;
};

// One call's outcome, as a worker sees it.
struct CallOutcome {
  double latency_us = 0.0;
  grpc::Status status;
  std::string bad_output;  // set when the call succeeded but its output is malformed
};

CallOutcome Call(v1::MoeService::Stub* stub, const v1::ForwardRequest& request, int deadline_ms,
                 v1::ForwardResponse* response, std::vector<float>* output) {
  grpc::ClientContext context;
  if (deadline_ms > 0) context.set_deadline(DeadlineIn(deadline_ms));
  const auto start = std::chrono::steady_clock::now();
  CallOutcome outcome;
  outcome.status = stub->Forward(&context, request, response);
  outcome.latency_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (!outcome.status.ok()) return outcome;
  const int64_t tokens = request.hidden().shape(0);
  const int64_t hidden = request.hidden().shape(1);
  const auto& shape = response->output().shape();
  if (shape.size() != 2 || shape[0] != tokens || shape[1] != hidden) {
    outcome.bad_output =
        "output shape is not [" + std::to_string(tokens) + ", " + std::to_string(hidden) + "]";
    return outcome;
  }
  Result<std::vector<float>> values = DecodeFloatTensor(response->output());
  if (!values.ok()) {
    outcome.bad_output = values.status().message();
  } else {
    *output = std::move(values).value();
  }
  return outcome;
}

Status CheckOptions(const Options& o, v1::DType* dtype, v1::DType* output_dtype) {
  if (!ParseDTypeName(o.dtype, dtype)) {
    return InvalidArgument("--dtype: expected bf16, fp32 or fp8, got \"" + o.dtype + "\"");
  }
  if (!ParseDTypeName(o.output_dtype, output_dtype) || *output_dtype == v1::FP8_E4M3) {
    return InvalidArgument("--output-dtype: expected bf16 or fp32, got \"" + o.output_dtype + "\"");
  }
  if (o.tokens < 1) return InvalidArgument("--tokens: expected a positive integer");
  if (o.layer < 0) return InvalidArgument("--layer: expected a non-negative integer");
  if (o.requests < 1) return InvalidArgument("--requests: expected a positive integer");
  if (o.concurrency < 1) return InvalidArgument("--concurrency: expected a positive integer");
  if (o.warmup < 0) return InvalidArgument("--warmup: expected a non-negative integer");
  if (o.skew < 0) return InvalidArgument("--skew: expected a number >= 0");
  if (o.deadline_ms < 0) return InvalidArgument("--deadline-ms: expected 0 (none) or more");
  return Status::Ok();
}

Result<std::vector<v1::ForwardRequest>> BuildRequests(const Options& o, const v1::ModelInfo& info,
                                                      v1::DType dtype, v1::DType output_dtype) {
  std::vector<RequestArrays> batches;
  if (!o.input.empty()) {
    GCMOE_ASSIGN_OR_RETURN(RequestArrays from_files, ReadRequestDir(o.input));
    batches.push_back(std::move(from_files));
  } else {
    const int variants = std::min(o.requests, kMaxVariants);
    for (int v = 0; v < variants; ++v) {
      RandomRequestOptions r;
      r.tokens = o.tokens;
      r.hidden = static_cast<int>(info.hidden());
      r.experts = static_cast<int>(info.experts());
      r.top_k = static_cast<int>(info.top_k());
      r.skew = o.skew;
      r.popularity_seed = static_cast<uint64_t>(o.seed);
      r.seed = static_cast<uint64_t>(o.seed) * 1000003u + static_cast<uint64_t>(v);
      batches.push_back(RandomRequest(r));
    }
  }
  std::vector<v1::ForwardRequest> requests;
  for (size_t v = 0; v < batches.size(); ++v) {
    GCMOE_ASSIGN_OR_RETURN(
        v1::ForwardRequest request,
        BuildForwardRequest(batches[v], static_cast<uint32_t>(o.layer), dtype, output_dtype,
                            "gcmoe-client-" + std::to_string(o.seed) + "-" + std::to_string(v)));
    requests.push_back(std::move(request));
  }
  return requests;
}

}  // namespace

int RunForward(int argc, char** argv) {
  Options o;
  Flags flags("gcmoe client forward", kSummary);
  flags.String("addr", &o.addr, "service address host:port");
  flags.Int("tokens", &o.tokens, "tokens per request (T) for random requests");
  flags.Int("layer", &o.layer, "MoE layer index");
  flags.String("dtype", &o.dtype, "hidden dtype sent: bf16 | fp32 | fp8 (E4M3 + UE8M0 per 32)");
  flags.String("output-dtype", &o.output_dtype, "output dtype asked for: bf16 | fp32");
  flags.Int("requests", &o.requests, "requests to measure (N)");
  flags.Int("concurrency", &o.concurrency, "calls in flight at once (C)");
  flags.Int("warmup", &o.warmup, "requests sent first, one at a time, and not measured");
  flags.Int64("seed", &o.seed, "seed of the random requests (and of which experts are hot)");
  flags.Double("skew", &o.skew,
               "expert popularity skew: 0 uniform; X > 0 Zipf with exponent X (1-2: a few hot "
               "experts, for balancer demos)");
  flags.String("input", &o.input, "directory with hidden.npy, topk_ids.npy, topk_weights.npy");
  flags.String("save", &o.save, "write the last response's output here (.npy, float32)");
  flags.Int("deadline-ms", &o.deadline_ms, "deadline per call in ms; 0 = the server's default");
  flags.Int("timeout-ms", &o.timeout_ms, "deadline of the initial GetModelInfo in ms");
  ConnectionOptions connection;
  AddConnectionFlags(&flags, &connection);
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  v1::DType dtype = v1::BF16;
  v1::DType output_dtype = v1::BF16;
  if (Status s = CheckOptions(o, &dtype, &output_dtype); !s.ok()) {
    std::fprintf(stderr, "gcmoe client forward: %s\n", s.message().c_str());
    return 2;
  }

  auto made = MakeChannel(o.addr, kDefaultMaxMessageBytes, connection);
  if (!made.ok()) {
    std::fprintf(stderr, "gcmoe client forward: %s\n", made.status().message().c_str());
    return 2;
  }
  std::shared_ptr<grpc::Channel> channel = *made;
  v1::ModelInfo info;
  {
    auto stub = v1::MoeService::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(o.timeout_ms));
    const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (!status.ok()) {
      std::fprintf(stderr, "%s\n",
                   DescribeFailure(o.addr, "GetModelInfo", channel.get(), status).c_str());
      return 1;
    }
  }
  if (info.max_message_bytes() > static_cast<uint64_t>(kDefaultMaxMessageBytes)) {
    made =
        MakeChannel(o.addr, static_cast<int>(std::min<uint64_t>(info.max_message_bytes(), INT_MAX)),
                    connection);
    if (!made.ok()) {
      std::fprintf(stderr, "gcmoe client forward: %s\n", made.status().message().c_str());
      return 2;
    }
    channel = *made;
  }
  auto stub = v1::MoeService::NewStub(channel);

  Result<std::vector<v1::ForwardRequest>> built = BuildRequests(o, info, dtype, output_dtype);
  if (!built.ok()) {
    std::fprintf(stderr, "gcmoe client forward: %s\n", built.status().message().c_str());
    return 1;
  }
  const std::vector<v1::ForwardRequest>& requests = *built;
  const int64_t tokens = requests.front().hidden().shape(0);
  const int64_t payload = PayloadBytes(requests.front());
  if (info.max_message_bytes() > 0 && static_cast<uint64_t>(payload) > info.max_message_bytes()) {
    std::fprintf(stderr,
                 "warning: a request carries %lld bytes, over the server's limit of %llu "
                 "(ModelInfo.max_message_bytes): expect RESOURCE_EXHAUSTED; send fewer tokens\n",
                 static_cast<long long>(payload),
                 static_cast<unsigned long long>(info.max_message_bytes()));
  }

  std::printf("gcmoe client forward -> %s: H=%u E=%u top-%u, %u rank%s, %s backend, balancer %s\n",
              o.addr.c_str(), info.hidden(), info.experts(), info.top_k(), info.ranks(),
              info.ranks() == 1 ? "" : "s", info.backend().c_str(),
              info.balancer_enabled() ? "on" : "off");
  char skew[32];
  std::snprintf(skew, sizeof(skew), "%g", o.skew);
  const std::string source =
      o.input.empty() ? "random, skew " + std::string(skew) : "from " + o.input;
  std::printf(
      "  sending     %d x %lld tokens (%s in, %s out, layer %d, %s), concurrency %d, "
      "warm-up %d\n",
      o.requests, static_cast<long long>(tokens), DTypeName(dtype).c_str(),
      DTypeName(output_dtype).c_str(), o.layer, source.c_str(), o.concurrency, o.warmup);
  std::fflush(stdout);

  int warmup_failures = 0;
  std::string warmup_error;
  for (int i = 0; i < o.warmup; ++i) {
    v1::ForwardResponse response;
    std::vector<float> output;
    const CallOutcome c =
        Call(stub.get(), requests[i % requests.size()], o.deadline_ms, &response, &output);
    if (!c.status.ok()) {
      ++warmup_failures;
      warmup_error = GrpcCodeName(c.status.error_code()) + ": " + c.status.error_message();
      if (IsUnreachable(channel.get(), c.status)) break;
    }
  }
  if (warmup_failures > 0) {
    std::printf("  warm-up     %d of %d failed, last: %s\n", warmup_failures, o.warmup,
                warmup_error.c_str());
  }

  ForwardSummary summary;
  std::atomic<int> next{0};
  std::mutex last_mu;
  std::optional<std::vector<float>> last_output;
  std::vector<int64_t> last_shape;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (int i = next++; i < o.requests; i = next++) {
      v1::ForwardResponse response;
      std::vector<float> output;
      const CallOutcome c =
          Call(stub.get(), requests[i % requests.size()], o.deadline_ms, &response, &output);
      if (!c.status.ok()) {
        summary.AddFailure(c.latency_us, GrpcCodeName(c.status.error_code()),
                           c.status.error_message());
      } else if (!c.bad_output.empty()) {
        summary.AddFailure(c.latency_us, "BAD_OUTPUT", c.bad_output);
      } else {
        summary.AddOk(c.latency_us, response, CheckOutput(output));
        if (!o.save.empty()) {
          std::lock_guard<std::mutex> lock(last_mu);
          last_output = std::move(output);
          last_shape.assign(response.output().shape().begin(), response.output().shape().end());
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min(o.concurrency, o.requests); ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::fputs(summary.Format({.tokens_per_request = tokens, .wall_s = wall_s}).c_str(), stdout);
  int exit_code = summary.failed() == 0 && summary.outputs_finite() ? 0 : 1;
  if (!o.save.empty()) {
    if (!last_output) {
      std::fprintf(stderr, "gcmoe client forward: no successful response to --save\n");
      exit_code = 1;
    } else if (Status s = WriteNpyFloat32(o.save, last_shape, *last_output); !s.ok()) {
      std::fprintf(stderr, "gcmoe client forward: %s\n", s.message().c_str());
      exit_code = 1;
    } else {
      std::printf("  saved       %s\n", o.save.c_str());
    }
  }
  return exit_code;
}

}  // namespace gcmoe::client
