// `gcmoe bench layer --config F --tokens-per-rank 1,2,4,...,256`
//
// One rank's share of a layer (the config's model as the rank-local slice, P = 1) on the CUDA
// backend. Per token count: route every token to top-k distinct local experts uniformly at
// random (each local expert receives T * k / E tokens on average, what it receives in EP-8 for
// the example slices), run one Step (which quantizes, dispatches, computes and combines on the
// GPU), then time graph replays with CUDA events after a warm-up and report the median.
//
// The floor: bytes of the active experts' weights and scales (every expert with at least one
// token; the shared expert when the model has one) plus the activations (BF16 in, BF16 out),
// over the device-to-device copy bandwidth measured in the same run (2 GiB, read + write
// counted). The weights are streamed from HBM on every replay (hundreds of MB, far above the
// 60 MB L2), so replays of one input set measure the memory-bound regime.
#include "tools/bench_layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "balancer/balancer.h"
#include "common/flags.h"
#include "config/config.h"
#include "engine/backend.h"
#include "engine/numerics.h"
#include "engine/step_plan.h"
#include "server/command_config.h"
#include "server/engine_config.h"
#include "tools/bench_random_weights.h"
#include "tools/bench_util.h"
#include "tools/gpu_power_meter.h"

#if GCMOE_HAVE_CUDA
#include "engine/cuda_backend.h"
#endif

namespace gcmoe::tools {
namespace {

#if GCMOE_HAVE_CUDA
struct Row {
  int tokens = 0;
  int block_rows = 0;
  int64_t assignments = 0;
  int active_experts = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  double floor_bytes = 0, floor_us = 0, fraction = 0, tflops = 0, gbps = 0;
  double watts = 0, sm_mhz = 0;  // over the settling phase (0: not measured)
};

// Untimed replays in batches until `ms` have passed on the host clock, the board's energy
// counter and SM clock read after each batch when there is a meter.
Status Settle(engine::CudaBackend& gpu, int ms, const GpuPowerMeter* meter, PowerWindow* power) {
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (auto batch = gpu.TimeReplays(0, 20); !batch.ok()) return batch.status();
    uint64_t mj = 0;
    unsigned mhz = 0;
    if (meter != nullptr && meter->EnergyMillijoules(&mj)) {
      if (!meter->SmClockMhz(&mhz)) mhz = 0;
      power->Add(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 mj, mhz);
    }
  }
  return Status::Ok();
}

// Device-to-device copy bandwidth of `device` in bytes per second (bytes read + written) over a
// buffer of `bytes`, median of `reps` copies after one untimed copy: the floor's denominator,
// measured in the same run as the layer.
Result<double> MeasureCopyBandwidth(int device, size_t bytes, int reps) {
  cudaError_t err = cudaSetDevice(device);
  void* a = nullptr;
  void* b = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaMalloc(&a, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&b, bytes);
  if (err == cudaSuccess) err = cudaMemsetAsync(a, 1, bytes, s);
  if (err == cudaSuccess) err = cudaEventCreate(&start);
  if (err == cudaSuccess) err = cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < reps + 1 && err == cudaSuccess; ++i) {
    err = cudaEventRecord(start, s);
    if (err == cudaSuccess) err = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    if (err == cudaSuccess) err = cudaEventRecord(stop, s);
    if (err == cudaSuccess) err = cudaEventSynchronize(stop);
    float t = 0.0f;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&t, start, stop);
    if (i > 0) ms.push_back(t);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (a != nullptr) cudaFree(a);
  if (b != nullptr) cudaFree(b);
  if (s != nullptr) cudaStreamDestroy(s);
  if (err != cudaSuccess) {
    return Internal(std::string("measuring the copy bandwidth: ") + cudaGetErrorString(err));
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

#endif  // GCMOE_HAVE_CUDA

}  // namespace

int RunBenchLayer(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string tokens_text = "1,2,4,8,16,32,64,128,256";
  std::string weights_mode = "random";
  std::string json_path;
  std::string times_path;
  int shared_intermediate = -1;
  int warmup = 20;
  int replays = 200;
  int settle_ms = 0;
  int seed = 1;
  int dispatch_sms = -1;
  bool no_merge_tails = false;
  bool no_heaviest_first = false;
  bool no_direct_rows = false;
  bool biases = false;
  int force_bm = 0;
  int repeat = 0;
  int nondeterministic = 0;
  Flags flags("gcmoe bench layer",
              "Times one rank's MoE layer on the GPU (CUDA graph replays) against its memory "
              "floor.");
  flags.String("config", &config_path, "config file (model = the rank-local slice)");
  flags.Repeated("set", &overrides, "override a config key, key.path=value (repeatable)");
  flags.String("tokens-per-rank", &tokens_text, "token counts to measure, comma-separated");
  flags.String("weights", &weights_mode,
               "random (random codes, fast) or config (the config's model.weights)");
  flags.Int("shared-intermediate", &shared_intermediate,
            "override model.shared_intermediate (0 = no shared expert; -1 = the config's)");
  flags.Int("warmup", &warmup, "untimed replays per token count");
  flags.Int("replays", &replays, "timed replays per token count (the median is reported)");
  flags.Int("settle-ms", &settle_ms,
            "replay this long before each token count's warm-up, so that the timed replays run "
            "at the clocks the GPU sustains (0 = time from a cool start; the H200 caps its "
            "power after about 40 ms of back-to-back replays); where NVML is present, also "
            "prints the board's power, SM clock and energy per step while settling");
  flags.Int("seed", &seed, "seed of the routing, activations and random weights");
  flags.String("json", &json_path, "also write the results as JSON (for bench/torch_peer.py)");
  flags.String("times", &times_path,
               "also write every timed replay as CSV (tokens,replay,us), in replay order");
  flags.Int("dispatch-sms", &dispatch_sms,
            "SMs requested for the dispatch partition (-1 = the config's; 0 = one context, "
            "dispatch then GEMM: overlap off)");
  flags.Int("bm", &force_bm, "pin the GEMM block size (8, 16, 32, 64; 0 = the heuristic)");
  flags.Bool("no-merge-tails", &no_merge_tails,
             "ablation: at BM 64 run an expert's short last block on its own, not with the "
             "block before it");
  flags.Bool("no-heaviest-first", &no_heaviest_first,
             "ablation: lay role2's blocks out in expert id order, not heaviest expert first");
  flags.Bool("no-direct-rows", &no_direct_rows,
             "ablation: role1 pulls ring blocks after its barrier instead of writing each "
             "token's ring rows as it quantizes");
  flags.Bool("biases", &biases,
             "random weights with expert biases b1 and b2 (as gpt-oss), to time the bias path");
  flags.Int("repeat", &repeat, "run every step this many more times and check the bits repeat");
  if (const int rc = flags.ParseOrExit(argc, argv, 1); rc >= 0) return rc;
  if (config_path.empty()) {
    std::fprintf(stderr, "gcmoe bench layer: --config is required\n");
    return 2;
  }
  auto tokens = ParseTokenList(tokens_text);
  if (!tokens.ok()) {
    std::fprintf(stderr, "gcmoe bench layer: %s\n", tokens.status().message().c_str());
    return 2;
  }
  auto config = config::LoadConfigFile(config_path, overrides, server::HfCheckpointReader());
  if (!config.ok()) {
    std::fprintf(stderr, "gcmoe bench layer: %s\n", config.status().ToString().c_str());
    return 2;
  }
  engine::ModelSpec spec = server::ModelSpecFromConfig(*config);
  spec.num_layers = 1;  // the harness runs layer 0 only
  if (shared_intermediate >= 0) spec.shared_intermediate = shared_intermediate;
  if (replays < 1 || warmup < 0 || settle_ms < 0) {
    std::fprintf(stderr,
                 "gcmoe bench layer: --replays must be >= 1, --warmup and --settle-ms >= 0\n");
    return 2;
  }

#if !GCMOE_HAVE_CUDA
  (void)nondeterministic;  // counted by the GPU steps only
  std::fprintf(stderr, "gcmoe bench layer: this gcmoe was built without CUDA\n");
  return 1;
#else
  auto fail = [](const char* what, const Status& s) {
    std::fprintf(stderr, "gcmoe bench layer: %s: %s\n", what, s.ToString().c_str());
    return 1;
  };
  std::ofstream times_csv;
  if (!times_path.empty()) {
    times_csv.open(times_path);
    if (!times_csv) {
      std::fprintf(stderr, "gcmoe bench layer: cannot write %s\n", times_path.c_str());
      return 2;
    }
    times_csv << "tokens,replay,us\n";
  }
  const int max_tokens = *std::max_element(tokens->begin(), tokens->end());
  engine::BackendOptions options;
  options.model = spec;
  options.max_tokens_per_rank = std::max(max_tokens, config->engine.max_tokens_per_rank);
  options.device = server::DeviceOfRank(*config, 0);
  options.dispatch_sms = dispatch_sms >= 0 ? dispatch_sms : config->engine.dispatch_sms;
  options.cuda = server::EngineOptionsFromConfig(*config, 0, "bench").backend.cuda;
  options.cuda.merge_tails = !no_merge_tails;
  options.cuda.heaviest_first = !no_heaviest_first;
  options.cuda.direct_rows = !no_direct_rows;
  options.instance = "bench";
  auto backend = engine::CudaBackend::Create(options);
  if (!backend.ok()) return fail("creating the CUDA backend", backend.status());
  engine::CudaBackend& gpu = **backend;
  if (Status s = gpu.ForceBlockRows(force_bm); !s.ok()) return fail("--bm", s);
  // The board's power while settling, when NVML can tell (gpu_power_meter.h).
  std::unique_ptr<GpuPowerMeter> meter;
  if (settle_ms > 0) {
    char bus[64] = {};
    std::string why = "cudaDeviceGetPCIBusId failed";
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), options.device) == cudaSuccess) {
      meter = GpuPowerMeter::Open(bus, &why);
    }
    if (meter == nullptr) std::fprintf(stderr, "board power not measured: %s\n", why.c_str());
  }
  const auto& parts = gpu.partitions();
  std::fprintf(stderr, "device %d: %d SMs = %d compute + %d dispatch (%s)\n", options.device,
               parts.total_sms, parts.compute_sms, parts.dispatch_sms,
               parts.green ? "green contexts" : parts.fallback_reason.c_str());

  // With --biases, each active expert's b1 and b2 (FP32 on the device) count too.
  const int64_t expert_bytes =
      RandomCodeWeightSource::RoutedExpertBytes(spec) +
      (biases ? 4 * (2 * static_cast<int64_t>(spec.intermediate) + spec.hidden) : 0);
  const int64_t shared_bytes =
      spec.has_shared() ? RandomCodeWeightSource::SharedExpertBytes(spec) : 0;
  std::fprintf(stderr, "loading %d experts (%.0f MB of codes and scales%s) ...\n", spec.num_experts,
               (expert_bytes * spec.num_experts + shared_bytes) / 1e6,
               spec.has_shared() ? " with the shared expert" : "");
  const auto load_start = std::chrono::steady_clock::now();
  std::unique_ptr<engine::WeightSource> weights;
  if (weights_mode == "random") {
    weights = std::make_unique<RandomCodeWeightSource>(spec, static_cast<uint64_t>(seed), biases);
  } else if (weights_mode == "config") {
    auto opened = engine::WeightSource::Open(spec);
    if (!opened.ok()) return fail("opening the weights", opened.status());
    weights = std::move(opened).value();
  } else {
    std::fprintf(stderr, "gcmoe bench layer: --weights is random or config, not %s\n",
                 weights_mode.c_str());
    return 2;
  }
  std::vector<int> experts(spec.num_experts);
  std::iota(experts.begin(), experts.end(), 0);
  if (Status s = gpu.LoadExperts(*weights, experts); !s.ok()) return fail("loading experts", s);
  const std::string name = gpu.transport_name();
  if (Status s = gpu.ConnectPeers(engine::PeerSetup{1, {name}, ""}); !s.ok()) {
    return fail("connecting", s);
  }
  std::fprintf(
      stderr, "loaded in %.1f s; measuring the copy bandwidth (2 GiB) ...\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count());
  auto bandwidth = MeasureCopyBandwidth(options.device, size_t{2} << 30, 10);
  if (!bandwidth.ok()) return fail("measuring the copy bandwidth", bandwidth.status());

  const int H = spec.hidden;
  const int k = spec.top_k;
  const int E = spec.num_experts;
  std::vector<Row> rows;
  engine::StepPlan plan;
  uint64_t generation = 0;  // unique and increasing, as the backend requires
  const balancer::Placement placement = balancer::ContiguousPlacement(1, E);
  for (int T : *tokens) {
    std::fprintf(stderr, "T = %d ...\n", T);
    // Routing: k distinct experts per token, uniformly; activations N(0, 1) in BF16. Each T has
    // its own draw, so a row does not depend on which token counts were listed before it (one
    // generator for the whole list made the same T route differently in different calls).
    std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + 1 + static_cast<uint64_t>(T) * 104729);
    std::vector<int32_t> ids(static_cast<size_t>(T) * k);
    std::vector<float> route_weights(ids.size());
    std::vector<int> order(E);
    std::uniform_real_distribution<float> uniform(0.05f, 0.5f);
    for (int t = 0; t < T; ++t) {
      std::iota(order.begin(), order.end(), 0);
      for (int j = 0; j < k; ++j) {
        std::swap(order[j], order[j + static_cast<int>(rng() % (E - j))]);
        ids[static_cast<size_t>(t) * k + j] = order[j];
        route_weights[static_cast<size_t>(t) * k + j] = uniform(rng);
      }
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> hidden(static_cast<size_t>(T) * H);
    for (uint16_t& h : hidden) h = numerics::FloatToBF16(normal(rng));
    std::vector<int64_t> counts(E, 0);
    for (int32_t e : ids) ++counts[e];
    balancer::Split split;
    split.home_tokens = counts;
    split.load_before.assign(1, static_cast<int64_t>(ids.size()));
    split.load_after = split.load_before;
    const int shard[1] = {T};
    if (Status s = engine::BuildStepPlan(shard, counts, E, placement, split, &plan); !s.ok()) {
      return fail("building the step plan", s);
    }
    engine::StepContext ctx;
    ctx.generation = ++generation;
    ctx.num_tokens = T;
    ctx.hidden.dtype = engine::DType::kBF16;
    ctx.hidden.data = hidden.data();
    ctx.topk_ids = ids.data();
    ctx.topk_weights = route_weights.data();
    ctx.plan = &plan;
    engine::StepOutput out;
    if (Status s = gpu.Step(ctx, &out); !s.ok()) return fail("step", s);
    for (size_t i = 0; i < out.output.size() / 2; ++i) {
      uint16_t b;
      std::memcpy(&b, &out.output[2 * i], 2);
      if (!std::isfinite(numerics::BF16ToFloat(b))) {
        std::fprintf(stderr, "gcmoe bench layer: non-finite output at T = %d\n", T);
        return 1;
      }
    }
    // The same step again must give the same bits.
    for (int again = 0; again < repeat; ++again) {
      ctx.generation = ++generation;
      engine::StepOutput out2;
      if (Status s = gpu.Step(ctx, &out2); !s.ok()) return fail("step", s);
      if (out2.output != out.output) {
        std::fprintf(stderr, "T = %d: repeat %d of the same step differs: %s\n", T, again + 1,
                     CompareBf16(out.output, out2.output).Describe(H).c_str());
        ++nondeterministic;
      }
    }
    PowerWindow power;
    if (Status s = Settle(gpu, settle_ms, meter.get(), &power); !s.ok()) return fail("settling", s);
    auto times = gpu.TimeReplays(warmup, replays);
    if (!times.ok()) return fail("timing replays", times.status());
    for (size_t i = 0; i < times->size() && times_csv.is_open(); ++i) {
      times_csv << T << ',' << i << ',' << (*times)[i] << '\n';
    }

    Row row;
    row.tokens = T;
    row.block_rows = gpu.last_block_rows();
    row.assignments = static_cast<int64_t>(ids.size());
    row.active_experts = static_cast<int>(
        std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; }));
    row.median_us = Percentile(*times, 0.5);
    row.p10_us = Percentile(*times, 0.1);
    row.p90_us = Percentile(*times, 0.9);
    row.floor_bytes =
        static_cast<double>(row.active_experts) * expert_bytes + shared_bytes + 2.0 * T * H * 2;
    row.floor_us = row.floor_bytes / *bandwidth * 1e6;
    row.fraction = row.floor_us / row.median_us;
    const double flops = 6.0 * row.assignments * H * spec.intermediate +
                         6.0 * (spec.has_shared() ? T : 0) * H * spec.shared_intermediate;
    row.tflops = flops / (row.median_us * 1e-6) / 1e12;
    row.gbps = row.floor_bytes / (row.median_us * 1e-6) / 1e9;
    row.watts = power.Watts();
    row.sm_mhz = power.MeanSmMhz();
    rows.push_back(row);
  }

  std::printf("gcmoe bench layer: %s (H %d, I %d, %d local experts, top-%d, shared I %d%s)\n",
              config_path.c_str(), H, spec.intermediate, E, k, spec.shared_intermediate,
              biases ? ", expert biases" : "");
  std::printf(
      "GPU split %d compute + %d dispatch SMs (%s); copy bandwidth %.0f GB/s (read + write); "
      "%d ms settling + %d warm-up + %d timed replays per row\n",
      parts.compute_sms, parts.dispatch_sms,
      parts.green ? "green contexts, overlapped" : "one context, roles in sequence",
      *bandwidth / 1e9, settle_ms, warmup, replays);
  std::printf("role2%s%s%s:", no_merge_tails ? ", no merged tails" : "",
              no_heaviest_first ? ", expert id order" : "",
              no_direct_rows ? ", no direct rows" : "");
  for (int bm : kernels::kBlockSizes) {
    const kernels::Role2Shape& shape = gpu.role2_shape(bm);
    std::printf(" BM %d: %d CTAs (%d/SM) x %d threads, %zu B smem%s%s;", bm, gpu.role2_grid(bm),
                shape.blocks_per_sm, shape.threads, shape.smem_bytes,
                shape.stages > 0 ? ", stages " : "",
                shape.stages > 0 ? std::to_string(shape.stages).c_str() : "");
  }
  std::printf("\n");
  std::printf("%6s %4s %7s %6s %10s %10s %10s %10s %8s %8s %8s\n", "T/rank", "BM", "assign",
              "active", "median_us", "p10_us", "p90_us", "floor_us", "floor%", "TFLOPS", "GB/s");
  for (const Row& r : rows) {
    std::printf("%6d %4d %7lld %6d %10.1f %10.1f %10.1f %10.1f %7.1f%% %8.2f %8.0f\n", r.tokens,
                r.block_rows, static_cast<long long>(r.assignments), r.active_experts, r.median_us,
                r.p10_us, r.p90_us, r.floor_us, 100.0 * r.fraction, r.tflops, r.gbps);
  }
  if (meter != nullptr) {
    // Energy per step: the settling phase's average board power times the row's median.
    std::printf(
        "board power while settling (limit %.0f W; NVML's counter, updated every 20-100 ms)\n",
        meter->PowerLimitWatts());
    std::printf("%6s %8s %8s %9s\n", "T/rank", "W", "SM_MHz", "mJ/step");
    for (const Row& r : rows) {
      if (r.watts > 0) {
        std::printf("%6d %8.1f %8.0f %9.1f\n", r.tokens, r.watts, r.sm_mhz,
                    r.watts * r.median_us * 1e-3);
      } else {
        std::printf("%6d %8s %8.0f %9s  (settle longer: fewer than two counter updates)\n",
                    r.tokens, "-", r.sm_mhz, "-");
      }
    }
  }
  if (repeat > 0) {
    std::printf("repeated steps: %s\n", nondeterministic == 0 ? "bit-identical" : "DIFFERENT");
  }
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    json << "{\"config\": \"" << config_path << "\", \"hidden\": " << H
         << ", \"intermediate\": " << spec.intermediate << ", \"experts\": " << E
         << ", \"top_k\": " << k << ", \"shared_intermediate\": " << spec.shared_intermediate
         << ", \"copy_bandwidth_Bps\": " << *bandwidth
         << ", \"merge_tails\": " << (no_merge_tails ? "false" : "true")
         << ", \"heaviest_first\": " << (no_heaviest_first ? "false" : "true")
         << ", \"direct_rows\": " << (no_direct_rows ? "false" : "true")
         << ", \"compute_sms\": " << parts.compute_sms
         << ", \"dispatch_sms\": " << parts.dispatch_sms << ", \"settle_ms\": " << settle_ms
         << ", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      json << (i ? ", " : "") << "{\"tokens\": " << r.tokens << ", \"bm\": " << r.block_rows
           << ", \"assignments\": " << r.assignments << ", \"active_experts\": " << r.active_experts
           << ", \"median_us\": " << r.median_us << ", \"floor_us\": " << r.floor_us
           << ", \"tflops\": " << r.tflops << ", \"watts\": " << r.watts
           << ", \"sm_mhz\": " << r.sm_mhz << "}";
    }
    json << "]}\n";
  }
  return nondeterministic == 0 ? 0 : 1;
#endif
}

}  // namespace gcmoe::tools
