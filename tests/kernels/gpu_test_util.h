// Helpers of the GPU tests: one step run on the CPU backend and on the CUDA backend with
// identical inputs, and the accuracy figures DESIGN.md §4 asks for.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda_backend.h"

namespace gcmoe::kernels_test {

// Whether a CUDA device is usable; the GPU tests GTEST_SKIP() otherwise (the only skip).
bool HasGpu();
inline constexpr char kNoGpu[] = "no CUDA device on this machine (GPU test skipped)";

// A step's inputs, owned.
struct StepInputs {
  int num_tokens = 0;
  engine::DType dtype = engine::DType::kBF16;
  std::vector<uint8_t> hidden;         // [T, H] in dtype
  std::vector<uint8_t> hidden_scales;  // [T, H/32] with FP8
  std::vector<int32_t> topk_ids;       // [T, k]
  std::vector<float> topk_weights;     // [T, k]
  bool output_fp32 = false;
};

// Routing patterns of the tests.
enum class Routing {
  kUniform,         // k distinct experts per token, uniformly
  kFirstHalf,       // only experts 0..E/2-1 (the rest stay empty)
  kOneExpert,       // every token's slot 0 on one expert, other slots uniform or unused
  kUnusedSlots,     // uniform, about a third of the slots -1
  kAllOnOneExpert,  // slot 0 on expert 1, every other slot unused
};

// A one-layer model with gpt-oss's activation (alpha 1.702, clamp 7, up offset 1) on the given
// shape; shared_intermediate 0: no shared expert.
engine::ModelSpec GptOssStyleModel(int hidden, int intermediate, int experts, int top_k,
                                   int shared_intermediate);

// H = I = 256, 16 experts, top-4, a shared expert of 128, alpha 1 and clamp 10: small enough
// for thousands of steps in a test.
engine::ModelSpec SmallSharedExpertModel();

StepInputs MakeInputs(const engine::ModelSpec& spec, int num_tokens, engine::DType dtype,
                      Routing routing, std::mt19937_64* rng);

// The two backends over one model and weight source (P = 1).
class BackendPair {
 public:
  // tuning: the CUDA backend's (engine.cuda and the ablation switches).
  // dispatch_sms: the partitioned, overlapped path by default (the service's default is no
  // partition, 0): it has the cross-partition handshakes to test.
  static std::unique_ptr<BackendPair> Create(const engine::ModelSpec& spec, int capacity,
                                             const engine::WeightSource& weights,
                                             const engine::CudaTuning& tuning = {},
                                             int dispatch_sms = 16);
  engine::CudaBackend* cuda() { return cuda_.get(); }
  engine::Backend* cpu() { return cpu_.get(); }

  // Runs the step on one backend; `generation` must increase from call to call.
  Status Run(engine::Backend* backend, const StepInputs& in, uint64_t generation,
             engine::StepOutput* out);
  // The step's context, its plan made from `in`'s routing (valid until the next call).
  Result<engine::StepContext> Context(const StepInputs& in, uint64_t generation);

 private:
  engine::ModelSpec spec_;
  std::unique_ptr<engine::Backend> cpu_;
  std::unique_ptr<engine::CudaBackend> cuda_;
  engine::StepPlan plan_;
};

// Runs the step on both backends of `pair` and expects the DESIGN.md §4 agreement (both steps
// succeed, the same assignments, calc_diff < 1e-4, no NaN or Inf, a reference that is not all
// zero when any slot is used); `label` names the case in failures. Returns the CUDA output.
engine::StepOutput ExpectMatch(BackendPair* pair, const StepInputs& in, uint64_t generation,
                               const std::string& label);

// Outputs (BF16 or FP32 bytes) as doubles.
std::vector<double> OutputValues(const engine::StepOutput& out, bool fp32);
// calc_diff of DESIGN.md §4, and whether any value is NaN or infinite.
double CalcDiff(const std::vector<double>& x, const std::vector<double>& y);
bool AllFinite(const std::vector<double>& x);

}  // namespace gcmoe::kernels_test
