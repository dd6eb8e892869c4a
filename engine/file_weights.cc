#include "engine/file_weights.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <set>

#include "engine/numerics.h"

namespace gcmoe::engine {
namespace {

constexpr uint64_t kProgressMinBytes = 256ull << 20;  // smaller checks finish too fast to log
constexpr auto kProgressInterval = std::chrono::seconds(2);

// Index of the first NaN or Inf among `count` F32 or BF16 values at `p`, or -1; `what` gets
// "NaN" or "Inf".
int64_t FirstNonFinite(const std::string& dtype, const uint8_t* p, int64_t count,
                       const char** what) {
  const bool f32 = dtype == "F32";
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits = 0;
    if (f32) {
      std::memcpy(&bits, p + 4 * i, 4);
    } else {
      uint16_t half = 0;
      std::memcpy(&half, p + 2 * i, 2);
      bits = static_cast<uint32_t>(half) << 16;
    }
    if ((bits & 0x7F800000u) == 0x7F800000u) {
      *what = (bits & 0x7FFFFFu) != 0 ? "NaN" : "Inf";
      return i;
    }
  }
  return -1;
}

// UE8M0 code 255 is NaN; E4M3 codes S.1111.111 are NaN. E2M1 codes are all values.
int64_t FirstBadCode(const uint8_t* p, int64_t count, bool scales) {
  for (int64_t i = 0; i < count; ++i) {
    if (scales ? p[i] == 255 : (p[i] & 0x7F) == 0x7F) return i;
  }
  return -1;
}

// Logs the progress of a long check, every 10 % or every 2 s, only for large reads.
class CheckProgress {
 public:
  CheckProgress(std::string what, uint64_t total_bytes)
      : what_(std::move(what)),
        total_(total_bytes),
        enabled_(total_bytes > kProgressMinBytes),
        last_(std::chrono::steady_clock::now()) {
    if (enabled_) spdlog::info("checking {}: {} MiB to read", what_, total_ >> 20);
  }

  void Add(uint64_t bytes) {
    done_ += bytes;
    if (!enabled_) return;
    const int percent = static_cast<int>(done_ * 100 / total_);
    const auto now = std::chrono::steady_clock::now();
    if (percent >= next_percent_ || now - last_ >= kProgressInterval) {
      spdlog::info("checking {}: {}% ({} of {} MiB)", what_, percent, done_ >> 20, total_ >> 20);
      next_percent_ = (percent / 10 + 1) * 10;
      last_ = now;
    }
  }

 private:
  std::string what_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  int next_percent_ = 10;
  std::chrono::steady_clock::time_point last_;
};

size_t DenseElementBytes(const SafetensorsTensor& t) { return t.dtype == "F32" ? 4 : 2; }

}  // namespace

Result<std::unique_ptr<WeightSource>> FileWeightSource::Open(const ModelSpec& spec) {
  GCMOE_RETURN_IF_ERROR(spec.Validate());
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                         SafetensorsFile::Open(spec.weights));
  std::unique_ptr<FileWeightSource> source(new FileWeightSource(spec, std::move(file)));
  std::set<std::string> used;
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    std::vector<MatrixTensors> matrices;
    for (const WeightMatrix& matrix : LayerMatrices(spec, layer)) {
      MatrixTensors m;
      Status status = source->Resolve(matrix, &m);
      if (!status.ok()) return status.WithContext(spec.weights);
      used.insert({matrix.name, matrix.codes_name(), matrix.scales_name()});
      matrices.push_back(m);
    }
    source->layers_.push_back(std::move(matrices));
    LayerBiases biases;
    Status status = source->ResolveBiases(layer, &biases);
    if (!status.ok()) return status.WithContext(spec.weights);
    used.insert({RoutedB1Name(layer), RoutedB2Name(layer)});
    source->biases_.push_back(biases);
  }
  // Extra tensors are allowed (a file may serve several model shapes) but worth a warning: a
  // shared expert or a layer in the file that the config leaves out is often a config mistake.
  int unused = 0;
  std::string example;
  for (const auto& [name, tensor] : source->file_->tensors()) {
    if (!used.contains(name) && unused++ == 0) example = name;
  }
  if (unused > 0) {
    spdlog::warn("{}: {} tensor(s) not used by the model (e.g. {})", spec.weights, unused, example);
  }
  return std::unique_ptr<WeightSource>(std::move(source));
}

Status FileWeightSource::Resolve(const WeightMatrix& matrix, MatrixTensors* out) const {
  const int experts = spec_.num_experts;
  out->matrix = matrix;
  out->dense = file_->Find(matrix.name);
  out->codes = file_->Find(matrix.codes_name());
  out->scales = file_->Find(matrix.scales_name());
  auto check_shape = [](const SafetensorsTensor& t, const std::vector<int64_t>& expected) {
    if (t.shape == expected) return Status::Ok();
    return InvalidArgument(t.name + ": shape " + ShapeString(t.shape) + ", expected " +
                           ShapeString(expected));
  };
  auto check_u8 = [](const SafetensorsTensor& t) {
    if (t.dtype == "U8") return Status::Ok();
    return InvalidArgument(t.name + ": dtype " + t.dtype + ", expected U8");
  };
  if (out->dense == nullptr && out->codes == nullptr && out->scales == nullptr) {
    return InvalidArgument(matrix.name + ": missing (expected F32 or BF16 " +
                           ShapeString(matrix.dense_shape(experts)) + ", or " +
                           matrix.codes_name() + " U8 " + ShapeString(matrix.codes_shape(experts)) +
                           " + " + matrix.scales_name() + " U8 " +
                           ShapeString(matrix.scales_shape(experts)) + ")");
  }
  if (out->dense != nullptr) {
    if (out->dense->dtype != "F32" && out->dense->dtype != "BF16") {
      return InvalidArgument(matrix.name + ": dtype " + out->dense->dtype +
                             ", expected F32 or BF16");
    }
    GCMOE_RETURN_IF_ERROR(check_shape(*out->dense, matrix.dense_shape(experts)));
  }
  if (out->codes != nullptr || out->scales != nullptr) {
    if (out->codes == nullptr) {
      return InvalidArgument(matrix.codes_name() + ": missing (" + matrix.scales_name() +
                             " is present)");
    }
    if (out->scales == nullptr) {
      return InvalidArgument(matrix.scales_name() + ": missing (" + matrix.codes_name() +
                             " is present)");
    }
    GCMOE_RETURN_IF_ERROR(check_u8(*out->codes));
    GCMOE_RETURN_IF_ERROR(check_u8(*out->scales));
    GCMOE_RETURN_IF_ERROR(check_shape(*out->codes, matrix.codes_shape(experts)));
    GCMOE_RETURN_IF_ERROR(check_shape(*out->scales, matrix.scales_shape(experts)));
  }
  return Status::Ok();
}

Status FileWeightSource::ResolveBiases(int layer, LayerBiases* out) const {
  const std::string names[2] = {RoutedB1Name(layer), RoutedB2Name(layer)};
  const SafetensorsTensor* found[2] = {file_->Find(names[0]), file_->Find(names[1])};
  if ((found[0] == nullptr) != (found[1] == nullptr)) {
    const int missing = found[0] == nullptr ? 0 : 1;
    return InvalidArgument(names[missing] + ": missing (" + names[1 - missing] +
                           " is present; expert biases come in pairs)");
  }
  if (found[0] == nullptr) return Status::Ok();
  const int64_t columns[2] = {2 * int64_t{spec_.intermediate}, spec_.hidden};
  for (int i = 0; i < 2; ++i) {
    const std::vector<int64_t> expected = {spec_.num_experts, columns[i]};
    if (found[i]->dtype != "F32") {
      return InvalidArgument(names[i] + ": dtype " + found[i]->dtype + ", expected F32");
    }
    if (found[i]->shape != expected) {
      return InvalidArgument(names[i] + ": shape " + ShapeString(found[i]->shape) + ", expected " +
                             ShapeString(expected));
    }
  }
  out->b1 = found[0];
  out->b2 = found[1];
  return Status::Ok();
}

Status FileWeightSource::ReadBiases(int layer, int expert, std::vector<float>* b1,
                                    std::vector<float>* b2) const {
  const LayerBiases& biases = biases_[layer];
  if (biases.b1 == nullptr) return Status::Ok();
  for (auto [tensor, out] : {std::pair{biases.b1, b1}, std::pair{biases.b2, b2}}) {
    const int64_t count = tensor->shape[1];
    const uint8_t* p = file_->data(*tensor) + expert * count * 4;
    const char* what = "";
    const int64_t bad = FirstNonFinite("F32", p, count, &what);
    if (bad >= 0) {
      return DataLoss(tensor->name + ": value at index " +
                      IndexString(tensor->shape, expert * count + bad) + " is " + what);
    }
    out->resize(count);
    std::memcpy(out->data(), p, count * 4);
  }
  return Status::Ok();
}

Status FileWeightSource::CheckDenseValues(const MatrixTensors& m, int expert) const {
  const int64_t count = m.matrix.elements();
  const int64_t first = m.matrix.routed ? expert * count : 0;
  const uint8_t* p = file_->data(*m.dense) + first * DenseElementBytes(*m.dense);
  const char* what = "";
  const int64_t bad = FirstNonFinite(m.dense->dtype, p, count, &what);
  if (bad >= 0) {
    return DataLoss(m.matrix.name + ": value at index " + IndexString(m.dense->shape, first + bad) +
                    " is " + what);
  }
  return Status::Ok();
}

Status FileWeightSource::CheckCodeValues(const MatrixTensors& m, int expert) const {
  const WeightMatrix& w = m.matrix;
  const int64_t code_bytes = w.rows * w.code_bytes_per_row();
  const int64_t scale_bytes = w.rows * w.scale_bytes_per_row();
  const int64_t code_first = w.routed ? expert * code_bytes : 0;
  const int64_t scale_first = w.routed ? expert * scale_bytes : 0;
  if (!w.routed) {
    const int64_t bad = FirstBadCode(file_->data(*m.codes) + code_first, code_bytes, false);
    if (bad >= 0) {
      return DataLoss(m.codes->name + ": E4M3 NaN code at index " +
                      IndexString(m.codes->shape, code_first + bad));
    }
  }
  const int64_t bad = FirstBadCode(file_->data(*m.scales) + scale_first, scale_bytes, true);
  if (bad >= 0) {
    return DataLoss(m.scales->name + ": UE8M0 code 255 (NaN) at index " +
                    IndexString(m.scales->shape, scale_first + bad));
  }
  return Status::Ok();
}

Status FileWeightSource::ReadDense(const MatrixTensors& m, int expert, float* out) const {
  if (m.dense == nullptr) {
    return NotFound(m.matrix.name + ": the file holds only the pre-quantized form (" +
                    m.matrix.codes_name() + " + " + m.matrix.scales_name() +
                    "), no full-precision weights");
  }
  GCMOE_RETURN_IF_ERROR(CheckDenseValues(m, expert));
  const int64_t count = m.matrix.elements();
  const int64_t first = m.matrix.routed ? expert * count : 0;
  const uint8_t* p = file_->data(*m.dense) + first * DenseElementBytes(*m.dense);
  if (m.dense->dtype == "F32") {
    std::memcpy(out, p, count * 4);
  } else {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t bits = 0;
      std::memcpy(&bits, p + 2 * i, 2);
      out[i] = numerics::BF16ToFloat(bits);
    }
  }
  return Status::Ok();
}

Status FileWeightSource::ReadQuantized(const MatrixTensors& m, int expert, uint8_t* codes,
                                       uint8_t* scales) const {
  const WeightMatrix& w = m.matrix;
  if (m.codes == nullptr) {
    std::vector<float> dense(w.elements());
    GCMOE_RETURN_IF_ERROR(ReadDense(m, expert, dense.data()));
    QuantizeMatrix(w, dense.data(), codes, scales);
    return Status::Ok();
  }
  GCMOE_RETURN_IF_ERROR(CheckCodeValues(m, expert));
  const int64_t code_bytes = w.rows * w.code_bytes_per_row();
  const int64_t scale_bytes = w.rows * w.scale_bytes_per_row();
  std::memcpy(codes, file_->data(*m.codes) + (w.routed ? expert * code_bytes : 0), code_bytes);
  std::memcpy(scales, file_->data(*m.scales) + (w.routed ? expert * scale_bytes : 0), scale_bytes);
  return Status::Ok();
}

template <typename Quantized>
Result<Quantized> FileWeightSource::LoadQuantized(const MatrixTensors& w1, const MatrixTensors& w2,
                                                  int expert) const {
  Quantized q;
  ResizeQuantized(w1.matrix, w2.matrix, &q);
  GCMOE_RETURN_IF_ERROR(ReadQuantized(w1, expert, q.w1.data(), q.w1_scales.data()));
  GCMOE_RETURN_IF_ERROR(ReadQuantized(w2, expert, q.w2.data(), q.w2_scales.data()));
  return q;
}

Result<DenseExpertWeights> FileWeightSource::LoadDense(const MatrixTensors& w1,
                                                       const MatrixTensors& w2, int expert) const {
  DenseExpertWeights dense;
  dense.w1.resize(w1.matrix.elements());
  dense.w2.resize(w2.matrix.elements());
  GCMOE_RETURN_IF_ERROR(ReadDense(w1, expert, dense.w1.data()));
  GCMOE_RETURN_IF_ERROR(ReadDense(w2, expert, dense.w2.data()));
  return dense;
}

Result<ExpertWeights> FileWeightSource::LoadExpert(int layer, int expert) const {
  GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
  const auto& matrices = layers_[layer];
  GCMOE_ASSIGN_OR_RETURN(ExpertWeights w,
                         LoadQuantized<ExpertWeights>(matrices[kW1], matrices[kW2], expert));
  GCMOE_RETURN_IF_ERROR(ReadBiases(layer, expert, &w.b1, &w.b2));
  return w;
}

Result<SharedExpertWeights> FileWeightSource::LoadShared(int layer) const {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
  if (!spec_.has_shared()) return FailedPrecondition("the model has no shared expert");
  const auto& matrices = layers_[layer];
  return LoadQuantized<SharedExpertWeights>(matrices[kSharedW1], matrices[kSharedW2], 0);
}

Result<DenseExpertWeights> FileWeightSource::LoadExpertDense(int layer, int expert) const {
  GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
  const auto& matrices = layers_[layer];
  GCMOE_ASSIGN_OR_RETURN(DenseExpertWeights d, LoadDense(matrices[kW1], matrices[kW2], expert));
  GCMOE_RETURN_IF_ERROR(ReadBiases(layer, expert, &d.b1, &d.b2));
  return d;
}

Result<DenseExpertWeights> FileWeightSource::LoadSharedDense(int layer) const {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
  if (!spec_.has_shared()) return FailedPrecondition("the model has no shared expert");
  const auto& matrices = layers_[layer];
  return LoadDense(matrices[kSharedW1], matrices[kSharedW2], 0);
}

uint64_t FileWeightSource::SliceBytes(const MatrixTensors& m) const {
  const WeightMatrix& w = m.matrix;
  if (m.codes != nullptr) {
    return static_cast<uint64_t>(w.rows * (w.code_bytes_per_row() + w.scale_bytes_per_row()));
  }
  return static_cast<uint64_t>(w.elements()) * DenseElementBytes(*m.dense);
}

Status FileWeightSource::CheckSlice(const MatrixTensors& m, int expert) const {
  // The path LoadExpert/LoadShared take: pre-quantized tensors when present.
  return m.codes != nullptr ? CheckCodeValues(m, expert) : CheckDenseValues(m, expert);
}

Status FileWeightSource::CheckExperts(const std::vector<int>& layers,
                                      const std::vector<int>& experts) const {
  uint64_t total = 0;
  for (int layer : layers) {
    GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
    for (int expert : experts) GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
    for (const MatrixTensors& m : layers_[layer]) {
      total += SliceBytes(m) * (m.matrix.routed ? experts.size() : 1);
    }
  }
  CheckProgress progress(spec_.weights, total);
  for (int layer : layers) {
    std::vector<float> b1, b2;
    for (int expert : experts) GCMOE_RETURN_IF_ERROR(ReadBiases(layer, expert, &b1, &b2));
    for (const MatrixTensors& m : layers_[layer]) {
      if (!m.matrix.routed) {
        GCMOE_RETURN_IF_ERROR(CheckSlice(m, 0));
        progress.Add(SliceBytes(m));
        continue;
      }
      for (int expert : experts) {
        GCMOE_RETURN_IF_ERROR(CheckSlice(m, expert));
        progress.Add(SliceBytes(m));
      }
    }
  }
  return Status::Ok();
}

}  // namespace gcmoe::engine
