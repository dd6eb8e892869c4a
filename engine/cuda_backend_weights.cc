// The CUDA backend's expert weights (CudaBackend::LoadExperts): each layer's quantized codes and
// scales re-laid out into the grouped GEMM's tiles (kernels/weight_tiles_sm90.h) and uploaded,
// with role2's scale shifts.
#include <algorithm>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include "engine/cuda_backend.h"
#include "engine/cuda_error.h"
#include "kernels/bf16_operands.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::engine {
namespace {

using kernels::TileFormat;

// Packs one matrix into tiles on the host and uploads it.
Status UploadTiles(bool gated, TileFormat format, const std::vector<uint8_t>& codes,
                   const std::vector<uint8_t>& scales, int rows_or_inter, int k, uint8_t* dst,
                   std::vector<uint8_t>* staging) {
  const int64_t bytes = gated ? kernels::GatedTilesBytes(format, rows_or_inter, k)
                              : kernels::PlainTilesBytes(format, rows_or_inter, k);
  staging->resize(static_cast<size_t>(bytes));
  if (gated) {
    kernels::PackGatedTiles(format, codes.data(), scales.data(), rows_or_inter, k, staging->data());
  } else {
    kernels::PackPlainTiles(format, codes.data(), scales.data(), rows_or_inter, k, staging->data());
  }
  const cudaError_t err = cudaMemcpy(dst, staging->data(), bytes, cudaMemcpyHostToDevice);
  return err == cudaSuccess ? Status::Ok() : CudaError("uploading weights", err);
}

// role2 multiplies each decoded weight by its block scale in BF16: the scale's code plus
// the decode's bias must stay a finite BF16 exponent (kernels/bf16_operands.h). A matrix whose
// largest code is above that limit is loaded with every code lowered by the excess, its shift,
// which its tasks multiply back into their FP32 results (kernels::StepHeader::scale_shift): the
// same values exactly. Only a matrix whose scales span more than BF16 can hold is refused.
Result<int32_t> ShiftBf16Scales(const std::string& what, uint32_t bias,
                                std::vector<uint8_t>* scales) {
  if (scales->empty()) return 0;
  const int limit = kernels::MaxBf16ScaleCode(bias);
  const auto [lo, hi] = std::minmax_element(scales->begin(), scales->end());
  if (*hi <= limit) return 0;
  const int shift = *hi - limit;
  if (*lo < shift) {
    return InvalidArgument("cuda backend: " + what + " has block scales from 2^" +
                           std::to_string(*lo - 127) + " to 2^" + std::to_string(*hi - 127) +
                           ", a wider span than the GPU kernels hold (2^" + std::to_string(limit) +
                           "); the cpu backend serves it");
  }
  for (uint8_t& code : *scales) code = static_cast<uint8_t>(code - shift);
  return shift;
}

// Both matrices of an expert (ShiftBf16Scales): W1's shift at shifts[0], W2's at shifts[1].
Status ShiftBf16Pair(const std::string& what, uint32_t bias, std::vector<uint8_t>* w1_scales,
                     std::vector<uint8_t>* w2_scales, int32_t* shifts) {
  GCMOE_ASSIGN_OR_RETURN(shifts[0], ShiftBf16Scales(what + " W1", bias, w1_scales));
  GCMOE_ASSIGN_OR_RETURN(shifts[1], ShiftBf16Scales(what + " W2", bias, w2_scales));
  return Status::Ok();
}

}  // namespace

void CudaBackend::FreeWeights() {
  for (LayerWeights& l : layers_) {
    for (void* p : {l.w1, l.w2, l.ws1, l.ws2, static_cast<void*>(l.scale_shift)}) {
      if (p != nullptr) cudaFree(p);
    }
  }
  layers_.clear();
}

Status CudaBackend::LoadExperts(const WeightSource& source, std::span<const int> experts) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  GCMOE_RETURN_IF_ERROR(SelectDevice());
  const ModelSpec& m = options_.model;
  const int H = m.hidden;
  const int I = m.intermediate;
  const int Is = m.shared_intermediate;
  FreeWeights();
  slot_of_.assign(m.num_experts, -1);
  held_experts_ = static_cast<int>(experts.size());
  for (int slot = 0; slot < held_experts_; ++slot) {
    const int e = experts[slot];
    if (e < 0 || e >= m.num_experts || slot_of_[e] >= 0) {
      return InvalidArgument("cuda backend: expert " + std::to_string(e) +
                             " is out of range or listed twice");
    }
    slot_of_[e] = slot;
  }
  // role2 reads its own lane-word placement (same bytes) and folds the block scales into BF16
  // multipliers, which bounds them (kernels/bf16_operands.h).
  const TileFormat routed = TileFormat::kE2M1Bf16;
  const int64_t w1_bytes = kernels::GatedTilesBytes(routed, I, H);
  const int64_t w2_bytes = kernels::PlainTilesBytes(routed, H, I);
  std::vector<uint8_t> staging;
  layers_.resize(m.num_layers);
  for (int l = 0; l < m.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    cudaError_t err = cudaMalloc(&lw.w1, std::max<int64_t>(1, w1_bytes * held_experts_));
    if (err == cudaSuccess)
      err = cudaMalloc(&lw.w2, std::max<int64_t>(1, w2_bytes * held_experts_));
    if (err != cudaSuccess) return CudaError("allocating layer " + std::to_string(l), err);
    std::vector<int32_t> shifts(2 * held_experts_ + 2, 0);  // StepHeader::scale_shift
    for (int slot = 0; slot < held_experts_; ++slot) {
      GCMOE_ASSIGN_OR_RETURN(ExpertWeights w, source.LoadExpert(l, experts[slot]));
      if (w.has_biases()) {
        return Unimplemented("cuda backend: " + source.Describe() + " has expert biases (layer " +
                             std::to_string(l) +
                             "), which the GPU kernels do not add; use engine.backend \"cpu\"");
      }
      if (w.w1.size() != static_cast<size_t>(2) * I * H / 2 ||
          w.w2.size() != static_cast<size_t>(H) * I / 2) {
        return Internal("cuda backend: expert " + std::to_string(experts[slot]) + " of layer " +
                        std::to_string(l) + " has unexpected sizes");
      }
      GCMOE_RETURN_IF_ERROR(ShiftBf16Pair(
          "expert " + std::to_string(experts[slot]) + " of layer " + std::to_string(l),
          kernels::kE2m1Bf16ScaleBias, &w.w1_scales, &w.w2_scales, &shifts[2 * slot]));
      GCMOE_RETURN_IF_ERROR(UploadTiles(true, routed, w.w1, w.w1_scales, I, H,
                                        static_cast<uint8_t*>(lw.w1) + slot * w1_bytes, &staging));
      GCMOE_RETURN_IF_ERROR(UploadTiles(false, routed, w.w2, w.w2_scales, H, I,
                                        static_cast<uint8_t*>(lw.w2) + slot * w2_bytes, &staging));
    }
    if (m.has_shared()) {
      GCMOE_ASSIGN_OR_RETURN(SharedExpertWeights w, source.LoadShared(l));
      GCMOE_RETURN_IF_ERROR(ShiftBf16Pair("the shared expert of layer " + std::to_string(l),
                                          kernels::kE4m3Bf16ScaleBias, &w.w1_scales, &w.w2_scales,
                                          &shifts[2 * held_experts_]));
      const int64_t s1 = kernels::GatedTilesBytes(TileFormat::kE4M3, Is, H);
      const int64_t s2 = kernels::PlainTilesBytes(TileFormat::kE4M3, H, Is);
      err = cudaMalloc(&lw.ws1, s1);
      if (err == cudaSuccess) err = cudaMalloc(&lw.ws2, s2);
      if (err != cudaSuccess) return CudaError("allocating the shared expert", err);
      GCMOE_RETURN_IF_ERROR(UploadTiles(true, TileFormat::kE4M3, w.w1, w.w1_scales, Is, H,
                                        static_cast<uint8_t*>(lw.ws1), &staging));
      GCMOE_RETURN_IF_ERROR(UploadTiles(false, TileFormat::kE4M3, w.w2, w.w2_scales, H, Is,
                                        static_cast<uint8_t*>(lw.ws2), &staging));
    }
    const size_t bytes = shifts.size() * sizeof(int32_t);
    err = cudaMalloc(&lw.scale_shift, bytes);
    if (err == cudaSuccess) {
      err = cudaMemcpy(lw.scale_shift, shifts.data(), bytes, cudaMemcpyHostToDevice);
    }
    if (err != cudaSuccess) return CudaError("uploading the scale shifts", err);
    const int shifted = static_cast<int>(
        std::count_if(shifts.begin(), shifts.end(), [](int32_t s) { return s != 0; }));
    if (shifted > 0) {
      spdlog::info(
          "cuda backend: layer {}: {} of {} matrices have block scales above the GPU "
          "kernels' multiplier range, loaded shifted (exact)",
          l, shifted, shifts.size());
    }
  }
  return Status::Ok();
}

}  // namespace gcmoe::engine
