#include "tests/kernels/gpu_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "balancer/balancer.h"
#include "engine/numerics.h"
#include "engine/step_plan.h"

namespace gcmoe::kernels_test {
namespace {
// Before the process's first CUDA call (HasGpu is one): load every module at start-up.
const bool kEagerModules = setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
}  // namespace

bool HasGpu() {
  (void)kEagerModules;
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

engine::ModelSpec SmallSharedExpertModel() {
  engine::ModelSpec spec;
  spec.hidden = 256;
  spec.intermediate = 256;
  spec.num_experts = 16;
  spec.top_k = 4;
  spec.num_layers = 1;
  spec.shared_intermediate = 128;
  spec.activation_alpha = 1.0f;
  spec.activation_clamp = 10.0f;
  spec.weights = "synthetic:1";
  return spec;
}

engine::ModelSpec GptOssStyleModel(int hidden, int intermediate, int experts, int top_k,
                                   int shared_intermediate) {
  engine::ModelSpec spec;
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.num_experts = experts;
  spec.top_k = top_k;
  spec.num_layers = 1;
  spec.shared_intermediate = shared_intermediate;
  spec.activation_alpha = 1.702f;
  spec.activation_clamp = 7.0f;
  spec.activation_up_offset = 1.0f;
  spec.weights = "synthetic:1";
  return spec;
}

StepInputs MakeInputs(const engine::ModelSpec& spec, int num_tokens, engine::DType dtype,
                      Routing routing, std::mt19937_64* rng) {
  const int H = spec.hidden;
  const int k = spec.top_k;
  const int E = spec.num_experts;
  StepInputs in;
  in.num_tokens = num_tokens;
  in.dtype = dtype;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(num_tokens) * H);
  for (float& v : values) v = normal(*rng);
  in.hidden.resize(values.size() * engine::DTypeBytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case engine::DType::kFP32:
        std::memcpy(&in.hidden[4 * i], &values[i], 4);
        break;
      case engine::DType::kBF16: {
        const uint16_t b = numerics::FloatToBF16(values[i]);
        std::memcpy(&in.hidden[2 * i], &b, 2);
        break;
      }
      case engine::DType::kFP16: {
        // Values of N(0,1) are exact enough through BF16 bits rounded to FP16's 10 bits:
        // build the half by hand (normal range only).
        const float f = values[i];
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint32_t sign = (bits >> 16) & 0x8000u;
        int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
        uint16_t half = static_cast<uint16_t>(sign);
        if (exponent > 0 && exponent < 31) {
          half |= static_cast<uint16_t>((exponent << 10) | ((bits >> 13) & 0x3FF));
        }
        std::memcpy(&in.hidden[2 * i], &half, 2);
        break;
      }
      case engine::DType::kFP8E4M3:
        break;
    }
  }
  if (dtype == engine::DType::kFP8E4M3) {
    in.hidden_scales.resize(static_cast<size_t>(num_tokens) * (H / 32));
    for (int t = 0; t < num_tokens; ++t) {
      numerics::QuantizeE4M3K32(values.data() + static_cast<size_t>(t) * H, H,
                                in.hidden.data() + static_cast<size_t>(t) * H,
                                in.hidden_scales.data() + static_cast<size_t>(t) * (H / 32));
    }
  }
  in.topk_ids.assign(static_cast<size_t>(num_tokens) * k, -1);
  in.topk_weights.assign(static_cast<size_t>(num_tokens) * k, 0.0f);
  std::uniform_real_distribution<float> weight(0.05f, 0.5f);
  std::vector<int> experts(E);
  const int pool = routing == Routing::kFirstHalf ? std::max(k, E / 2) : E;
  for (int t = 0; t < num_tokens; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.begin() + pool, *rng);
    if (routing == Routing::kOneExpert || routing == Routing::kAllOnOneExpert) {
      // Expert 1 first, the others after it.
      std::iter_swap(experts.begin(), std::find(experts.begin(), experts.begin() + pool, 1));
    }
    for (int j = 0; j < k; ++j) {
      bool used = true;
      if (routing == Routing::kUnusedSlots) used = (*rng)() % 3 != 0;
      if (routing == Routing::kAllOnOneExpert) used = j == 0;
      if (routing == Routing::kOneExpert && j > 0) used = (*rng)() % 2 != 0;
      in.topk_ids[static_cast<size_t>(t) * k + j] = used ? experts[j] : -1;
      in.topk_weights[static_cast<size_t>(t) * k + j] = weight(*rng);
    }
  }
  return in;
}

std::unique_ptr<BackendPair> BackendPair::Create(const engine::ModelSpec& spec, int capacity,
                                                 const engine::WeightSource& weights,
                                                 const engine::CudaTuning& tuning,
                                                 int dispatch_sms) {
  static std::atomic<int> instances{0};
  auto pair = std::unique_ptr<BackendPair>(new BackendPair());
  pair->spec_ = spec;
  engine::BackendOptions options;
  options.model = spec;
  options.max_tokens_per_rank = capacity;
  options.dispatch_sms = dispatch_sms;
  options.cuda = tuning;
  options.instance =
      "gcmoe-gputest-" + std::to_string(getpid()) + "-" + std::to_string(instances.fetch_add(1));
  std::vector<int> all(spec.num_experts);
  std::iota(all.begin(), all.end(), 0);

  auto cpu = engine::CreateCpuBackend(options);
  EXPECT_TRUE(cpu.ok()) << cpu.status().ToString();
  if (!cpu.ok()) return nullptr;
  pair->cpu_ = std::move(cpu).value();
  EXPECT_TRUE(pair->cpu_->LoadExperts(weights, all).ok());
  const std::string cpu_name = pair->cpu_->transport_name();
  EXPECT_TRUE(pair->cpu_->ConnectPeers(engine::PeerSetup{1, {cpu_name}, ""}).ok());

  auto cuda = engine::CudaBackend::Create(options);
  EXPECT_TRUE(cuda.ok()) << cuda.status().ToString();
  if (!cuda.ok()) return nullptr;
  pair->cuda_ = std::move(cuda).value();
  const Status loaded = pair->cuda_->LoadExperts(weights, all);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  const std::string cuda_name = pair->cuda_->transport_name();
  EXPECT_TRUE(pair->cuda_->ConnectPeers(engine::PeerSetup{1, {cuda_name}, ""}).ok());
  return pair;
}

Result<engine::StepContext> BackendPair::Context(const StepInputs& in, uint64_t generation) {
  const int E = spec_.num_experts;
  std::vector<int64_t> counts(E, 0);
  for (int32_t e : in.topk_ids) {
    if (e >= 0 && e < E) ++counts[e];  // an out-of-range id is for the backend to refuse
  }
  const balancer::Placement placement = balancer::ContiguousPlacement(1, E);
  balancer::Split split;
  split.home_tokens = counts;
  split.load_before.assign(1, std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  split.load_after = split.load_before;
  const int tokens[1] = {in.num_tokens};
  GCMOE_RETURN_IF_ERROR(engine::BuildStepPlan(tokens, counts, E, placement, split, &plan_));
  engine::StepContext ctx;
  ctx.generation = generation;
  ctx.layer = 0;
  ctx.num_tokens = in.num_tokens;
  ctx.hidden.dtype = in.dtype;
  ctx.hidden.data = in.hidden.data();
  ctx.hidden.scales = in.hidden_scales.empty() ? nullptr : in.hidden_scales.data();
  ctx.topk_ids = in.topk_ids.data();
  ctx.topk_weights = in.topk_weights.data();
  ctx.plan = &plan_;
  ctx.output_fp32 = in.output_fp32;
  return ctx;
}

Status BackendPair::Run(engine::Backend* backend, const StepInputs& in, uint64_t generation,
                        engine::StepOutput* out) {
  GCMOE_ASSIGN_OR_RETURN(const engine::StepContext ctx, Context(in, generation));
  return backend->Step(ctx, out);
}

engine::StepOutput ExpectMatch(BackendPair* pair, const StepInputs& in, uint64_t generation,
                               const std::string& label) {
  engine::StepOutput cpu, gpu;
  Status s = pair->Run(pair->cpu(), in, generation, &cpu);
  EXPECT_TRUE(s.ok()) << label << ": cpu: " << s.ToString();
  s = pair->Run(pair->cuda(), in, generation, &gpu);
  EXPECT_TRUE(s.ok()) << label << ": cuda: " << s.ToString();
  EXPECT_EQ(cpu.output.size(), gpu.output.size()) << label;
  EXPECT_EQ(cpu.assignments_computed, gpu.assignments_computed) << label;
  const auto x = OutputValues(cpu, in.output_fp32);
  const auto y = OutputValues(gpu, in.output_fp32);
  EXPECT_TRUE(AllFinite(y)) << label << ": NaN or Inf in the CUDA output";
  double energy = 0.0;
  for (double v : x) energy += v * v;
  bool any_assignment = false;
  for (int32_t e : in.topk_ids) any_assignment = any_assignment || e >= 0;
  if (any_assignment) {
    EXPECT_GT(energy, 0.0) << label << ": the reference is all zero";
  }
  const double diff = CalcDiff(x, y);
  EXPECT_LT(diff, 1e-4) << label << " (BM " << pair->cuda()->last_block_rows() << ")";
  return gpu;
}

std::vector<double> OutputValues(const engine::StepOutput& out, bool fp32) {
  return numerics::OutputToDoubles(out.output, fp32);
}

double CalcDiff(const std::vector<double>& x, const std::vector<double>& y) {
  return numerics::CalcDiff(x.data(), y.data(), static_cast<long>(std::min(x.size(), y.size())));
}

bool AllFinite(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [](double v) { return std::isfinite(v); });
}

}  // namespace gcmoe::kernels_test
