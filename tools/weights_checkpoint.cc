// `gcmoe weights inspect DIR` and `gcmoe weights convert hf:DIR OUT`: what a Hugging Face
// checkpoint directory holds (read from config.json, the index and the shard headers, no
// tensor data), and the conversion of its experts to gcmoe's own safetensors layout.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/flags.h"
#include "engine/hf_checkpoint.h"
#include "engine/safetensors_reader.h"
#include "engine/weight_layout.h"
#include "engine/weights.h"
#include "tools/weights_checkpoint.h"

namespace gcmoe::tools {
namespace {

double GiB(uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }
double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 20); }

// "%g" of a float: "7", "1.702".
std::string Number(float v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(v));
  return text;
}

// "g * sigmoid(1.702 g) * (u + 1), g <= 7, |u| <= 7"
std::string Activation(const engine::HfCheckpoint& c) {
  std::string s = "g * sigmoid(" + Number(c.activation_alpha) + " g) * (u";
  if (c.activation_up_offset != 0.0f) s += " + " + Number(c.activation_up_offset);
  s += ")";
  if (c.activation_clamp) {
    s += ", g <= " + Number(*c.activation_clamp) + ", |u| <= " + Number(*c.activation_clamp);
  }
  return s;
}

std::string LayerList(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    // Runs of consecutive layers print as "a-b".
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j;
  }
  return s;
}

}  // namespace

int RunWeightsInspect(int argc, char** argv) {
  Flags flags("gcmoe weights inspect",
              "Describes a Hugging Face checkpoint directory without loading it: the family and\n"
              "MoE shape from config.json, the shards, and every expert tensor the server would\n"
              "read, with its dtype, shape and bytes; missing or mismatched tensors are listed.\n"
              "Exit status 0 when every expert tensor is present as expected, 1 if not.");
  flags.Positional("DIR", "the checkpoint directory (or hf:DIR)");
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "gcmoe weights inspect: expected exactly one DIR\n\n%s",
                 flags.Usage().c_str());
    return 2;
  }
  std::string dir = flags.positional()[0];
  if (auto stripped = engine::HfCheckpointDir(dir)) dir = *stripped;
  auto checkpoint = engine::ReadHfCheckpoint(dir);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "%s: %s\n", dir.c_str(), checkpoint.status().message().c_str());
    return 1;
  }
  const engine::HfCheckpoint& c = *checkpoint;
  std::printf("%s: %s checkpoint (model_type %s)\n", dir.c_str(), engine::HfFamilyName(c.family),
              c.model_type.c_str());
  std::printf("  MoE layer: H=%d I=%d E=%d top-%d, %s\n", c.hidden, c.intermediate, c.experts,
              c.top_k,
              c.shared_intermediate > 0
                  ? ("shared expert I_s=" + std::to_string(c.shared_intermediate)).c_str()
                  : "no shared expert");
  std::printf("  activation: %s\n", Activation(c).c_str());
  std::printf("  MoE layers: %zu of %d model layers (model layers %s)\n", c.moe_layer_ids.size(),
              c.model_layers, LayerList(c.moe_layer_ids).c_str());

  std::map<std::string, std::unique_ptr<engine::SafetensorsFile>> files;
  uint64_t shard_bytes = 0;
  int problems = 0;
  for (const std::string& shard : c.ShardFiles()) {
    auto file = engine::SafetensorsFile::Open(dir + "/" + shard);
    if (!file.ok()) {
      std::printf("  shard %s: unreadable (%s)\n", shard.c_str(), file.status().message().c_str());
      ++problems;
      continue;
    }
    shard_bytes += (*file)->file_bytes();
    files[shard] = std::move(file).value();
  }
  std::printf("  shards: %zu file(s), %.2f GiB%s\n", c.ShardFiles().size(), GiB(shard_bytes),
              c.sharded() ? " (model.safetensors.index.json)" : "");

  std::map<std::string, uint64_t> bytes_by_dtype;
  int tensors = 0;
  for (int layer = 0; layer < static_cast<int>(c.moe_layer_ids.size()); ++layer) {
    for (const engine::HfTensorSpec& t : c.LayerTensors(layer)) {
      ++tensors;
      const std::string shard = c.ShardOf(t.name);
      const auto file = files.find(shard);
      const engine::SafetensorsTensor* found =
          file == files.end() ? nullptr : file->second->Find(t.name);
      std::string problem;
      if (shard.empty()) {
        problem = "missing (not in the index)";
      } else if (file == files.end()) {
        problem = "in " + shard + ", which is unreadable";
      } else if (found == nullptr) {
        problem = "missing from " + shard;
      } else if (found->dtype != t.dtype) {
        problem = "dtype " + found->dtype + ", expected " + t.dtype;
      } else if (found->shape != t.shape) {
        problem = "shape " + engine::ShapeString(found->shape) + ", expected " +
                  engine::ShapeString(t.shape);
      }
      if (!problem.empty()) {
        // The first few name the pattern; a checkpoint missing a whole family of tensors
        // would otherwise print thousands of lines.
        if (problems < 20) std::printf("  %s: %s\n", t.name.c_str(), problem.c_str());
        ++problems;
        continue;
      }
      bytes_by_dtype[t.dtype] += found->bytes();
    }
  }
  uint64_t expert_bytes = 0;
  std::string by_dtype;
  for (const auto& [dtype, bytes] : bytes_by_dtype) {
    expert_bytes += bytes;
    char text[64];
    std::snprintf(text, sizeof(text), "%s%s %.2f GiB", by_dtype.empty() ? "" : ", ", dtype.c_str(),
                  GiB(bytes));
    by_dtype += text;
  }
  std::printf("  expert tensors: %d expected, %d present (%s; %.2f GiB, per MoE layer %.1f MiB)\n",
              tensors, tensors - problems, by_dtype.c_str(), GiB(expert_bytes),
              MiB(expert_bytes / std::max<size_t>(1, c.moe_layer_ids.size())));
  if (problems > 0) {
    std::printf("  %d problem(s)%s: gcmoe serve would refuse this checkpoint\n", problems,
                problems > 20 ? " (the first 20 listed)" : "");
    return 1;
  }
  std::printf("  complete: serve it with \"model\": {\"weights\": \"hf:%s\"}\n", dir.c_str());
  return 0;
}

int RunWeightsConvert(int argc, char** argv) {
  Flags flags("gcmoe weights convert",
              "Converts the experts of a Hugging Face checkpoint (hf:DIR) to gcmoe's own\n"
              "safetensors layout (DESIGN.md section 4), pre-quantized as served: MXFP4 routed\n"
              "experts (gpt-oss codes as stored, others quantized), E4M3 shared experts, F32\n"
              "biases. `gcmoe weights check OUT` with the printed shape flags validates it.");
  flags.Positional("SOURCE OUT", "SOURCE is hf:DIR, the checkpoint; OUT the safetensors file");
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  if (flags.positional().size() != 2) {
    std::fprintf(stderr, "gcmoe weights convert: expected SOURCE and OUT\n\n%s",
                 flags.Usage().c_str());
    return 2;
  }
  const std::string source_spec = flags.positional()[0];
  const std::string out = flags.positional()[1];
  const auto dir = engine::HfCheckpointDir(source_spec);
  if (!dir) {
    std::fprintf(stderr, "gcmoe weights convert: SOURCE is \"%s\", expected hf:DIR\n",
                 source_spec.c_str());
    return 2;
  }
  auto checkpoint = engine::ReadHfCheckpoint(*dir);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "gcmoe weights convert: %s\n", checkpoint.status().message().c_str());
    return 1;
  }
  const engine::HfCheckpoint& c = *checkpoint;
  engine::ModelSpec spec;
  spec.hidden = c.hidden;
  spec.intermediate = c.intermediate;
  spec.num_experts = c.experts;
  spec.top_k = c.top_k;
  spec.num_layers = static_cast<int>(c.moe_layer_ids.size());
  spec.shared_intermediate = c.shared_intermediate;
  spec.activation_alpha = c.activation_alpha;
  spec.activation_clamp = c.activation_clamp;
  spec.activation_up_offset = c.activation_up_offset;
  spec.weights = source_spec;

  const auto start = std::chrono::steady_clock::now();
  auto source = engine::WeightSource::Open(spec);
  if (!source.ok()) {
    std::fprintf(stderr, "gcmoe weights convert: %s\n", source.status().message().c_str());
    return 1;
  }
  std::vector<int> layers(spec.num_layers), experts(spec.num_experts);
  for (int l = 0; l < spec.num_layers; ++l) layers[l] = l;
  for (int e = 0; e < spec.num_experts; ++e) experts[e] = e;
  if (Status s = (*source)->CheckExperts(layers, experts); !s.ok()) {
    std::fprintf(stderr, "gcmoe weights convert: %s\n", s.message().c_str());
    return 1;
  }
  if (Status s = engine::WriteWeightsFile(**source, engine::WeightFileForm::kPreQuantized, out);
      !s.ok()) {
    std::fprintf(stderr, "gcmoe weights convert: %s\n", s.message().c_str());
    return 1;
  }
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(out, ec);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s experts of %zu MoE layer(s), %.1f MiB in %.1f s\n", out.c_str(),
              engine::HfFamilyName(c.family), c.moe_layer_ids.size(), MiB(bytes), seconds);
  std::printf(
      "check it:  gcmoe weights check %s --hidden %d --intermediate %d --experts %d "
      "--top-k %d --layers %d --shared-intermediate %d\n",
      out.c_str(), c.hidden, c.intermediate, c.experts, c.top_k, spec.num_layers,
      c.shared_intermediate);
  std::printf("serve it with model.activation {\"alpha\": %s, \"clamp\": %s, \"up_offset\": %s}\n",
              Number(c.activation_alpha).c_str(),
              c.activation_clamp ? Number(*c.activation_clamp).c_str() : "null",
              Number(c.activation_up_offset).c_str());
  return 0;
}

}  // namespace gcmoe::tools
