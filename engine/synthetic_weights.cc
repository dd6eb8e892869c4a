#include "engine/synthetic_weights.h"

#include <cmath>

#include "common/splitmix64.h"

namespace gcmoe::engine {
namespace {

constexpr uint64_t kGamma = kSplitMixGamma;
constexpr uint64_t Mix(uint64_t z) { return SplitMixMix(z); }

// One key per (seed, layer, expert, matrix); values are Mix(key + (index + 1) * gamma), the
// splitmix64 sequence of that key read at any position.
uint64_t StreamKey(uint64_t seed, int layer, int expert, int tensor_id) {
  uint64_t key = Mix(seed + kGamma);
  key = Mix(key ^ (static_cast<uint64_t>(static_cast<uint32_t>(layer)) + kGamma));
  key = Mix(key ^ (static_cast<uint64_t>(static_cast<uint32_t>(expert)) + 2 * kGamma));
  key = Mix(key ^ (static_cast<uint64_t>(static_cast<uint32_t>(tensor_id)) + 3 * kGamma));
  return key;
}

uint64_t At(uint64_t key, uint64_t index) { return Mix(key + (index + 1) * kGamma); }

// Irwin-Hall with n = 4 on 16-bit uniforms: mean 2, variance 1/3; rescaled to unit variance.
double ApproxNormal(uint64_t bits) {
  double sum = 0.0;
  for (int i = 0; i < 4; ++i) {
    sum += (static_cast<double>((bits >> (16 * i)) & 0xFFFF) + 0.5) * (1.0 / 65536.0);
  }
  return (sum - 2.0) * 1.7320508075688772;  // sqrt(3)
}

}  // namespace

void SyntheticWeightSource::Generate(const WeightMatrix& m, int layer, int expert,
                                     float* out) const {
  const uint64_t key = StreamKey(seed_, layer, expert, m.tensor_id);
  // The per-row factors come from a separate stream of the same key.
  const uint64_t row_key = Mix(key ^ 0x5851F42D4C957F2Dull);
  const double std_dev = 1.0 / std::sqrt(static_cast<double>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    const double u = static_cast<double>(At(row_key, r) >> 11) * 0x1p-53 * 2.0 - 1.0;
    const double row_scale = std_dev * std::exp2(u);
    const uint64_t base = static_cast<uint64_t>(r * m.cols);
    for (int64_t c = 0; c < m.cols; ++c) {
      out[r * m.cols + c] = static_cast<float>(ApproxNormal(At(key, base + c)) * row_scale);
    }
  }
}

Result<DenseExpertWeights> SyntheticWeightSource::LoadExpertDense(int layer, int expert) const {
  GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
  const WeightMatrix w1 = RoutedW1(spec_, layer);
  const WeightMatrix w2 = RoutedW2(spec_, layer);
  DenseExpertWeights dense;
  dense.w1.resize(w1.elements());
  dense.w2.resize(w2.elements());
  Generate(w1, layer, expert, dense.w1.data());
  Generate(w2, layer, expert, dense.w2.data());
  return dense;
}

Result<DenseExpertWeights> SyntheticWeightSource::LoadSharedDense(int layer) const {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
  if (!spec_.has_shared()) return FailedPrecondition("the model has no shared expert");
  const WeightMatrix w1 = SharedW1(spec_, layer);
  const WeightMatrix w2 = SharedW2(spec_, layer);
  DenseExpertWeights dense;
  dense.w1.resize(w1.elements());
  dense.w2.resize(w2.elements());
  Generate(w1, layer, 0, dense.w1.data());
  Generate(w2, layer, 0, dense.w2.data());
  return dense;
}

Result<ExpertWeights> SyntheticWeightSource::LoadExpert(int layer, int expert) const {
  GCMOE_ASSIGN_OR_RETURN(DenseExpertWeights dense, LoadExpertDense(layer, expert));
  return QuantizeExpert<ExpertWeights>(RoutedW1(spec_, layer), RoutedW2(spec_, layer), dense);
}

Result<SharedExpertWeights> SyntheticWeightSource::LoadShared(int layer) const {
  GCMOE_ASSIGN_OR_RETURN(DenseExpertWeights dense, LoadSharedDense(layer));
  return QuantizeExpert<SharedExpertWeights>(SharedW1(spec_, layer), SharedW2(spec_, layer),
                                             dense);
}

Status SyntheticWeightSource::CheckExperts(const std::vector<int>& layers,
                                           const std::vector<int>& experts) const {
  for (int layer : layers) {
    for (int expert : experts) GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
    GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
  }
  return Status::Ok();
}

}  // namespace gcmoe::engine
