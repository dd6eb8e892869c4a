// WriteWeightsFile: any WeightSource to a safetensors file in one of the three forms.
#include <spdlog/spdlog.h>

#include <map>
#include <string>
#include <vector>

#include "engine/numerics.h"
#include "engine/safetensors_writer.h"
#include "engine/weight_layout.h"
#include "engine/weights.h"

namespace gcmoe::engine {
namespace {

constexpr uint64_t kLogMinBytes = 256ull << 20;

const char* FormName(WeightFileForm form) {
  switch (form) {
    case WeightFileForm::kFloat32:
      return "f32";
    case WeightFileForm::kBFloat16:
      return "bf16";
    case WeightFileForm::kPreQuantized:
      return "prequantized";
  }
  return "?";
}

// One expert's matrix, in the form being written. `expert` is ignored for the shared expert.
struct MatrixData {
  std::vector<float> dense;
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scales;
};

Result<MatrixData> LoadMatrix(const WeightSource& source, const WeightMatrix& m, bool second,
                              int layer, int expert, bool quantized) {
  MatrixData data;
  if (quantized) {
    if (m.routed) {
      GCMOE_ASSIGN_OR_RETURN(ExpertWeights q, source.LoadExpert(layer, expert));
      data.codes = second ? std::move(q.w2) : std::move(q.w1);
      data.scales = second ? std::move(q.w2_scales) : std::move(q.w1_scales);
    } else {
      GCMOE_ASSIGN_OR_RETURN(SharedExpertWeights q, source.LoadShared(layer));
      data.codes = second ? std::move(q.w2) : std::move(q.w1);
      data.scales = second ? std::move(q.w2_scales) : std::move(q.w1_scales);
    }
  } else {
    Result<DenseExpertWeights> dense =
        m.routed ? source.LoadExpertDense(layer, expert) : source.LoadSharedDense(layer);
    if (!dense.ok()) return dense.status();
    data.dense = second ? std::move(dense->w2) : std::move(dense->w1);
  }
  return data;
}

Status WriteMatrix(const WeightSource& source, const WeightMatrix& m, bool second, int layer,
                   WeightFileForm form, SafetensorsWriter* writer) {
  const int experts = m.routed ? source.spec().num_experts : 1;
  const bool quantized = form == WeightFileForm::kPreQuantized;
  // The codes tensor must be contiguous before the scales tensor starts: stream the codes and
  // hold the (16-32x smaller) scales until every expert is written.
  std::vector<uint8_t> scales;
  std::vector<uint16_t> bf16;
  for (int expert = 0; expert < experts; ++expert) {
    GCMOE_ASSIGN_OR_RETURN(MatrixData data,
                           LoadMatrix(source, m, second, layer, expert, quantized));
    if (quantized) {
      GCMOE_RETURN_IF_ERROR(writer->Append(data.codes.data(), data.codes.size()));
      scales.insert(scales.end(), data.scales.begin(), data.scales.end());
    } else if (form == WeightFileForm::kFloat32) {
      GCMOE_RETURN_IF_ERROR(writer->Append(data.dense.data(), data.dense.size() * 4));
    } else {
      bf16.resize(data.dense.size());
      for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = numerics::FloatToBF16(data.dense[i]);
      GCMOE_RETURN_IF_ERROR(writer->Append(bf16.data(), bf16.size() * 2));
    }
  }
  if (quantized) GCMOE_RETURN_IF_ERROR(writer->Append(scales.data(), scales.size()));
  return Status::Ok();
}

// Every expert's b1 then every expert's b2 of one layer, F32.
Status WriteBiases(const WeightSource& source, int layer, SafetensorsWriter* writer) {
  std::vector<float> b2;
  for (int expert = 0; expert < source.spec().num_experts; ++expert) {
    GCMOE_ASSIGN_OR_RETURN(ExpertWeights q, source.LoadExpert(layer, expert));
    GCMOE_RETURN_IF_ERROR(writer->Append(q.b1.data(), q.b1.size() * 4));
    b2.insert(b2.end(), q.b2.begin(), q.b2.end());
  }
  return writer->Append(b2.data(), b2.size() * 4);
}

}  // namespace

Status WriteWeightsFile(const WeightSource& source, WeightFileForm form, const std::string& path) {
  const ModelSpec& spec = source.spec();
  const int experts = spec.num_experts;
  std::vector<SafetensorsTensorDecl> decls;
  uint64_t total_bytes = 0;
  // Biases are a property of the model (every expert of every layer has them, or none does).
  GCMOE_ASSIGN_OR_RETURN(ExpertWeights probe, source.LoadExpert(0, 0));
  const bool biases = probe.has_biases();
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    if (biases) {
      decls.push_back({RoutedB1Name(layer), "F32", {experts, 2 * int64_t{spec.intermediate}}});
      decls.push_back({RoutedB2Name(layer), "F32", {experts, spec.hidden}});
      total_bytes += uint64_t{4} * experts * (2 * spec.intermediate + spec.hidden);
    }
    for (const WeightMatrix& m : LayerMatrices(spec, layer)) {
      const uint64_t copies = m.routed ? experts : 1;
      switch (form) {
        case WeightFileForm::kFloat32:
        case WeightFileForm::kBFloat16: {
          const bool f32 = form == WeightFileForm::kFloat32;
          decls.push_back({m.name, f32 ? "F32" : "BF16", m.dense_shape(experts)});
          total_bytes += copies * m.elements() * (f32 ? 4 : 2);
          break;
        }
        case WeightFileForm::kPreQuantized:
          decls.push_back({m.codes_name(), "U8", m.codes_shape(experts)});
          decls.push_back({m.scales_name(), "U8", m.scales_shape(experts)});
          total_bytes += copies * m.rows * (m.code_bytes_per_row() + m.scale_bytes_per_row());
          break;
      }
    }
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "gcmoe"},
      {"form", FormName(form)},
      {"source", source.Describe()},
      {"hidden", std::to_string(spec.hidden)},
      {"intermediate", std::to_string(spec.intermediate)},
      {"experts", std::to_string(spec.num_experts)},
      {"top_k", std::to_string(spec.top_k)},
      {"layers", std::to_string(spec.num_layers)},
      {"shared_intermediate", std::to_string(spec.shared_intermediate)},
      {"activation_alpha", std::to_string(spec.activation_alpha)},
      {"activation_clamp",
       spec.activation_clamp ? std::to_string(*spec.activation_clamp) : std::string("null")},
      {"activation_up_offset", std::to_string(spec.activation_up_offset)},
  };
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                         SafetensorsWriter::Create(path, std::move(decls), metadata));
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    if (biases) {
      Status status = WriteBiases(source, layer, writer.get());
      if (!status.ok()) return status.WithContext("writing " + path);
    }
    // Matrices come in pairs (w1, w2) per expert kind; `second` selects w2 of the pair.
    const std::vector<WeightMatrix> matrices = LayerMatrices(spec, layer);
    for (size_t i = 0; i < matrices.size(); ++i) {
      Status status = WriteMatrix(source, matrices[i], i % 2 == 1, layer, form, writer.get());
      if (!status.ok()) return status.WithContext("writing " + path);
    }
    if (total_bytes > kLogMinBytes) {
      spdlog::info("{}: wrote layer {} of {}", path, layer + 1, spec.num_layers);
    }
  }
  return writer->Finish();
}

}  // namespace gcmoe::engine
