#include "engine/reference_layer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>

#include "engine/numerics.h"
#include "engine/weight_layout.h"

namespace gcmoe::engine {
namespace {

// One expert's matrices as exact floats: the dequantized weights (kQuantizationAware) or the
// full-precision ones (kUnquantized). w1: [2I, H], w2: [H, I].
struct ReferenceExpert {
  int inter = 0;
  std::vector<float> w1;
  std::vector<float> w2;
  std::vector<float> b1;  // [2I] or empty
  std::vector<float> b2;  // [H] or empty
};

using numerics::RoundToOdd;

double RoundToBF16(double d) { return numerics::RoundToBF16(RoundToOdd(d)); }

void DequantizeMatrix(const WeightMatrix& m, const std::vector<uint8_t>& codes,
                      const std::vector<uint8_t>& scales, std::vector<float>* out) {
  out->resize(m.elements());
  const int cols = static_cast<int>(m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    const uint8_t* c = codes.data() + r * m.code_bytes_per_row();
    const uint8_t* s = scales.data() + r * m.scale_bytes_per_row();
    float* o = out->data() + r * m.cols;
    if (m.routed) {
      numerics::DequantizeE2M1K32(c, s, cols, o);
    } else {
      numerics::DequantizeE4M3K32(c, s, cols, o);
    }
  }
}

template <typename Quantized>
ReferenceExpert Dequantized(const WeightMatrix& w1, const WeightMatrix& w2, const Quantized& q) {
  ReferenceExpert e;
  e.inter = static_cast<int>(w2.cols);
  DequantizeMatrix(w1, q.w1, q.w1_scales, &e.w1);
  DequantizeMatrix(w2, q.w2, q.w2_scales, &e.w2);
  return e;
}

Result<ReferenceExpert> LoadReferenceExpert(const WeightSource& weights, int layer, int expert,
                                            ReferenceMode mode) {
  const ModelSpec& spec = weights.spec();
  const bool shared = expert < 0;
  if (mode == ReferenceMode::kUnquantized) {
    Result<DenseExpertWeights> dense =
        shared ? weights.LoadSharedDense(layer) : weights.LoadExpertDense(layer, expert);
    if (!dense.ok()) return dense.status();
    return ReferenceExpert{shared ? spec.shared_intermediate : spec.intermediate,
                           std::move(dense->w1), std::move(dense->w2), std::move(dense->b1),
                           std::move(dense->b2)};
  }
  if (shared) {
    GCMOE_ASSIGN_OR_RETURN(SharedExpertWeights q, weights.LoadShared(layer));
    return Dequantized(SharedW1(spec, layer), SharedW2(spec, layer), q);
  }
  GCMOE_ASSIGN_OR_RETURN(ExpertWeights q, weights.LoadExpert(layer, expert));
  ReferenceExpert e = Dequantized(RoutedW1(spec, layer), RoutedW2(spec, layer), q);
  e.b1 = std::move(q.b1);
  e.b2 = std::move(q.b2);
  return e;
}

// Float64 dot product; four partial sums only to shorten the dependency chain (n is a multiple
// of 32). Float64 sums of these lengths are far more accurate than anything compared to them.
double Dot(const float* w, const double* x, int n) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  for (int k = 0; k < n; k += 4) {
    for (int l = 0; l < 4; ++l) acc[l] += static_cast<double>(w[k + l]) * x[k + l];
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// y += the expert's partial for activation x (DESIGN.md §4 steps 2-4, float64 arithmetic; with
// `quantized`, the BF16 and E4M3 rounding points of the spec).
void AddExpertPartial(const ModelSpec& spec, const ReferenceExpert& e, const double* x,
                      double weight, bool quantized, double* y) {
  const int hidden = spec.hidden;
  const int inter = e.inter;
  std::vector<double> a(2 * static_cast<size_t>(inter));
  for (int i = 0; i < 2 * inter; ++i) {
    double sum = Dot(e.w1.data() + static_cast<int64_t>(i) * hidden, x, hidden);
    if (!e.b1.empty()) sum += e.b1[i];
    a[i] = quantized ? RoundToBF16(sum) : sum;
  }
  std::vector<double> h(inter);
  for (int i = 0; i < inter; ++i) {
    double gate = a[i];
    double up = a[inter + i];
    if (spec.activation_clamp) {
      const double c = *spec.activation_clamp;
      gate = std::fmin(gate, c);
      up = std::fmax(std::fmin(up, c), -c);
    }
    const double sig = 1.0 / (1.0 + std::exp(-static_cast<double>(spec.activation_alpha) * gate));
    h[i] = gate * sig * (up + spec.activation_up_offset) * weight;
  }
  if (quantized) {
    std::vector<float> h_float(inter);
    for (int i = 0; i < inter; ++i) h_float[i] = RoundToOdd(h[i]);
    std::vector<uint8_t> codes(inter);
    std::vector<uint8_t> scales(inter / numerics::kBlock);
    numerics::QuantizeE4M3K32(h_float.data(), inter, codes.data(), scales.data());
    numerics::DequantizeE4M3K32(codes.data(), scales.data(), inter, h_float.data());
    for (int i = 0; i < inter; ++i) h[i] = h_float[i];
  }
  for (int j = 0; j < hidden; ++j) {
    double sum = Dot(e.w2.data() + static_cast<int64_t>(j) * inter, h.data(), inter);
    if (!e.b2.empty()) sum += weight * e.b2[j];
    y[j] += quantized ? RoundToBF16(sum) : sum;
  }
}

Status ValidateInput(const ModelSpec& spec, int layer, const ReferenceInput& input) {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec, layer));
  if (input.num_tokens < 0) return InvalidArgument("num_tokens is negative");
  if (input.num_tokens == 0) return Status::Ok();
  if (input.hidden == nullptr && input.hidden_fp8 == nullptr) {
    return InvalidArgument("reference input: neither hidden nor hidden_fp8 is set");
  }
  if (input.hidden_fp8 != nullptr && input.hidden_scales == nullptr) {
    return InvalidArgument("reference input: hidden_fp8 needs hidden_scales");
  }
  if (input.topk_ids == nullptr || input.topk_weights == nullptr) {
    return InvalidArgument("reference input: topk_ids and topk_weights are required");
  }
  for (int64_t i = 0; i < static_cast<int64_t>(input.num_tokens) * spec.top_k; ++i) {
    const int32_t id = input.topk_ids[i];
    if (id < -1 || id >= spec.num_experts) {
      return InvalidArgument("topk_ids[" + std::to_string(i / spec.top_k) + "][" +
                             std::to_string(i % spec.top_k) + "] is " + std::to_string(id) +
                             ", expected -1 or 0.." + std::to_string(spec.num_experts - 1));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<double>> ReferenceLayer(const WeightSource& weights, int layer,
                                           const ReferenceInput& input, ReferenceMode mode) {
  const ModelSpec& spec = weights.spec();
  GCMOE_RETURN_IF_ERROR(ValidateInput(spec, layer, input));
  const bool quantized = mode == ReferenceMode::kQuantizationAware;
  const int hidden = spec.hidden;
  const int k = spec.top_k;

  // Each expert the tokens use, loaded once; key -1 is the shared expert.
  std::map<int, ReferenceExpert> experts;
  for (int64_t i = 0; i < static_cast<int64_t>(input.num_tokens) * k; ++i) {
    const int id = input.topk_ids[i];
    if (id < 0 || experts.contains(id)) continue;
    GCMOE_ASSIGN_OR_RETURN(experts[id], LoadReferenceExpert(weights, layer, id, mode));
  }
  if (spec.has_shared() && input.num_tokens > 0) {
    GCMOE_ASSIGN_OR_RETURN(experts[-1], LoadReferenceExpert(weights, layer, -1, mode));
  }

  std::vector<double> y(static_cast<size_t>(input.num_tokens) * hidden, 0.0);
  std::vector<float> x_float(hidden);
  std::vector<uint8_t> codes(hidden);
  std::vector<uint8_t> scales(hidden / numerics::kBlock);
  std::vector<double> x(hidden);
  for (int t = 0; t < input.num_tokens; ++t) {
    const int64_t row = static_cast<int64_t>(t) * hidden;
    // Step 1: the activation as the experts see it.
    if (input.hidden_fp8 != nullptr && (quantized || input.hidden == nullptr)) {
      numerics::DequantizeE4M3K32(input.hidden_fp8 + row,
                                  input.hidden_scales + row / numerics::kBlock, hidden,
                                  x_float.data());
    } else if (quantized) {
      numerics::QuantizeE4M3K32(input.hidden + row, hidden, codes.data(), scales.data());
      numerics::DequantizeE4M3K32(codes.data(), scales.data(), hidden, x_float.data());
    } else {
      std::copy(input.hidden + row, input.hidden + row + hidden, x_float.begin());
    }
    for (int i = 0; i < hidden; ++i) x[i] = x_float[i];

    // Step 5: partials in slot order, then the shared expert's.
    double* y_t = y.data() + row;
    for (int s = 0; s < k; ++s) {
      const int id = input.topk_ids[t * k + s];
      if (id < 0) continue;
      AddExpertPartial(spec, experts.at(id), x.data(), input.topk_weights[t * k + s], quantized,
                       y_t);
    }
    if (spec.has_shared()) AddExpertPartial(spec, experts.at(-1), x.data(), 1.0, quantized, y_t);
  }
  return y;
}

}  // namespace gcmoe::engine
