#include "engine/hf_checkpoint.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace gcmoe::engine {
namespace {

using nlohmann::json;

constexpr char kHfPrefix[] = "hf:";
// DeepSeek-V3's FP8 weights carry one scale per 128x128 block.
constexpr int64_t kFp8Block = 128;
// gpt-oss's SwiGLU: sigmoid(1.702 g), the up half offset by one.
constexpr float kGptOssAlpha = 1.702f;
// The integers config.json may give a key.
struct IntRange {
  int min = 1;
  int max = INT32_MAX;
};

constexpr IntRange kDim = {.max = kHfMaxDim};
constexpr IntRange kExperts = {.max = kHfMaxExperts};
constexpr IntRange kLayers = {.max = kHfMaxLayers};

Result<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open (is the checkpoint directory complete?)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<json> ParseJsonObject(std::string_view text, const std::string& path) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
    return j;
  } catch (const json::exception& e) {
    return InvalidArgument(path + ": not valid JSON: " + e.what());
  }
}

// Reads the first of `keys` present in `j` as an int in `range`; records the key it came from.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string path, HfCheckpoint* ckpt)
      : j_(j), path_(std::move(path)), ckpt_(ckpt) {}

  Status Int(const std::string& field, std::initializer_list<const char*> keys, int* out,
             IntRange range = {}, std::optional<int> fallback = std::nullopt) {
    std::string names;
    for (const char* key : keys) {
      names += (names.empty() ? "" : " or ") + std::string(key);
      const auto it = j_.find(key);
      if (it == j_.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() < range.min ||
          it->get<int64_t>() > range.max) {
        return InvalidArgument(path_ + ": " + key + " is " + it->dump() + ", expected an integer " +
                               (range.max == INT32_MAX ? ">= " + std::to_string(range.min)
                                                       : "in " + std::to_string(range.min) + ".." +
                                                             std::to_string(range.max)));
      }
      *out = it->get<int>();
      ckpt_->source_keys[field] = key;
      return Status::Ok();
    }
    if (fallback) {
      *out = *fallback;
      return Status::Ok();
    }
    return InvalidArgument(path_ + ": missing " + names + " (the " + field + " of the MoE layer)");
  }

  // A list of layer indices: integers in 0..INT32_MAX.
  Result<std::vector<int>> IntList(const char* key) {
    std::vector<int> values;
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return values;
    if (!it->is_array()) return InvalidArgument(path_ + ": " + key + " is not a list");
    for (const json& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
        return InvalidArgument(path_ + ": " + key + " holds " + v.dump() +
                               ", expected layer indices (integers >= 0)");
      }
      values.push_back(v.get<int>());
    }
    return values;
  }

  const json& raw() const { return j_; }

 private:
  const json& j_;
  std::string path_;
  HfCheckpoint* ckpt_;
};

Result<HfFamily> FamilyOf(const std::string& model_type, const std::string& path) {
  if (model_type == "gpt_oss") return HfFamily::kGptOss;
  if (model_type == "qwen3_moe") return HfFamily::kQwen3Moe;
  if (model_type == "mixtral") return HfFamily::kMixtral;
  if (model_type == "deepseek_v3") return HfFamily::kDeepSeekV3;
  return InvalidArgument(path + ": model_type \"" + model_type +
                         "\" is not served (expected gpt_oss, qwen3_moe, mixtral or deepseek_v3)");
}

Status ReadFamilyShape(ConfigReader& r, const std::string& path, HfCheckpoint* c) {
  const json& j = r.raw();
  GCMOE_RETURN_IF_ERROR(r.Int("hidden", {"hidden_size"}, &c->hidden, kDim));
  GCMOE_RETURN_IF_ERROR(r.Int("layers", {"num_hidden_layers"}, &c->model_layers, kLayers));
  GCMOE_RETURN_IF_ERROR(r.Int("top_k", {"num_experts_per_tok", "experts_per_token"}, &c->top_k));
  std::vector<int> moe_layers;
  switch (c->family) {
    case HfFamily::kGptOss: {
      GCMOE_RETURN_IF_ERROR(r.Int("intermediate", {"intermediate_size"}, &c->intermediate, kDim));
      GCMOE_RETURN_IF_ERROR(
          r.Int("experts", {"num_local_experts", "num_experts"}, &c->experts, kExperts));
      // Served as a float: a double beyond FLT_MAX does not convert, one below the smallest
      // float rounds to a clamp of 0.
      const auto limit = j.find("swiglu_limit");
      const double limit_value = limit != j.end() && limit->is_number() ? limit->get<double>() : 0;
      if (!(limit_value > 0.0 && limit_value <= FLT_MAX &&
            static_cast<float>(limit_value) > 0.0f)) {
        return InvalidArgument(path + ": swiglu_limit is " +
                               (limit == j.end() ? std::string("missing") : limit->dump()) +
                               ", expected a positive number within float's range "
                               "(gpt-oss clamps its SwiGLU at it)");
      }
      c->activation_alpha = kGptOssAlpha;
      c->activation_clamp = static_cast<float>(limit_value);
      c->activation_up_offset = 1.0f;
      c->source_keys["clamp"] = "swiglu_limit";
      for (int l = 0; l < c->model_layers; ++l) moe_layers.push_back(l);
      break;
    }
    case HfFamily::kMixtral:
      GCMOE_RETURN_IF_ERROR(r.Int("intermediate", {"intermediate_size"}, &c->intermediate, kDim));
      GCMOE_RETURN_IF_ERROR(r.Int("experts", {"num_local_experts"}, &c->experts, kExperts));
      for (int l = 0; l < c->model_layers; ++l) moe_layers.push_back(l);
      break;
    case HfFamily::kQwen3Moe: {
      GCMOE_RETURN_IF_ERROR(
          r.Int("intermediate", {"moe_intermediate_size"}, &c->intermediate, kDim));
      GCMOE_RETURN_IF_ERROR(r.Int("experts", {"num_experts"}, &c->experts, kExperts));
      int sparse_step = 1;
      GCMOE_RETURN_IF_ERROR(
          r.Int("decoder_sparse_step", {"decoder_sparse_step"}, &sparse_step, {}, 1));
      GCMOE_ASSIGN_OR_RETURN(std::vector<int> mlp_only, r.IntList("mlp_only_layers"));
      const std::set<int> dense(mlp_only.begin(), mlp_only.end());
      for (int l = 0; l < c->model_layers; ++l) {
        if (!dense.contains(l) && (l + 1) % sparse_step == 0) moe_layers.push_back(l);
      }
      break;
    }
    case HfFamily::kDeepSeekV3: {
      GCMOE_RETURN_IF_ERROR(
          r.Int("intermediate", {"moe_intermediate_size"}, &c->intermediate, kDim));
      GCMOE_RETURN_IF_ERROR(r.Int("experts", {"n_routed_experts"}, &c->experts, kExperts));
      int shared = 0, first_dense = 0, freq = 1;
      GCMOE_RETURN_IF_ERROR(r.Int("n_shared_experts", {"n_shared_experts"}, &shared,
                                  {.min = 0, .max = kHfMaxDim / c->intermediate}, 0));
      GCMOE_RETURN_IF_ERROR(
          r.Int("first_k_dense_replace", {"first_k_dense_replace"}, &first_dense, {.min = 0}, 0));
      GCMOE_RETURN_IF_ERROR(r.Int("moe_layer_freq", {"moe_layer_freq"}, &freq, {}, 1));
      c->shared_intermediate = shared * c->intermediate;  // <= kHfMaxDim
      if (shared > 0) c->source_keys["shared_intermediate"] = "n_shared_experts";
      for (int l = first_dense; l < c->model_layers; ++l) {
        if (l % freq == 0) moe_layers.push_back(l);
      }
      const auto quant = j.find("quantization_config");
      if (quant != j.end() && quant->is_object()) {
        const auto method = quant->find("quant_method");
        if (method == quant->end() || *method != "fp8") {
          return InvalidArgument(
              path + ": quantization_config.quant_method is " +
              (method == quant->end() ? std::string("missing") : method->dump()) +
              ", not served (expected \"fp8\", or no quantization_config)");
        }
        const json block = quant->value("weight_block_size", json::array({128, 128}));
        if (block != json::array({kFp8Block, kFp8Block})) {
          return InvalidArgument(path + ": quantization_config.weight_block_size is " +
                                 block.dump() + ", expected [128, 128]");
        }
        c->fp8_blocks = true;
      }
      break;
    }
  }
  if (moe_layers.empty()) return InvalidArgument(path + ": no layer of the model has experts");
  c->moe_layer_ids = std::move(moe_layers);
  // The numerics' block scaling runs in blocks of 32 along both contraction dimensions.
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"hidden", c->hidden}, {"intermediate", c->intermediate}}) {
    if (value % 32 != 0) {
      return InvalidArgument(path + ": " + c->source_keys[field] + " is " + std::to_string(value) +
                             ", gcmoe serves multiples of 32 (block scaling along K)");
    }
  }
  if (c->top_k > c->experts) {
    return InvalidArgument(path + ": " + c->source_keys["top_k"] + " " + std::to_string(c->top_k) +
                           " exceeds the " + std::to_string(c->experts) + " experts");
  }
  return Status::Ok();
}

Status ParseIndex(std::string_view text, HfCheckpoint* c) {
  GCMOE_ASSIGN_OR_RETURN(json index, ParseJsonObject(text, c->index_path()));
  const auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object()) {
    return InvalidArgument(c->index_path() + ": no weight_map object");
  }
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().empty() ||
        file.get<std::string>().find('/') != std::string::npos) {
      return InvalidArgument(c->index_path() + ": weight_map[\"" + tensor +
                             "\"] is not a file name in the checkpoint directory");
    }
    c->weight_map[tensor] = file.get<std::string>();
  }
  if (c->weight_map.empty()) return InvalidArgument(c->index_path() + ": weight_map is empty");
  return Status::Ok();
}

std::string LayerPrefix(const HfCheckpoint& c, int moe_layer) {
  return "model.layers." + std::to_string(c.moe_layer_ids.at(moe_layer)) + ".";
}

}  // namespace

const char* HfFamilyName(HfFamily family) {
  switch (family) {
    case HfFamily::kGptOss:
      return "gpt-oss";
    case HfFamily::kQwen3Moe:
      return "qwen3-moe";
    case HfFamily::kMixtral:
      return "mixtral";
    case HfFamily::kDeepSeekV3:
      return "deepseek-v3";
  }
  return "?";
}

std::optional<std::string> HfCheckpointDir(const std::string& weights) {
  if (!weights.starts_with(kHfPrefix)) return std::nullopt;
  std::string dir = weights.substr(sizeof(kHfPrefix) - 1);
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string HfCheckpoint::ShardOf(const std::string& tensor) const {
  if (!sharded()) return "model.safetensors";
  const auto it = weight_map.find(tensor);
  return it == weight_map.end() ? "" : it->second;
}

std::vector<std::string> HfCheckpoint::ShardFiles() const {
  if (!sharded()) return {"model.safetensors"};
  std::set<std::string> files;
  for (const auto& [tensor, file] : weight_map) files.insert(file);
  return {files.begin(), files.end()};
}

std::string HfCheckpoint::ExpertTensor(int moe_layer, int expert, const std::string& matrix) const {
  const std::string prefix = LayerPrefix(*this, moe_layer);
  if (family == HfFamily::kMixtral) {
    const std::string w = matrix == "gate" ? "w1" : matrix == "up" ? "w3" : "w2";
    return prefix + "block_sparse_moe.experts." + std::to_string(expert) + "." + w + ".weight";
  }
  const std::string owner =
      expert < 0 ? "mlp.shared_experts." : "mlp.experts." + std::to_string(expert) + ".";
  return prefix + owner + matrix + "_proj.weight";
}

std::string HfCheckpoint::FusedTensor(int moe_layer, const std::string& what) const {
  return LayerPrefix(*this, moe_layer) + "mlp.experts." + what;
}

std::vector<HfTensorSpec> HfCheckpoint::LayerTensors(int moe_layer) const {
  const int64_t H = hidden, I = intermediate, E = experts;
  std::vector<HfTensorSpec> tensors;
  if (family == HfFamily::kGptOss) {
    // [E, rows, K/32, 16]: one 32-value block is 16 bytes of E2M1 pairs.
    tensors.push_back(
        {FusedTensor(moe_layer, "gate_up_proj_blocks"), "U8", {E, 2 * I, H / 32, 16}});
    tensors.push_back({FusedTensor(moe_layer, "gate_up_proj_scales"), "U8", {E, 2 * I, H / 32}});
    tensors.push_back({FusedTensor(moe_layer, "gate_up_proj_bias"), "BF16", {E, 2 * I}});
    tensors.push_back({FusedTensor(moe_layer, "down_proj_blocks"), "U8", {E, H, I / 32, 16}});
    tensors.push_back({FusedTensor(moe_layer, "down_proj_scales"), "U8", {E, H, I / 32}});
    tensors.push_back({FusedTensor(moe_layer, "down_proj_bias"), "BF16", {E, H}});
    return tensors;
  }
  const std::string dtype = fp8_blocks ? "F8_E4M3" : "BF16";
  auto blocks = [](int64_t n) { return (n + kFp8Block - 1) / kFp8Block; };
  auto add_expert = [&](int expert, int64_t inter) {
    for (const char* matrix : {"gate", "up", "down"}) {
      const bool down = std::string(matrix) == "down";
      const int64_t rows = down ? H : inter, cols = down ? inter : H;
      const std::string name = ExpertTensor(moe_layer, expert, matrix);
      tensors.push_back({name, dtype, {rows, cols}});
      if (fp8_blocks) {
        tensors.push_back({name + "_scale_inv", "F32", {blocks(rows), blocks(cols)}});
      }
    }
  };
  for (int e = 0; e < experts; ++e) add_expert(e, I);
  if (shared_intermediate > 0) add_expert(-1, shared_intermediate);
  return tensors;
}

Result<HfCheckpoint> ParseHfCheckpoint(const std::string& dir, std::string_view config_json,
                                       std::optional<std::string_view> index_json) {
  HfCheckpoint c;
  c.dir = dir;
  GCMOE_ASSIGN_OR_RETURN(json config, ParseJsonObject(config_json, c.config_path()));
  const auto type = config.find("model_type");
  if (type == config.end() || !type->is_string()) {
    return InvalidArgument(c.config_path() + ": no model_type string");
  }
  c.model_type = type->get<std::string>();
  GCMOE_ASSIGN_OR_RETURN(c.family, FamilyOf(c.model_type, c.config_path()));
  ConfigReader reader(config, c.config_path(), &c);
  GCMOE_RETURN_IF_ERROR(ReadFamilyShape(reader, c.config_path(), &c));
  if (index_json) GCMOE_RETURN_IF_ERROR(ParseIndex(*index_json, &c));
  return c;
}

Result<HfCheckpoint> ReadHfCheckpoint(const std::string& dir) {
  HfCheckpoint files;
  files.dir = dir;
  GCMOE_ASSIGN_OR_RETURN(std::string config_json, ReadTextFile(files.config_path()));
  std::optional<std::string> index_json;
  if (std::ifstream(files.index_path()).good()) {
    GCMOE_ASSIGN_OR_RETURN(index_json, ReadTextFile(files.index_path()));
  }
  return ParseHfCheckpoint(dir, config_json, index_json);
}

}  // namespace gcmoe::engine
