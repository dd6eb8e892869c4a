// Internal: weights from a safetensors file (DESIGN.md §4's tensor table), memory-mapped.
//
// Each matrix comes in full precision (F32 or BF16, quantized at load) or pre-quantized
// (.blocks/.fp8 + .scales, U8). A file may hold both; then LoadExpert uses the pre-quantized
// tensors and LoadExpertDense the full-precision ones.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/safetensors_reader.h"
#include "engine/weight_layout.h"
#include "engine/weights.h"

namespace gcmoe::engine {

class FileWeightSource final : public WeightSource {
 public:
  // Maps the file and checks every tensor of every layer (presence, dtype, shape).
  static Result<std::unique_ptr<WeightSource>> Open(const ModelSpec& spec);

  const ModelSpec& spec() const override { return spec_; }
  std::string Describe() const override { return spec_.weights; }

  Result<ExpertWeights> LoadExpert(int layer, int expert) const override;
  Result<SharedExpertWeights> LoadShared(int layer) const override;
  Result<DenseExpertWeights> LoadExpertDense(int layer, int expert) const override;
  Result<DenseExpertWeights> LoadSharedDense(int layer) const override;
  Status CheckExperts(const std::vector<int>& layers,
                      const std::vector<int>& experts) const override;

 private:
  // Where one matrix lives in the file; absent forms are nullptr.
  struct MatrixTensors {
    WeightMatrix matrix;
    const SafetensorsTensor* dense = nullptr;   // F32 or BF16
    const SafetensorsTensor* codes = nullptr;   // U8 .blocks (E2M1) or .fp8 (E4M3)
    const SafetensorsTensor* scales = nullptr;  // U8 .scales (UE8M0)
  };
  enum Slot { kW1 = 0, kW2 = 1, kSharedW1 = 2, kSharedW2 = 3 };

  FileWeightSource(ModelSpec spec, std::unique_ptr<SafetensorsFile> file)
      : spec_(std::move(spec)), file_(std::move(file)) {}
  Status Resolve(const WeightMatrix& matrix, MatrixTensors* out) const;

  // One expert's [rows, cols] slice (expert 0 for the shared expert), values checked.
  Status ReadDense(const MatrixTensors& m, int expert, float* out) const;
  Status ReadQuantized(const MatrixTensors& m, int expert, uint8_t* codes, uint8_t* scales) const;
  template <typename Quantized>
  Result<Quantized> LoadQuantized(const MatrixTensors& w1, const MatrixTensors& w2,
                                  int expert) const;
  Result<DenseExpertWeights> LoadDense(const MatrixTensors& w1, const MatrixTensors& w2,
                                       int expert) const;
  // Value checks on the mapping: NaN/Inf in full-precision tensors; UE8M0 255 and E4M3 NaN
  // codes in pre-quantized ones. Errors name the tensor and the first bad index.
  Status CheckDenseValues(const MatrixTensors& m, int expert) const;
  Status CheckCodeValues(const MatrixTensors& m, int expert) const;
  // Checks the values LoadExpert/LoadShared would read, without converting them.
  Status CheckSlice(const MatrixTensors& m, int expert) const;
  uint64_t SliceBytes(const MatrixTensors& m) const;

  // The optional F32 biases of a layer (both or neither), copied into `b1` and `b2` for one
  // expert with their values checked.
  struct LayerBiases {
    const SafetensorsTensor* b1 = nullptr;  // [E, 2I]
    const SafetensorsTensor* b2 = nullptr;  // [E, H]
  };
  Status ResolveBiases(int layer, LayerBiases* out) const;
  Status ReadBiases(int layer, int expert, std::vector<float>* b1, std::vector<float>* b2) const;

  ModelSpec spec_;
  std::unique_ptr<SafetensorsFile> file_;
  std::vector<LayerBiases> biases_;                 // [layer]
  std::vector<std::vector<MatrixTensors>> layers_;  // [layer][Slot]
};

}  // namespace gcmoe::engine
