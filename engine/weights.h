// Expert weights: where they come from (a safetensors file or a seed) and their quantized form.
// Tensor names, dtypes and shapes are those of DESIGN.md §4.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model_spec.h"

namespace gcmoe::engine {

// One routed expert, quantized: E2M1 packed two per byte, UE8M0 scales per 32 along K.
struct ExpertWeights {
  std::vector<uint8_t> w1;         // [2I, H/2]  rows 0..I-1 gate, I..2I-1 up
  std::vector<uint8_t> w1_scales;  // [2I, H/32]
  std::vector<uint8_t> w2;         // [H, I/2]
  std::vector<uint8_t> w2_scales;  // [H, I/32]
  // Optional FP32 biases (gpt-oss), both present or both empty: b1 is added to W1's sums before
  // the BF16 rounding, b2 (scaled by the routing weight) to W2's sums (DESIGN.md §4).
  std::vector<float> b1;  // [2I]  gate then up, as the rows of w1
  std::vector<float> b2;  // [H]
  bool has_biases() const { return !b1.empty(); }
};

// The shared expert, quantized: E4M3, UE8M0 scales per 32 along K.
struct SharedExpertWeights {
  std::vector<uint8_t> w1;         // [2Is, H]
  std::vector<uint8_t> w1_scales;  // [2Is, H/32]
  std::vector<uint8_t> w2;         // [H, Is]
  std::vector<uint8_t> w2_scales;  // [H, Is/32]
};

// Full-precision weights before quantization (for the unquantized float64 reference).
struct DenseExpertWeights {
  std::vector<float> w1;  // [2I, H] (or [2Is, H] for the shared expert)
  std::vector<float> w2;  // [H, I]  (or [H, Is])
  std::vector<float> b1;  // [2I] or empty, as ExpertWeights::b1
  std::vector<float> b2;  // [H] or empty
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // spec.weights is "synthetic:SEED" (deterministic from the seed, any expert generated
  // independently of the others), the path of a safetensors file, or "hf:DIR", a Hugging Face
  // checkpoint directory (engine/hf_checkpoint.h). Opening a file checks its
  // header: every tensor of every layer present, dtypes and shapes as expected; errors name the
  // tensor. Values (NaN/Inf, scale code 255) are checked when a tensor is loaded.
  static Result<std::unique_ptr<WeightSource>> Open(const ModelSpec& spec);

  virtual const ModelSpec& spec() const = 0;
  // "synthetic:7" or the file's path.
  virtual std::string Describe() const = 0;

  virtual Result<ExpertWeights> LoadExpert(int layer, int expert) const = 0;
  virtual Result<SharedExpertWeights> LoadShared(int layer) const = 0;  // spec must have one

  // The weights before quantization, where the source has them (synthetic, or F32/BF16
  // tensors in the file); NotFound for pre-quantized files.
  virtual Result<DenseExpertWeights> LoadExpertDense(int layer, int expert) const = 0;
  virtual Result<DenseExpertWeights> LoadSharedDense(int layer) const = 0;

  // Reads every tensor a set of layers/experts needs and checks its values, logging progress
  // for large files. Used at start-up so a bad file fails before the service reports SERVING.
  virtual Status CheckExperts(const std::vector<int>& layers,
                              const std::vector<int>& experts) const = 0;
};

// Writes a safetensors file holding the model's weights in one of two forms, for tools and
// tests: full precision (F32 tensors `layers.{l}.experts.w1`, ...) or pre-quantized (`.blocks`
// and `.scales` / `.fp8` and `.scales`). Values come from `source` (e.g. a synthetic source).
enum class WeightFileForm { kFloat32, kBFloat16, kPreQuantized };
Status WriteWeightsFile(const WeightSource& source, WeightFileForm form, const std::string& path);

}  // namespace gcmoe::engine
