// Internal: the weight matrices of one layer, their tensor names, shapes and quantized forms
// (DESIGN.md §4's table), shared by the synthetic source, the file source and the file writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model_spec.h"
#include "engine/weights.h"

namespace gcmoe::engine {

// One weight matrix of a layer. Routed matrices carry a leading [E] dimension in files and are
// E2M1 when quantized; the shared expert's are E4M3. Contraction (block scaling) runs along cols.
struct WeightMatrix {
  std::string name;  // "layers.0.experts.w1"
  bool routed = true;
  int64_t rows = 0;  // per expert
  int64_t cols = 0;
  // Identifies the matrix inside a synthetic stream: 0 w1, 1 w2 (routed); 2 w1, 3 w2 (shared).
  int tensor_id = 0;

  int64_t elements() const { return rows * cols; }
  // Bytes of one expert's quantized codes: E2M1 packs two per byte, E4M3 one.
  int64_t code_bytes_per_row() const { return routed ? cols / 2 : cols; }
  int64_t scale_bytes_per_row() const { return cols / 32; }

  // Full-precision tensor: [E, rows, cols] or [rows, cols].
  std::vector<int64_t> dense_shape(int num_experts) const;
  // Pre-quantized tensors: name + ".blocks" (routed) or ".fp8" (shared), and name + ".scales".
  std::string codes_name() const { return name + (routed ? ".blocks" : ".fp8"); }
  std::string scales_name() const { return name + ".scales"; }
  std::vector<int64_t> codes_shape(int num_experts) const;
  std::vector<int64_t> scales_shape(int num_experts) const;
};

// The matrices of one layer in file order: experts.w1, experts.w2, then shared.w1, shared.w2
// when the model has a shared expert.
std::vector<WeightMatrix> LayerMatrices(const ModelSpec& spec, int layer);
WeightMatrix RoutedW1(const ModelSpec& spec, int layer);
WeightMatrix RoutedW2(const ModelSpec& spec, int layer);
WeightMatrix SharedW1(const ModelSpec& spec, int layer);
WeightMatrix SharedW2(const ModelSpec& spec, int layer);

// Optional F32 expert biases of a layer (gpt-oss): b1 [E, 2I] (gate then up, as w1's rows) and
// b2 [E, H]; both or neither.
std::string RoutedB1Name(int layer);
std::string RoutedB2Name(int layer);

// Quantizes a [rows, cols] matrix row by row into the matrix's format (E2M1 or E4M3, K32).
void QuantizeMatrix(const WeightMatrix& m, const float* dense, uint8_t* codes, uint8_t* scales);

// InvalidArgument unless 0 <= layer < layers (and 0 <= expert < E for routed experts).
Status CheckLayerIndex(const ModelSpec& spec, int layer);
Status CheckExpertIndex(const ModelSpec& spec, int layer, int expert);

// Sizes the four vectors of an ExpertWeights or SharedExpertWeights (same field names) for the
// expert's matrices w1 and w2.
template <typename Quantized>
void ResizeQuantized(const WeightMatrix& w1, const WeightMatrix& w2, Quantized* q) {
  q->w1.resize(w1.rows * w1.code_bytes_per_row());
  q->w1_scales.resize(w1.rows * w1.scale_bytes_per_row());
  q->w2.resize(w2.rows * w2.code_bytes_per_row());
  q->w2_scales.resize(w2.rows * w2.scale_bytes_per_row());
}

// Quantizes an expert's full-precision weights into the format of its matrices.
template <typename Quantized>
Quantized QuantizeExpert(const WeightMatrix& w1, const WeightMatrix& w2,
                         const DenseExpertWeights& dense) {
  Quantized q;
  ResizeQuantized(w1, w2, &q);
  QuantizeMatrix(w1, dense.w1.data(), q.w1.data(), q.w1_scales.data());
  QuantizeMatrix(w2, dense.w2.data(), q.w2.data(), q.w2_scales.data());
  return q;
}

// "[16,256,64]"
std::string ShapeString(const std::vector<int64_t>& shape);
// The multi-dimensional index of flat element `flat` in `shape`: "[3,17,5]".
std::string IndexString(const std::vector<int64_t>& shape, int64_t flat);

}  // namespace gcmoe::engine
