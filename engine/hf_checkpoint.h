// A Hugging Face checkpoint directory ("hf:DIR"): its config.json (the family and the MoE
// layer's shape), its shard index and the expert tensors each family stores, by name, dtype and
// shape. Reading it opens no shard; engine/hf_weights.h maps the shards and loads the experts.
//
// Families (tensor names with l = the model layer, e = the expert):
//   gpt-oss      model.layers.{l}.mlp.experts.gate_up_proj_{blocks,scales,bias}  [E, 2I, ...]
//                model.layers.{l}.mlp.experts.down_proj_{blocks,scales,bias}     [E, H, ...]
//                MXFP4 (E2M1 blocks of 16 bytes, UE8M0 scales), BF16 biases; gate and up rows
//                interleaved (gate 0, up 0, gate 1, ...); g * sigmoid(1.702 g) * (u + 1) with
//                g clamped above and u on both sides at swiglu_limit.
//   qwen3_moe    model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight     BF16
//   mixtral      model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3,w2}.weight BF16
//   deepseek_v3  model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight     F8_E4M3 with
//                .weight_scale_inv F32 per 128x128 block (or BF16 without), and the shared
//                experts model.layers.{l}.mlp.shared_experts.*; the first first_k_dense_replace
//                layers are dense and not served.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace gcmoe::engine {

// Bounds on config.json's sizes, far above published MoE models: a checkpoint beyond them is
// refused before anything is allocated per layer or per expert, and every tensor dimension
// and element count fits int64.
constexpr int kHfMaxDim = 1 << 20;      // hidden_size, (moe_)intermediate_size, and I_s
constexpr int kHfMaxExperts = 1 << 16;  // routed experts
constexpr int kHfMaxLayers = 1 << 16;   // num_hidden_layers

enum class HfFamily { kGptOss, kQwen3Moe, kMixtral, kDeepSeekV3 };

// "gpt-oss", "qwen3-moe", "mixtral", "deepseek-v3".
const char* HfFamilyName(HfFamily family);

// One tensor a MoE layer needs, as the family stores it.
struct HfTensorSpec {
  std::string name;
  std::string dtype;  // safetensors dtype: "U8", "BF16", "F8_E4M3", "F32"
  std::vector<int64_t> shape;
};

struct HfCheckpoint {
  std::string dir;
  std::string model_type;  // config.json "model_type"
  HfFamily family = HfFamily::kMixtral;

  // The MoE layer's shape and activation, as config.json gives them.
  int hidden = 0;        // H
  int intermediate = 0;  // I, per routed expert
  int experts = 0;       // E
  int top_k = 0;
  int shared_intermediate = 0;  // I_s (DeepSeek: n_shared_experts x moe_intermediate_size)
  float activation_alpha = 1.0f;
  std::optional<float> activation_clamp;
  float activation_up_offset = 0.0f;
  bool fp8_blocks = false;  // DeepSeek: F8_E4M3 weights with 128x128 weight_scale_inv

  int model_layers = 0;            // num_hidden_layers
  std::vector<int> moe_layer_ids;  // model layers with experts, ascending: MoE layer i is model
                                   // layer moe_layer_ids[i]
  // The config.json key behind each field, for messages: {"hidden", "hidden_size"}, ...
  std::map<std::string, std::string> source_keys;

  // Shard file (relative to dir) of each tensor, from model.safetensors.index.json; empty when
  // the checkpoint is one model.safetensors.
  std::map<std::string, std::string> weight_map;

  std::string config_path() const { return dir + "/config.json"; }
  std::string index_path() const { return dir + "/model.safetensors.index.json"; }
  bool sharded() const { return !weight_map.empty(); }
  // The file that holds `tensor` (relative to dir), or "" when the index does not name it.
  std::string ShardOf(const std::string& tensor) const;
  // Every shard file the index names (or model.safetensors), sorted.
  std::vector<std::string> ShardFiles() const;

  // Every tensor of MoE layer `moe_layer` the loader reads, in the order it reads them.
  std::vector<HfTensorSpec> LayerTensors(int moe_layer) const;

  // Tensor names of one matrix: "gate", "up", "down" (per-expert families) for expert e, or
  // the shared expert's with e = -1 (DeepSeek).
  std::string ExpertTensor(int moe_layer, int expert, const std::string& matrix) const;
  // gpt-oss: "gate_up_proj" or "down_proj" + "_blocks" / "_scales" / "_bias".
  std::string FusedTensor(int moe_layer, const std::string& what) const;
};

// Reads DIR/config.json and DIR/model.safetensors.index.json (when present). Errors name the
// file and the key: an unknown model_type, a missing or non-integer field, a size beyond the
// bounds above, a MoE layer shape the numerics cannot serve (H or I not a multiple of 32).
Result<HfCheckpoint> ReadHfCheckpoint(const std::string& dir);

// ReadHfCheckpoint's parsing, on the texts of DIR/config.json and of DIR's index (nullopt: the
// checkpoint has no index); `dir` goes into the result and the messages. Opens no file.
Result<HfCheckpoint> ParseHfCheckpoint(const std::string& dir, std::string_view config_json,
                                       std::optional<std::string_view> index_json);

// "hf:DIR" -> DIR; nullopt for other weight specs.
std::optional<std::string> HfCheckpointDir(const std::string& weights);

}  // namespace gcmoe::engine
