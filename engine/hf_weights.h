// Internal: weights from a Hugging Face checkpoint directory ("hf:DIR"), memory-mapped shard by
// shard. Only the expert tensors of the MoE layers are read, a layer at a time; pages already
// read are handed back to the kernel, so a load never holds the whole checkpoint in memory.
//
// gpt-oss's MXFP4 codes and scales are served as they are (gate and up rows de-interleaved, no
// requantization). BF16 experts (Qwen3-MoE, Mixtral) are quantized to MXFP4 at load; DeepSeek's
// FP8 experts are dequantized exactly (E4M3 x F32 block scale in float64) and requantized.
// CheckExperts logs, per layer, the calc_diff of the served weights against the checkpoint's.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/hf_checkpoint.h"
#include "engine/safetensors_reader.h"
#include "engine/weights.h"

namespace gcmoe::engine {

class HfWeightSource final : public WeightSource {
 public:
  // spec.weights is "hf:DIR". Reads config.json (spec must agree with it: errors name both
  // values), maps every shard and checks every expert tensor's presence, dtype and shape;
  // errors name the file and the tensor.
  static Result<std::unique_ptr<WeightSource>> Open(const ModelSpec& spec);

  const ModelSpec& spec() const override { return spec_; }
  std::string Describe() const override { return spec_.weights; }

  Result<ExpertWeights> LoadExpert(int layer, int expert) const override;
  Result<SharedExpertWeights> LoadShared(int layer) const override;
  // The checkpoint's values as floats: BF16 as stored, FP8 and MXFP4 dequantized exactly.
  Result<DenseExpertWeights> LoadExpertDense(int layer, int expert) const override;
  Result<DenseExpertWeights> LoadSharedDense(int layer) const override;
  // Reads and checks every value (NaN/Inf, NaN codes and scales), layer by layer, with progress
  // and the quantization error of each layer in the log.
  Status CheckExperts(const std::vector<int>& layers,
                      const std::vector<int>& experts) const override;

 private:
  struct Located {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensor* tensor = nullptr;
  };

  HfWeightSource(ModelSpec spec, HfCheckpoint checkpoint)
      : spec_(std::move(spec)), ckpt_(std::move(checkpoint)) {}
  Status OpenShards();
  Status Locate(const HfTensorSpec& expected);
  const Located& At(const std::string& name) const { return located_.at(name); }
  // "DIR/model-00001-of-00002.safetensors: model.layers.0.mlp.experts.3.up_proj.weight"
  std::string Where(const std::string& name) const;

  // One [rows, cols] matrix of a per-expert family as floats into `out`, values checked (NaN,
  // Inf, E4M3 NaN codes, non-finite block scales).
  Status ReadMatrix(const std::string& name, int64_t rows, int64_t cols, float* out) const;
  // gate, up and down of one expert (-1: the shared expert) as our W1 [2 inter, H], W2 [H, inter].
  Result<DenseExpertWeights> LoadPerExpertDense(int layer, int expert, int inter) const;
  Result<ExpertWeights> LoadGptOss(int layer, int expert) const;
  uint64_t ExpertBytes(int layer, int expert) const;

  ModelSpec spec_;
  HfCheckpoint ckpt_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // by shard file name
  std::map<std::string, Located> located_;                         // by tensor name
};

}  // namespace gcmoe::engine
