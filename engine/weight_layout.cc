#include "engine/weight_layout.h"

#include "engine/numerics.h"

namespace gcmoe::engine {
namespace {

std::vector<int64_t> WithExperts(const WeightMatrix& m, int num_experts, int64_t cols) {
  if (m.routed) return {num_experts, m.rows, cols};
  return {m.rows, cols};
}

std::string Prefix(int layer) { return "layers." + std::to_string(layer) + "."; }

}  // namespace

std::vector<int64_t> WeightMatrix::dense_shape(int num_experts) const {
  return WithExperts(*this, num_experts, cols);
}

std::vector<int64_t> WeightMatrix::codes_shape(int num_experts) const {
  return WithExperts(*this, num_experts, code_bytes_per_row());
}

std::vector<int64_t> WeightMatrix::scales_shape(int num_experts) const {
  return WithExperts(*this, num_experts, scale_bytes_per_row());
}

WeightMatrix RoutedW1(const ModelSpec& spec, int layer) {
  return {Prefix(layer) + "experts.w1", true, 2 * int64_t{spec.intermediate}, spec.hidden, 0};
}

WeightMatrix RoutedW2(const ModelSpec& spec, int layer) {
  return {Prefix(layer) + "experts.w2", true, spec.hidden, spec.intermediate, 1};
}

WeightMatrix SharedW1(const ModelSpec& spec, int layer) {
  return {Prefix(layer) + "shared.w1", false, 2 * int64_t{spec.shared_intermediate}, spec.hidden,
          2};
}

WeightMatrix SharedW2(const ModelSpec& spec, int layer) {
  return {Prefix(layer) + "shared.w2", false, spec.hidden, spec.shared_intermediate, 3};
}

std::string RoutedB1Name(int layer) { return Prefix(layer) + "experts.b1"; }
std::string RoutedB2Name(int layer) { return Prefix(layer) + "experts.b2"; }

std::vector<WeightMatrix> LayerMatrices(const ModelSpec& spec, int layer) {
  std::vector<WeightMatrix> matrices = {RoutedW1(spec, layer), RoutedW2(spec, layer)};
  if (spec.has_shared()) {
    matrices.push_back(SharedW1(spec, layer));
    matrices.push_back(SharedW2(spec, layer));
  }
  return matrices;
}

void QuantizeMatrix(const WeightMatrix& m, const float* dense, uint8_t* codes, uint8_t* scales) {
  const int cols = static_cast<int>(m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    uint8_t* row_codes = codes + r * m.code_bytes_per_row();
    uint8_t* row_scales = scales + r * m.scale_bytes_per_row();
    if (m.routed) {
      numerics::QuantizeE2M1K32(dense + r * m.cols, cols, row_codes, row_scales);
    } else {
      numerics::QuantizeE4M3K32(dense + r * m.cols, cols, row_codes, row_scales);
    }
  }
}

Status CheckLayerIndex(const ModelSpec& spec, int layer) {
  if (layer < 0 || layer >= spec.num_layers) {
    return InvalidArgument("layer " + std::to_string(layer) + " out of range [0, " +
                           std::to_string(spec.num_layers) + ")");
  }
  return Status::Ok();
}

Status CheckExpertIndex(const ModelSpec& spec, int layer, int expert) {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec, layer));
  if (expert < 0 || expert >= spec.num_experts) {
    return InvalidArgument("expert " + std::to_string(expert) + " out of range [0, " +
                           std::to_string(spec.num_experts) + ")");
  }
  return Status::Ok();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string IndexString(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] > 0) {
      index[i] = flat % shape[i];
      flat /= shape[i];
    }
  }
  return ShapeString(index);
}

}  // namespace gcmoe::engine
