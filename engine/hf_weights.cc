#include "engine/hf_weights.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "engine/load_progress.h"
#include "engine/numerics.h"
#include "engine/weight_layout.h"

namespace gcmoe::engine {
namespace {

constexpr int64_t kFp8Block = 128;

std::string Num(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

// The model.* value the config asked for against the checkpoint's, naming both.
Status Agree(const HfCheckpoint& c, const std::string& field, double configured,
             double checkpoint) {
  if (configured == checkpoint) return Status::Ok();
  const auto key = c.source_keys.find(field);
  return InvalidArgument("model." + field + " is " + Num(configured) + " but " + c.config_path() +
                         " says " + (key == c.source_keys.end() ? field : key->second) + " " +
                         Num(checkpoint));
}

Status AgreeWithSpec(const ModelSpec& s, const HfCheckpoint& c) {
  GCMOE_RETURN_IF_ERROR(Agree(c, "hidden", s.hidden, c.hidden));
  GCMOE_RETURN_IF_ERROR(Agree(c, "intermediate", s.intermediate, c.intermediate));
  GCMOE_RETURN_IF_ERROR(Agree(c, "experts", s.num_experts, c.experts));
  GCMOE_RETURN_IF_ERROR(Agree(c, "top_k", s.top_k, c.top_k));
  GCMOE_RETURN_IF_ERROR(Agree(c, "layers", s.num_layers, c.moe_layer_ids.size()));
  GCMOE_RETURN_IF_ERROR(
      Agree(c, "shared_intermediate", s.shared_intermediate, c.shared_intermediate));
  GCMOE_RETURN_IF_ERROR(Agree(c, "activation.alpha", s.activation_alpha, c.activation_alpha));
  GCMOE_RETURN_IF_ERROR(Agree(c, "activation.clamp", s.activation_clamp.value_or(0.0f),
                              c.activation_clamp.value_or(0.0f)));
  return Agree(c, "activation.up_offset", s.activation_up_offset, c.activation_up_offset);
}

// Partial sums of calc_diff (DESIGN.md §4) over many matrices.
struct DiffSums {
  double cross = 0.0;
  double squares = 0.0;
  void Add(const float* x, const float* y, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      cross += static_cast<double>(x[i]) * y[i];
      squares += static_cast<double>(x[i]) * x[i] + static_cast<double>(y[i]) * y[i];
    }
  }
  double value() const { return squares == 0.0 ? 0.0 : 1.0 - 2.0 * cross / squares; }
};

void Dequantize(const WeightMatrix& m, const std::vector<uint8_t>& codes,
                const std::vector<uint8_t>& scales, std::vector<float>* out) {
  out->resize(m.elements());
  for (int64_t r = 0; r < m.rows; ++r) {
    const uint8_t* c = codes.data() + r * m.code_bytes_per_row();
    const uint8_t* s = scales.data() + r * m.scale_bytes_per_row();
    if (m.routed) {
      numerics::DequantizeE2M1K32(c, s, static_cast<int>(m.cols), out->data() + r * m.cols);
    } else {
      numerics::DequantizeE4M3K32(c, s, static_cast<int>(m.cols), out->data() + r * m.cols);
    }
  }
}

float ReadBF16(const uint8_t* p, int64_t i) {
  uint16_t bits = 0;
  std::memcpy(&bits, p + 2 * i, 2);
  return numerics::BF16ToFloat(bits);
}

}  // namespace

Result<std::unique_ptr<WeightSource>> HfWeightSource::Open(const ModelSpec& spec) {
  GCMOE_RETURN_IF_ERROR(spec.Validate());
  const std::optional<std::string> dir = HfCheckpointDir(spec.weights);
  if (!dir) return InvalidArgument("model.weights: \"" + spec.weights + "\" is not hf:DIR");
  GCMOE_ASSIGN_OR_RETURN(HfCheckpoint checkpoint, ReadHfCheckpoint(*dir));
  GCMOE_RETURN_IF_ERROR(AgreeWithSpec(spec, checkpoint));
  ModelSpec served = spec;
  served.moe_layer_ids = checkpoint.moe_layer_ids;
  std::unique_ptr<HfWeightSource> source(new HfWeightSource(served, std::move(checkpoint)));
  GCMOE_RETURN_IF_ERROR(source->OpenShards());
  const HfCheckpoint& c = source->ckpt_;
  for (int layer = 0; layer < static_cast<int>(c.moe_layer_ids.size()); ++layer) {
    for (const HfTensorSpec& t : c.LayerTensors(layer)) GCMOE_RETURN_IF_ERROR(source->Locate(t));
  }
  spdlog::info("{}: {} checkpoint ({}), {} MoE layer(s) of {}: H={} I={} E={} top-{}{}",
               spec.weights, HfFamilyName(c.family), c.model_type, c.moe_layer_ids.size(),
               c.model_layers, c.hidden, c.intermediate, c.experts, c.top_k,
               c.shared_intermediate > 0 ? ", shared I_s=" + std::to_string(c.shared_intermediate)
                                         : std::string());
  return std::unique_ptr<WeightSource>(std::move(source));
}

Status HfWeightSource::OpenShards() {
  if (!ckpt_.sharded()) {
    const std::string path = ckpt_.dir + "/model.safetensors";
    if (!std::ifstream(path).good()) {
      return NotFound(ckpt_.dir + ": neither model.safetensors.index.json nor model.safetensors " +
                      "(a checkpoint directory holds one of them)");
    }
  }
  for (const std::string& shard : ckpt_.ShardFiles()) {
    const std::string path = ckpt_.dir + "/" + shard;
    Result<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      if (!ckpt_.sharded()) return file.status();
      std::string example;
      for (const auto& [tensor, name] : ckpt_.weight_map) {
        if (name == shard) {
          example = tensor;
          break;
        }
      }
      return file.status().WithContext(ckpt_.index_path() + " names " + shard + " (e.g. for " +
                                       example + ")");
    }
    files_[shard] = std::move(file).value();
  }
  return Status::Ok();
}

std::string HfWeightSource::Where(const std::string& name) const {
  const std::string shard = ckpt_.ShardOf(name);
  return ckpt_.dir + "/" + (shard.empty() ? "?" : shard) + ": " + name;
}

Status HfWeightSource::Locate(const HfTensorSpec& expected) {
  const std::string shard = ckpt_.ShardOf(expected.name);
  if (shard.empty()) {
    return InvalidArgument(ckpt_.index_path() + ": " + expected.name + ": missing (" +
                           expected.dtype + " " + ShapeString(expected.shape) +
                           " expected; the index names no file for it)");
  }
  const SafetensorsFile& file = *files_.at(shard);
  const SafetensorsTensor* tensor = file.Find(expected.name);
  if (tensor == nullptr) {
    return InvalidArgument(Where(expected.name) + ": missing (expected " + expected.dtype + " " +
                           ShapeString(expected.shape) + ")");
  }
  if (tensor->dtype != expected.dtype) {
    return InvalidArgument(Where(expected.name) + ": dtype " + tensor->dtype + ", expected " +
                           expected.dtype);
  }
  if (tensor->shape != expected.shape) {
    return InvalidArgument(Where(expected.name) + ": shape " + ShapeString(tensor->shape) +
                           ", expected " + ShapeString(expected.shape));
  }
  located_[expected.name] = {&file, tensor};
  return Status::Ok();
}

Status HfWeightSource::ReadMatrix(const std::string& name, int64_t rows, int64_t cols,
                                  float* out) const {
  const Located& w = At(name);
  const uint8_t* p = w.file->data(*w.tensor);
  const int64_t count = rows * cols;
  if (!ckpt_.fp8_blocks) {
    for (int64_t i = 0; i < count; ++i) {
      out[i] = ReadBF16(p, i);
      if (!std::isfinite(out[i])) {
        return DataLoss(Where(name) + ": value at index " + IndexString(w.tensor->shape, i) +
                        " is " + (std::isnan(out[i]) ? "NaN" : "Inf"));
      }
    }
    w.file->DropPages(*w.tensor, 0, w.tensor->bytes());
    return Status::Ok();
  }
  // FP8 with a scale per 128x128 block: the product of an E4M3 value (4 significant bits) and
  // an F32 scale (24) is exact in float64; one round-to-odd step keeps it exact for the MXFP4
  // and E4M3 quantizers that follow.
  const Located& s = At(name + "_scale_inv");
  const uint8_t* sp = s.file->data(*s.tensor);
  const int64_t scale_cols = s.tensor->shape[1];
  for (int64_t i = 0; i < s.tensor->shape[0] * scale_cols; ++i) {
    float scale = 0.0f;
    std::memcpy(&scale, sp + 4 * i, 4);
    if (!std::isfinite(scale)) {
      return DataLoss(Where(name + "_scale_inv") + ": value at index " +
                      IndexString(s.tensor->shape, i) + " is not finite");
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const uint8_t code = p[r * cols + col];
      if ((code & 0x7F) == 0x7F) {
        return DataLoss(Where(name) + ": E4M3 NaN code at index " +
                        IndexString(w.tensor->shape, r * cols + col));
      }
      float scale = 0.0f;
      std::memcpy(&scale, sp + 4 * ((r / kFp8Block) * scale_cols + col / kFp8Block), 4);
      out[r * cols + col] = numerics::RoundToOdd(static_cast<double>(numerics::DecodeE4M3(code)) *
                                                 static_cast<double>(scale));
    }
  }
  w.file->DropPages(*w.tensor, 0, w.tensor->bytes());
  return Status::Ok();
}

Result<DenseExpertWeights> HfWeightSource::LoadPerExpertDense(int layer, int expert,
                                                              int inter) const {
  const int64_t H = spec_.hidden;
  DenseExpertWeights d;
  d.w1.resize(2 * inter * H);
  d.w2.resize(H * inter);
  // Our W1 is gate rows then up rows (DESIGN.md §4).
  GCMOE_RETURN_IF_ERROR(
      ReadMatrix(ckpt_.ExpertTensor(layer, expert, "gate"), inter, H, d.w1.data()));
  GCMOE_RETURN_IF_ERROR(
      ReadMatrix(ckpt_.ExpertTensor(layer, expert, "up"), inter, H, d.w1.data() + inter * H));
  GCMOE_RETURN_IF_ERROR(
      ReadMatrix(ckpt_.ExpertTensor(layer, expert, "down"), H, inter, d.w2.data()));
  return d;
}

Result<ExpertWeights> HfWeightSource::LoadGptOss(int layer, int expert) const {
  const int64_t H = spec_.hidden, I = spec_.intermediate;
  ExpertWeights w;
  ResizeQuantized(RoutedW1(spec_, layer), RoutedW2(spec_, layer), &w);
  w.b1.resize(2 * I);
  w.b2.resize(H);
  // Checks the UE8M0 scales of rows [row0, row0 + rows) of expert `expert` (255 is NaN).
  auto check_scales = [&](const std::string& name, int64_t rows, int64_t row_bytes) -> Status {
    const Located& s = At(name);
    const int64_t first = expert * rows * row_bytes;
    const uint8_t* p = s.file->data(*s.tensor) + first;
    for (int64_t i = 0; i < rows * row_bytes; ++i) {
      if (p[i] == 255) {
        return DataLoss(Where(name) + ": UE8M0 code 255 (NaN) at index " +
                        IndexString(s.tensor->shape, first + i));
      }
    }
    return Status::Ok();
  };
  auto read_bias = [&](const std::string& name, int64_t n, float* out) -> Status {
    const Located& b = At(name);
    const uint8_t* p = b.file->data(*b.tensor);
    for (int64_t i = 0; i < n; ++i) {
      out[i] = ReadBF16(p, expert * n + i);
      if (!std::isfinite(out[i])) {
        return DataLoss(Where(name) + ": value at index " +
                        IndexString(b.tensor->shape, expert * n + i) + " is not finite");
      }
    }
    return Status::Ok();
  };
  const std::string gu_blocks = ckpt_.FusedTensor(layer, "gate_up_proj_blocks");
  const std::string gu_scales = ckpt_.FusedTensor(layer, "gate_up_proj_scales");
  const std::string d_blocks = ckpt_.FusedTensor(layer, "down_proj_blocks");
  const std::string d_scales = ckpt_.FusedTensor(layer, "down_proj_scales");
  GCMOE_RETURN_IF_ERROR(check_scales(gu_scales, 2 * I, H / 32));
  GCMOE_RETURN_IF_ERROR(check_scales(d_scales, H, I / 32));
  std::vector<float> b1(2 * I);
  GCMOE_RETURN_IF_ERROR(read_bias(ckpt_.FusedTensor(layer, "gate_up_proj_bias"), 2 * I, b1.data()));
  GCMOE_RETURN_IF_ERROR(read_bias(ckpt_.FusedTensor(layer, "down_proj_bias"), H, w.b2.data()));

  // gate_up rows alternate gate, up: row 2i is gate row i, row 2i + 1 is up row i. The E2M1
  // codes (low nibble = even K index, as ours) and UE8M0 scales move as they are.
  const Located& gb = At(gu_blocks);
  const Located& gs = At(gu_scales);
  const int64_t code_row = H / 2, scale_row = H / 32;
  const uint8_t* codes = gb.file->data(*gb.tensor) + expert * 2 * I * code_row;
  const uint8_t* scales = gs.file->data(*gs.tensor) + expert * 2 * I * scale_row;
  for (int64_t i = 0; i < I; ++i) {
    for (int half = 0; half < 2; ++half) {
      const int64_t ours = half * I + i, theirs = 2 * i + half;
      std::memcpy(w.w1.data() + ours * code_row, codes + theirs * code_row, code_row);
      std::memcpy(w.w1_scales.data() + ours * scale_row, scales + theirs * scale_row, scale_row);
      w.b1[ours] = b1[theirs];
    }
  }
  const Located& db = At(d_blocks);
  const Located& ds = At(d_scales);
  std::memcpy(w.w2.data(), db.file->data(*db.tensor) + expert * w.w2.size(), w.w2.size());
  std::memcpy(w.w2_scales.data(), ds.file->data(*ds.tensor) + expert * w.w2_scales.size(),
              w.w2_scales.size());
  gb.file->DropPages(*gb.tensor, expert * 2 * I * code_row, 2 * I * code_row);
  db.file->DropPages(*db.tensor, expert * w.w2.size(), w.w2.size());
  return w;
}

Result<ExpertWeights> HfWeightSource::LoadExpert(int layer, int expert) const {
  GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
  if (ckpt_.family == HfFamily::kGptOss) return LoadGptOss(layer, expert);
  GCMOE_ASSIGN_OR_RETURN(DenseExpertWeights dense,
                         LoadPerExpertDense(layer, expert, spec_.intermediate));
  return QuantizeExpert<ExpertWeights>(RoutedW1(spec_, layer), RoutedW2(spec_, layer), dense);
}

Result<SharedExpertWeights> HfWeightSource::LoadShared(int layer) const {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
  if (!spec_.has_shared()) return FailedPrecondition("the model has no shared expert");
  GCMOE_ASSIGN_OR_RETURN(DenseExpertWeights dense,
                         LoadPerExpertDense(layer, -1, spec_.shared_intermediate));
  return QuantizeExpert<SharedExpertWeights>(SharedW1(spec_, layer), SharedW2(spec_, layer), dense);
}

Result<DenseExpertWeights> HfWeightSource::LoadExpertDense(int layer, int expert) const {
  GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
  if (ckpt_.family != HfFamily::kGptOss) {
    return LoadPerExpertDense(layer, expert, spec_.intermediate);
  }
  GCMOE_ASSIGN_OR_RETURN(ExpertWeights q, LoadGptOss(layer, expert));
  DenseExpertWeights d;
  Dequantize(RoutedW1(spec_, layer), q.w1, q.w1_scales, &d.w1);
  Dequantize(RoutedW2(spec_, layer), q.w2, q.w2_scales, &d.w2);
  d.b1 = std::move(q.b1);
  d.b2 = std::move(q.b2);
  return d;
}

Result<DenseExpertWeights> HfWeightSource::LoadSharedDense(int layer) const {
  GCMOE_RETURN_IF_ERROR(CheckLayerIndex(spec_, layer));
  if (!spec_.has_shared()) return FailedPrecondition("the model has no shared expert");
  return LoadPerExpertDense(layer, -1, spec_.shared_intermediate);
}

uint64_t HfWeightSource::ExpertBytes(int layer, int expert) const {
  uint64_t bytes = 0;
  if (ckpt_.family == HfFamily::kGptOss) {
    for (const HfTensorSpec& t : ckpt_.LayerTensors(layer)) {
      bytes += At(t.name).tensor->bytes() / spec_.num_experts;
    }
    return bytes;
  }
  for (const char* matrix : {"gate", "up", "down"}) {
    const std::string name = ckpt_.ExpertTensor(layer, expert, matrix);
    bytes += At(name).tensor->bytes();
    if (ckpt_.fp8_blocks) bytes += At(name + "_scale_inv").tensor->bytes();
  }
  return bytes;
}

Status HfWeightSource::CheckExperts(const std::vector<int>& layers,
                                    const std::vector<int>& experts) const {
  uint64_t total = 0;
  for (int layer : layers) {
    for (int expert : experts) {
      GCMOE_RETURN_IF_ERROR(CheckExpertIndex(spec_, layer, expert));
      total += ExpertBytes(layer, expert);
    }
    if (spec_.has_shared()) total += ExpertBytes(layer, -1);
  }
  LoadProgress progress(spec_.weights, static_cast<int>(layers.size()), total);
  const bool requantized = ckpt_.family != HfFamily::kGptOss;
  for (size_t i = 0; i < layers.size(); ++i) {
    const int layer = layers[i];
    uint64_t bytes = 0;
    DiffSums diff;
    for (int expert : experts) {
      if (!requantized) {
        GCMOE_RETURN_IF_ERROR(LoadGptOss(layer, expert).status());
      } else {
        GCMOE_ASSIGN_OR_RETURN(DenseExpertWeights dense,
                               LoadPerExpertDense(layer, expert, spec_.intermediate));
        const WeightMatrix w1 = RoutedW1(spec_, layer), w2 = RoutedW2(spec_, layer);
        const auto q = QuantizeExpert<ExpertWeights>(w1, w2, dense);
        std::vector<float> back;
        Dequantize(w1, q.w1, q.w1_scales, &back);
        diff.Add(dense.w1.data(), back.data(), back.size());
        Dequantize(w2, q.w2, q.w2_scales, &back);
        diff.Add(dense.w2.data(), back.data(), back.size());
      }
      bytes += ExpertBytes(layer, expert);
    }
    if (spec_.has_shared()) {
      // Read for its value checks; its E4M3 error is far below the routed experts' MXFP4 one.
      GCMOE_RETURN_IF_ERROR(LoadPerExpertDense(layer, -1, spec_.shared_intermediate).status());
      bytes += ExpertBytes(layer, -1);
    }
    std::string detail = "model layer " + std::to_string(ckpt_.moe_layer_ids[layer]);
    if (requantized) {
      char text[96];
      std::snprintf(text, sizeof(text), ", MXFP4 calc_diff %.3e vs the checkpoint's %s",
                    diff.value(), ckpt_.fp8_blocks ? "dequantized FP8" : "BF16");
      detail += text;
    }
    progress.LayerDone(static_cast<int>(i), bytes, detail);
  }
  return Status::Ok();
}

}  // namespace gcmoe::engine
