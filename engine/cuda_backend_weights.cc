// The CUDA backend's expert weights (CudaBackend::LoadExperts): each layer's quantized codes and
// scales re-laid out into the grouped GEMM's tiles (kernels/weight_tiles_sm90.h), zero-padded to
// the kernels' sizes, and uploaded with role2's scale shifts and the expert biases.
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include "engine/cuda_backend.h"
#include "engine/cuda_error.h"
#include "engine/load_progress.h"
#include "engine/thread_pool.h"
#include "kernels/bf16_operands.h"
#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::engine {
namespace {

using kernels::TileFormat;

// Packs one matrix into tiles on the host, zero-padded to `padded_rows_or_inter` x `padded_k`
// (kernels::TilePadding; the same sizes: no padding), and uploads it.
Status UploadTiles(bool gated, TileFormat format, const std::vector<uint8_t>& codes,
                   const std::vector<uint8_t>& scales, int rows_or_inter, int k,
                   int padded_rows_or_inter, int padded_k, uint8_t* dst,
                   std::vector<uint8_t>* staging) {
  const kernels::TilePadding pad{padded_rows_or_inter, padded_k,
                                 scales.empty() ? uint8_t{127} : scales[0]};
  const int64_t bytes = gated ? kernels::GatedTilesBytes(format, pad.rows, pad.k)
                              : kernels::PlainTilesBytes(format, pad.rows, pad.k);
  staging->resize(static_cast<size_t>(bytes));
  if (gated) {
    kernels::PackGatedTiles(format, codes.data(), scales.data(), rows_or_inter, k, staging->data(),
                            pad);
  } else {
    kernels::PackPlainTiles(format, codes.data(), scales.data(), rows_or_inter, k, staging->data(),
                            pad);
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

// An expert's biases as role2 reads them (StepHeader::b1 / b2), appended: b1 [2I] (gate, up) in
// W1's tile row order over the padded I (tile j: gate features 32j.., then up features 32j..),
// b2 [H] padded to H_p; the padding's biases are 0, so padded features stay exactly 0.
void AppendTiledBiases(const ExpertWeights& w, int inter, int padded_inter, int padded_hidden,
                       std::vector<float>* b1, std::vector<float>* b2) {
  for (int tile = 0; tile < padded_inter / 32; ++tile) {
    for (int r = 0; r < 64; ++r) {
      const int feature = tile * 32 + r % 32;
      b1->push_back(feature < inter ? w.b1[(r < 32 ? 0 : inter) + feature] : 0.0f);
    }
  }
  b2->insert(b2->end(), w.b2.begin(), w.b2.end());
  b2->resize(b2->size() + padded_hidden - w.b2.size(), 0.0f);
}

Status UploadFloats(const std::vector<float>& values, float** dst) {
  cudaError_t err = cudaMalloc(dst, values.size() * sizeof(float));
  if (err == cudaSuccess) {
    err = cudaMemcpy(*dst, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  return err == cudaSuccess ? Status::Ok() : CudaError("uploading the expert biases", err);
}

}  // namespace

void CudaBackend::FreeWeights() {
  for (LayerWeights& l : layers_) {
    for (void* p : {l.w1, l.w2, l.ws1, l.ws2, static_cast<void*>(l.scale_shift),
                    static_cast<void*>(l.b1), static_cast<void*>(l.b2)}) {
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
  // The kernels' sizes: H, I and I_s zero-padded to multiples of 128 (dims_).
  const int Hp = dims_.hidden;
  const int Ip = dims_.intermediate;
  const int Isp = dims_.shared_intermediate;
  const TileFormat routed = TileFormat::kE2M1Bf16;
  const int64_t w1_bytes = kernels::GatedTilesBytes(routed, Ip, Hp);
  const int64_t w2_bytes = kernels::PlainTilesBytes(routed, Hp, Ip);
  // Experts are read, packed and uploaded in parallel: on one thread this host work took about
  // 10 s per gpt-oss-120b-sized layer (128 experts, H = I = 2880). Each worker has its own
  // staging buffer and makes the rank's device current on its own thread before it copies.
  ThreadPool pool(std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16));
  std::vector<std::vector<uint8_t>> staging(pool.size());
  LoadProgress progress("cuda backend: " + source.Describe() + " into GPU tiles", m.num_layers,
                        static_cast<uint64_t>(w1_bytes + w2_bytes) * held_experts_ * m.num_layers);
  bool any_biases = false;
  layers_.resize(m.num_layers);
  for (int l = 0; l < m.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    cudaError_t err = cudaMalloc(&lw.w1, std::max<int64_t>(1, w1_bytes * held_experts_));
    if (err == cudaSuccess)
      err = cudaMalloc(&lw.w2, std::max<int64_t>(1, w2_bytes * held_experts_));
    if (err != cudaSuccess) return CudaError("allocating layer " + std::to_string(l), err);
    std::vector<int32_t> shifts(2 * held_experts_ + 2, 0);  // StepHeader::scale_shift
    // Each expert's biases in role2's order (empty when it has none), joined in slot order.
    std::vector<std::vector<float>> slot_b1(held_experts_), slot_b2(held_experts_);
    std::vector<Status> slot_status(held_experts_, Status::Ok());
    pool.ParallelFor(held_experts_, [&](int64_t slot, int worker) {
      slot_status[slot] = [&]() -> Status {
        GCMOE_RETURN_IF_ERROR(SelectDevice());
        GCMOE_ASSIGN_OR_RETURN(ExpertWeights w, source.LoadExpert(l, experts[slot]));
        const std::string what =
            "expert " + std::to_string(experts[slot]) + " of layer " + std::to_string(l);
        if (w.w1.size() != static_cast<size_t>(2) * I * H / 2 ||
            w.w2.size() != static_cast<size_t>(H) * I / 2 ||
            (w.has_biases() && (w.b1.size() != static_cast<size_t>(2) * I ||
                                w.b2.size() != static_cast<size_t>(H)))) {
          return Internal("cuda backend: " + what + " has unexpected sizes");
        }
        if (w.has_biases()) AppendTiledBiases(w, I, Ip, Hp, &slot_b1[slot], &slot_b2[slot]);
        GCMOE_RETURN_IF_ERROR(ShiftBf16Pair(what, kernels::kE2m1Bf16ScaleBias, &w.w1_scales,
                                            &w.w2_scales, &shifts[2 * slot]));
        GCMOE_RETURN_IF_ERROR(UploadTiles(true, routed, w.w1, w.w1_scales, I, H, Ip, Hp,
                                          static_cast<uint8_t*>(lw.w1) + slot * w1_bytes,
                                          &staging[worker]));
        return UploadTiles(false, routed, w.w2, w.w2_scales, H, I, Hp, Ip,
                           static_cast<uint8_t*>(lw.w2) + slot * w2_bytes, &staging[worker]);
      }();
    });
    // The lowest slot's error, as a load one expert at a time would report it.
    for (const Status& status : slot_status) GCMOE_RETURN_IF_ERROR(status);
    GCMOE_RETURN_IF_ERROR(SelectDevice());
    const bool biases = held_experts_ > 0 && !slot_b1[0].empty();
    std::vector<float> b1, b2;  // LayerWeights::b1 / b2 on the host, when the layer has biases
    for (int slot = 0; slot < held_experts_; ++slot) {
      if (slot_b1[slot].empty() == biases) {
        return Internal("cuda backend: expert " + std::to_string(experts[slot]) + " of layer " +
                        std::to_string(l) + (biases ? " lacks" : " has") +
                        " the expert biases its layer's first expert " +
                        (biases ? "has" : "lacks"));
      }
      b1.insert(b1.end(), slot_b1[slot].begin(), slot_b1[slot].end());
      b2.insert(b2.end(), slot_b2[slot].begin(), slot_b2[slot].end());
    }
    if (biases) {
      GCMOE_RETURN_IF_ERROR(UploadFloats(b1, &lw.b1));
      GCMOE_RETURN_IF_ERROR(UploadFloats(b2, &lw.b2));
      any_biases = true;
    }
    if (m.has_shared()) {
      GCMOE_ASSIGN_OR_RETURN(SharedExpertWeights w, source.LoadShared(l));
      GCMOE_RETURN_IF_ERROR(ShiftBf16Pair("the shared expert of layer " + std::to_string(l),
                                          kernels::kE4m3Bf16ScaleBias, &w.w1_scales, &w.w2_scales,
                                          &shifts[2 * held_experts_]));
      const int64_t s1 = kernels::GatedTilesBytes(TileFormat::kE4M3, Isp, Hp);
      const int64_t s2 = kernels::PlainTilesBytes(TileFormat::kE4M3, Hp, Isp);
      err = cudaMalloc(&lw.ws1, s1);
      if (err == cudaSuccess) err = cudaMalloc(&lw.ws2, s2);
      if (err != cudaSuccess) return CudaError("allocating the shared expert", err);
      GCMOE_RETURN_IF_ERROR(UploadTiles(true, TileFormat::kE4M3, w.w1, w.w1_scales, Is, H, Isp, Hp,
                                        static_cast<uint8_t*>(lw.ws1), &staging[0]));
      GCMOE_RETURN_IF_ERROR(UploadTiles(false, TileFormat::kE4M3, w.w2, w.w2_scales, H, Is, Hp,
                                        Isp, static_cast<uint8_t*>(lw.ws2), &staging[0]));
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
    progress.LayerDone(l, static_cast<uint64_t>(w1_bytes + w2_bytes) * held_experts_, "");
  }
  // role2's instances that add biases, only for weights that have them (a layer without biases
  // has null pointers there).
  const cudaError_t err = graph_->SetExpertBiases(any_biases);
  return err == cudaSuccess ? Status::Ok() : CudaError("capturing the layer graph", err);
}

}  // namespace gcmoe::engine
