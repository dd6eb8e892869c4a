// libFuzzer target: the Hugging Face checkpoint reader (engine/hf_checkpoint.h) on the texts of
// config.json and model.safetensors.index.json, through ParseHfCheckpoint (the parsing behind
// ReadHfCheckpoint, without the files). The input is config.json's text, then optionally a NUL
// byte and the index's text (JSON has no raw NUL, so the split loses nothing).
//
// A refusal is INVALID_ARGUMENT and its message begins with the file it is about; the index is
// read only after config.json is accepted. An accepted checkpoint describes a MoE layer the
// engine can serve (what ModelSpec::Validate asks, and the family's activation), its MoE layers
// are model layers, the tensors of a layer have the shapes the family's layout gives to H, I, E
// and I_s, and every tensor the index names maps to one of the listed shards.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/hf_checkpoint.h"

namespace {

using gcmoe::engine::HfCheckpoint;
using gcmoe::engine::HfFamily;

constexpr char kDir[] = "fuzz-ckpt";
// LayerTensors lists 3 to 6 tensors per expert: checked for checkpoints up to this many
// experts, so that one input costs microseconds, not the reader's upper bound.
constexpr int kLayerCheckMaxExperts = 1024;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "hf_checkpoint_fuzz: %s\n", what.c_str());
  std::abort();
}

uint64_t Ceil128(uint64_t n) { return (n + 127) / 128; }

void CheckShape(const HfCheckpoint& c) {
  if (c.hidden <= 0 || c.hidden % 32 != 0) Fail("accepted hidden " + std::to_string(c.hidden));
  if (c.intermediate <= 0 || c.intermediate % 32 != 0) {
    Fail("accepted intermediate " + std::to_string(c.intermediate));
  }
  if (c.experts <= 0) Fail("accepted experts " + std::to_string(c.experts));
  if (c.top_k <= 0 || c.top_k > c.experts) Fail("accepted top_k " + std::to_string(c.top_k));
  if (c.model_layers <= 0) Fail("accepted num_hidden_layers " + std::to_string(c.model_layers));
  if (c.shared_intermediate < 0 || c.shared_intermediate % 32 != 0 ||
      (c.shared_intermediate > 0 && c.family != HfFamily::kDeepSeekV3)) {
    Fail("accepted shared_intermediate " + std::to_string(c.shared_intermediate));
  }
  if (c.fp8_blocks && c.family != HfFamily::kDeepSeekV3) Fail("FP8 blocks outside DeepSeek");
  if (c.moe_layer_ids.empty()) Fail("accepted without a MoE layer");
  for (size_t i = 0; i < c.moe_layer_ids.size(); ++i) {
    const int id = c.moe_layer_ids[i];
    if (id < 0 || id >= c.model_layers || (i > 0 && id <= c.moe_layer_ids[i - 1])) {
      Fail("MoE layer " + std::to_string(i) + " is model layer " + std::to_string(id) + " of " +
           std::to_string(c.model_layers) + " (ascending, inside the model)");
    }
  }
  for (const char* field : {"hidden", "intermediate", "experts", "top_k", "layers"}) {
    if (!c.source_keys.contains(field)) Fail(std::string("no source key for ") + field);
  }
  if (c.family == HfFamily::kGptOss) {
    if (!c.activation_clamp || !std::isfinite(*c.activation_clamp) ||
        !(*c.activation_clamp > 0.0f)) {
      Fail("gpt-oss accepted with a clamp that is not a positive finite float");
    }
    if (c.activation_alpha != 1.702f || c.activation_up_offset != 1.0f) {
      Fail("gpt-oss accepted without its activation");
    }
  } else if (c.activation_clamp || c.activation_alpha != 1.0f || c.activation_up_offset != 0.0f) {
    Fail("a plain SwiGLU family accepted with gpt-oss's activation");
  }
}

// The layout of one MoE layer, counted independently of LayerTensors: the values of its weight
// matrices (an MXFP4 byte holds two) and the number of tensors. Counts wrap modulo 2^64 (no
// overflow to report from the target itself); both sides wrap alike.
void CheckLayer(const HfCheckpoint& c, int moe_layer) {
  const uint64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_intermediate;
  const std::string prefix = "model.layers." + std::to_string(c.moe_layer_ids[moe_layer]) + ".";
  uint64_t weight_values = 0, scale_values = 0;
  std::set<std::string> names;
  const auto tensors = c.LayerTensors(moe_layer);
  const auto files = c.ShardFiles();
  for (const auto& t : tensors) {
    if (!t.name.starts_with(prefix)) Fail(t.name + ": not a tensor of " + prefix);
    if (!names.insert(t.name).second) Fail(t.name + ": listed twice");
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d <= 0) Fail(t.name + ": a dimension <= 0");
      elements *= static_cast<uint64_t>(d);
    }
    if (t.name.ends_with("_blocks")) {
      weight_values += 2 * elements;
    } else if (t.name.ends_with(".weight")) {
      weight_values += elements;
    } else if (t.name.ends_with("_scale_inv")) {
      scale_values += elements;
    }
    const std::string shard = c.ShardOf(t.name);
    if (!shard.empty() && !std::binary_search(files.begin(), files.end(), shard)) {
      Fail(t.name + ": in " + shard + ", which is not among the shard files");
    }
  }
  const bool shared = Is > 0;
  const size_t per_matrix = c.fp8_blocks ? 2 : 1;
  const size_t expected_count =
      c.family == HfFamily::kGptOss ? 6 : 3 * per_matrix * static_cast<size_t>(E + shared);
  if (tensors.size() != expected_count) {
    Fail(std::to_string(tensors.size()) + " tensors in a layer, expected " +
         std::to_string(expected_count));
  }
  if (weight_values != 3 * H * (E * I + Is))
    Fail("the layer's weights do not hold 3 H (E I + I_s)");
  const uint64_t expected_scales =
      c.fp8_blocks ? 3 * Ceil128(H) * (E * Ceil128(I) + (shared ? Ceil128(Is) : 0)) : 0;
  if (scale_values != expected_scales) Fail("the layer's FP8 block scales do not tile it");
}

void CheckShards(const HfCheckpoint& c, bool indexed) {
  const auto files = c.ShardFiles();
  if (!indexed) {
    if (c.sharded() || files != std::vector<std::string>{"model.safetensors"}) {
      Fail("sharded without an index");
    }
    return;
  }
  if (!c.sharded()) Fail("an accepted index with an empty weight_map");
  if (!std::is_sorted(files.begin(), files.end()) ||
      std::adjacent_find(files.begin(), files.end()) != files.end()) {
    Fail("shard files not sorted and unique");
  }
  for (const auto& [tensor, file] : c.weight_map) {
    if (file.empty() || file.find('/') != std::string::npos) Fail(tensor + ": shard " + file);
    if (c.ShardOf(tensor) != file) Fail(tensor + ": ShardOf disagrees with the index");
  }
}

void CheckRefusal(const gcmoe::Status& status, const std::string& file) {
  if (status.code() != gcmoe::StatusCode::kInvalidArgument) {
    Fail("a refusal is not INVALID_ARGUMENT: " + status.ToString());
  }
  const std::string head = std::string(kDir) + "/" + file + ": ";
  if (!status.message().starts_with(head) || status.message().size() == head.size()) {
    Fail("a refusal does not name " + file + ": " + status.message());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view config_json = input.substr(0, split);
  std::optional<std::string_view> index_json;
  if (split != std::string_view::npos) index_json = input.substr(split + 1);

  auto config_only = gcmoe::engine::ParseHfCheckpoint(kDir, config_json, std::nullopt);
  if (!config_only.ok()) {
    CheckRefusal(config_only.status(), "config.json");
    if (index_json) {
      auto with_index = gcmoe::engine::ParseHfCheckpoint(kDir, config_json, index_json);
      if (with_index.ok() || with_index.status().message() != config_only.status().message()) {
        Fail("the index changed the verdict on config.json");
      }
    }
    return 0;
  }
  HfCheckpoint c = std::move(config_only).value();
  if (index_json) {
    auto with_index = gcmoe::engine::ParseHfCheckpoint(kDir, config_json, index_json);
    if (!with_index.ok()) {
      CheckRefusal(with_index.status(), "model.safetensors.index.json");
      return 0;
    }
    if (with_index.value().moe_layer_ids != c.moe_layer_ids ||
        with_index.value().experts != c.experts) {
      Fail("the index changed what config.json says");
    }
    c = std::move(with_index).value();
  }
  if (c.dir != kDir) Fail("the checkpoint's dir is not the one given");
  CheckShape(c);
  CheckShards(c, index_json.has_value());
  if (c.experts <= kLayerCheckMaxExperts) {
    CheckLayer(c, 0);
    CheckLayer(c, static_cast<int>(c.moe_layer_ids.size()) - 1);
  }
  return 0;
}
