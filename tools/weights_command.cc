// `gcmoe weights export | check` (inspect and convert: weights_checkpoint.cc): write a synthetic
// model's weights to a safetensors file; open a weights file and check every tensor (presence,
// dtype, shape, values) for a model shape.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "common/flags.h"
#include "engine/model_spec.h"
#include "engine/weights.h"
#include "tools/commands.h"
#include "tools/weights_checkpoint.h"

namespace gcmoe::tools {
namespace {

void PrintGroupUsage(FILE* out) {
  std::fputs(
      "usage: gcmoe weights COMMAND [flags]   (gcmoe weights COMMAND --help for its flags)\n"
      "\n"
      "Weight files in safetensors format (tensor names and shapes: DESIGN.md section 4).\n"
      "\n"
      "commands:\n"
      "  export    write a synthetic model (--seed) to a file: f32, bf16 or prequantized\n"
      "  check     open FILE and check every tensor of every layer for the model shape\n"
      "  inspect   describe a Hugging Face checkpoint directory without loading it\n"
      "  convert   convert a Hugging Face checkpoint (hf:DIR) to gcmoe's own layout\n",
      out);
}

// The model shape both commands take, as flags. Kept in this one function so that a switch to
// --config changes one place. Defaults: the tiny model of the tests and the embedded config.
void AddShapeFlags(Flags* flags, engine::ModelSpec* spec) {
  spec->hidden = 256;
  spec->intermediate = 128;
  spec->num_experts = 16;
  spec->top_k = 4;
  spec->num_layers = 2;
  spec->shared_intermediate = 128;
  flags->Int("hidden", &spec->hidden, "H, hidden size (multiple of 32)");
  flags->Int("intermediate", &spec->intermediate, "I, per-expert intermediate size");
  flags->Int("experts", &spec->num_experts, "E, routed experts per layer");
  flags->Int("top-k", &spec->top_k, "k, experts per token");
  flags->Int("layers", &spec->num_layers, "MoE layers");
  flags->Int("shared-intermediate", &spec->shared_intermediate,
             "I_s of the shared expert, 0 = none");
}

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// "H=256 I=128 E=16 top-4, 2 layers, shared I_s=128"
std::string ShapeSummary(const engine::ModelSpec& spec) {
  std::string s = "H=" + std::to_string(spec.hidden) + " I=" + std::to_string(spec.intermediate) +
                  " E=" + std::to_string(spec.num_experts) + " top-" + std::to_string(spec.top_k) +
                  ", " + std::to_string(spec.num_layers) +
                  (spec.num_layers == 1 ? " layer, " : " layers, ");
  return s + (spec.has_shared() ? "shared I_s=" + std::to_string(spec.shared_intermediate)
                                : std::string("no shared expert"));
}

int RunExport(int argc, char** argv) {
  engine::ModelSpec spec;
  int64_t seed = 7;
  std::string form_name = "prequantized";
  std::string out;
  Flags flags("gcmoe weights export",
              "Writes the weights of the synthetic model \"synthetic:SEED\" of the given shape to\n"
              "a safetensors file: full precision (f32, bf16; quantized when loaded) or\n"
              "pre-quantized (E2M1/E4M3 codes + UE8M0 scales, loaded as they are).");
  AddShapeFlags(&flags, &spec);
  flags.Int64("seed", &seed, "seed of the synthetic weights");
  flags.String("form", &form_name, "f32 | bf16 | prequantized");
  flags.String("out", &out, "file to write (required)");
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  auto usage_error = [&](const std::string& message) {
    std::fprintf(stderr, "gcmoe weights export: %s\n\n%s", message.c_str(), flags.Usage().c_str());
    return 2;
  };
  if (!flags.positional().empty()) {
    return usage_error("unexpected argument \"" + flags.positional()[0] + "\"");
  }
  if (out.empty()) return usage_error("--out is required");
  if (seed < 0) return usage_error("--seed must be non-negative");
  engine::WeightFileForm form;
  if (form_name == "f32") {
    form = engine::WeightFileForm::kFloat32;
  } else if (form_name == "bf16") {
    form = engine::WeightFileForm::kBFloat16;
  } else if (form_name == "prequantized") {
    form = engine::WeightFileForm::kPreQuantized;
  } else {
    return usage_error("--form is \"" + form_name + "\", expected f32, bf16 or prequantized");
  }
  spec.weights = "synthetic:" + std::to_string(seed);

  const auto start = std::chrono::steady_clock::now();
  auto source = engine::WeightSource::Open(spec);
  if (!source.ok()) return usage_error(source.status().message());
  const Status status = engine::WriteWeightsFile(**source, form, out);
  if (!status.ok()) {
    std::fprintf(stderr, "gcmoe weights export: %s\n", status.ToString().c_str());
    return 1;
  }
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(out, ec);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s, %s weights of %s, %.1f MiB in %.1f s\n", out.c_str(),
              ShapeSummary(spec).c_str(), form_name.c_str(), spec.weights.c_str(), MiB(bytes),
              seconds);
  return 0;
}

int RunCheck(int argc, char** argv) {
  engine::ModelSpec spec;
  Flags flags("gcmoe weights check",
              "Opens a safetensors weights file for the given model shape and checks every\n"
              "tensor of every layer: presence, dtype and shape, then every value (no NaN or\n"
              "Inf, no NaN scale or E4M3 code). Exit status 0 when the file is good, 1 if not.");
  flags.Positional("FILE", "the safetensors file to check");
  AddShapeFlags(&flags, &spec);
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  if (flags.positional().size() != 1) {
    std::fprintf(stderr, "gcmoe weights check: expected exactly one FILE\n\n%s",
                 flags.Usage().c_str());
    return 2;
  }
  spec.weights = flags.positional()[0];
  if (spec.weights.starts_with("synthetic:")) {
    std::fprintf(stderr, "gcmoe weights check: FILE must be a path, not %s\n",
                 spec.weights.c_str());
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  auto source = engine::WeightSource::Open(spec);
  if (!source.ok()) {
    std::fprintf(stderr, "%s: bad (%s)\n", spec.weights.c_str(),
                 source.status().ToString().c_str());
    return 1;
  }
  std::vector<int> layers(spec.num_layers), experts(spec.num_experts);
  for (int l = 0; l < spec.num_layers; ++l) layers[l] = l;
  for (int e = 0; e < spec.num_experts; ++e) experts[e] = e;
  const Status status = (*source)->CheckExperts(layers, experts);
  if (!status.ok()) {
    std::fprintf(stderr, "%s: bad (%s)\n", spec.weights.c_str(), status.ToString().c_str());
    return 1;
  }
  // Which form serves the quantized weights: full precision present, or pre-quantized only.
  const bool dense = (*source)->LoadExpertDense(0, 0).ok();
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(spec.weights, ec);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: ok (%s; %s; %.1f MiB checked in %.1f s)\n", spec.weights.c_str(),
              ShapeSummary(spec).c_str(),
              dense ? "full-precision tensors present" : "pre-quantized tensors only", MiB(bytes),
              seconds);
  return 0;
}

}  // namespace

int RunWeightsCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintGroupUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "export") == 0) return RunExport(argc, argv);
  if (std::strcmp(argv[1], "check") == 0) return RunCheck(argc, argv);
  if (std::strcmp(argv[1], "inspect") == 0) return RunWeightsInspect(argc, argv);
  if (std::strcmp(argv[1], "convert") == 0) return RunWeightsConvert(argc, argv);
  std::fprintf(stderr, "gcmoe weights: unknown command \"%s\"\n\n", argv[1]);
  PrintGroupUsage(stderr);
  return 2;
}

}  // namespace gcmoe::tools
