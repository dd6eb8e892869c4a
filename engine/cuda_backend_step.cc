// One step of the CUDA backend (CudaBackend::LaunchStep and FinishStep): the step tables and the
// routing staged in the lane's pinned memory and uploaded in one copy, the activations uploaded
// (or copied and checked from registered GPU memory), the layer's graph launched, the output
// copied back, and the stage timings and value-check results read when the step is done.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "engine/cuda_backend.h"
#include "engine/cuda_error.h"

namespace gcmoe::engine {
namespace {

int32_t InputDType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return kernels::kInBF16;
    case DType::kFP32:
      return kernels::kInFP32;
    case DType::kFP16:
      return kernels::kInFP16;
    case DType::kFP8E4M3:
      return kernels::kInFP8;
  }
  return kernels::kInBF16;
}

}  // namespace

Status CudaBackend::LaunchStep(const StepContext& ctx, StepOutput* out, Lane* lane,
                               bool prefetched) {
  lane->enqueued = false;
  GCMOE_RETURN_IF_ERROR(SelectDevice());
  GCMOE_RETURN_IF_ERROR(CheckStep(ctx));
  const ModelSpec& m = options_.model;
  const int T = ctx.num_tokens;
  const int H = m.hidden;
  const int k = m.top_k;
  const size_t out_bytes = ctx.output_fp32 ? 4 : 2;
  uint8_t* const output = out->Prepare(static_cast<size_t>(T) * H * out_bytes);
  const size_t output_bytes = static_cast<size_t>(T) * H * out_bytes;
  lane->rows = 0;
  // With peers, a rank without tokens still computes theirs and meets them at the barriers.
  if (T == 0 && options_.world_size == 1) return Status::Ok();

  // Block size from the expected tokens per held expert; rows from the plan.
  const int bm = ChooseBlockRows(RowsComputedBy(*ctx.plan, options_.rank));
  BuildGpuStepTables(*ctx.plan, options_.rank, slot_of_, bm, MaxTailRows(bm), &tables_,
                     options_.cuda.heaviest_first);
  const std::vector<kernels::RingBlock>& blocks = tables_.blocks;
  const std::vector<kernels::ExpertRoute>& routes = tables_.routes;
  last_bm_ = bm;
  lane->bm = bm;
  lane->rows = tables_.rows;

  kernels::StepHeader& header = lane->header;
  header = kernels::StepHeader{};
  if (alltoall_) {
    SetAllToAllBytes();
    header.a2a_send_rows = static_cast<int32_t>(tables_.sent());
    header.a2a_recv_rows = static_cast<int32_t>(tables_.received());
  }
  header.generation = ctx.generation;
  header.num_tokens = T;
  header.in_dtype = InputDType(ctx.hidden.dtype);
  header.out_fp32 = ctx.output_fp32 ? 1 : 0;
  header.num_blocks = static_cast<int32_t>(blocks.size());
  header.num_shared_blocks = m.has_shared() ? (T + bm - 1) / bm : 0;
  const LayerWeights& lw = layers_[ctx.layer];
  header.w1 = static_cast<const uint8_t*>(lw.w1);
  header.w2 = static_cast<const uint8_t*>(lw.w2);
  header.ws1 = static_cast<const uint8_t*>(lw.ws1);
  header.ws2 = static_cast<const uint8_t*>(lw.ws2);
  header.scale_shift = lw.scale_shift;
  header.b1 = lw.b1;
  header.b2 = lw.b2;
  header.direct_rows =
      options_.cuda.direct_rows && !alltoall_ && options_.world_size == 1 &&
      tables_.rows >= graph_->role1_grid() &&
      static_cast<int>(blocks.size()) <= graph_->ring_blocks(bm) &&
      BuildDirectRows(*ctx.plan, tables_,
                      std::span<const int32_t>(ctx.topk_ids, static_cast<size_t>(T) * k), bm,
                      &direct_rows_host_);

  // The header, the tables and the top-k ids and weights go to pinned staging laid out as the
  // device's step inputs, and up from there in one copy (one copy per buffer cost about 3 us
  // each); the activations go up from where they are (the rank's pinned I/O region). The
  // lane's staging is not the one the step before may still be copying from.
  const kernels::StepInputsLayout& layout = graph_->step_inputs_layout();
  uint8_t* const staging = lane->staging;
  std::memcpy(staging + layout.header, &header, sizeof(header));
  std::memcpy(staging + layout.routes, routes.data(), routes.size() * sizeof(kernels::ExpertRoute));
  if (T > 0) {
    std::memcpy(staging + layout.topk_ids, ctx.topk_ids, sizeof(int32_t) * T * k);
    std::memcpy(staging + layout.topk_weights, ctx.topk_weights, sizeof(float) * T * k);
  }
  if (header.direct_rows) {
    std::memcpy(staging + layout.direct_rows, direct_rows_host_.data(),
                sizeof(int32_t) * direct_rows_host_.size());
  }
  std::memcpy(staging + layout.blocks, blocks.data(), blocks.size() * sizeof(kernels::RingBlock));

  // Everything goes on the graph's stream, behind the step before, whose layer reads the same
  // device inputs: the stream orders this step's uploads after it.
  cudaStream_t s = graph_->stream();
  lane->enqueued = true;
  cudaError_t err = prefetched ? cudaSuccess : cudaEventRecord(lane->events[0], s);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(graph_->step_inputs(), staging, layout.BytesWith(blocks.size()),
                          cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess && T > 0 && !prefetched) err = UploadHidden(ctx, lane);
  if (err == cudaSuccess && trace_role2_) err = graph_->ClearRole2Trace();
  if (err == cudaSuccess) err = cudaEventRecord(lane->events[1], s);
  Status nccl_status = Status::Ok();
  if (err == cudaSuccess) err = LaunchLayer(bm, &nccl_status);
  GCMOE_RETURN_IF_ERROR(nccl_status);
  if (err == cudaSuccess) err = cudaEventRecord(lane->events[2], s);
  int64_t device_output_rows = 0;
  for (const DeviceRows& r : ctx.device_rows)
    device_output_rows += r.output != nullptr ? r.rows : 0;
  if (err == cudaSuccess && T > device_output_rows) {
    // Rows of the padded H: their padding columns are dropped.
    err = dims_.hidden == H
              ? cudaMemcpyAsync(output, graph_->output(), output_bytes, cudaMemcpyDeviceToHost, s)
              : cudaMemcpy2DAsync(output, H * out_bytes, graph_->output(), dims_.hidden * out_bytes,
                                  H * out_bytes, T, cudaMemcpyDeviceToHost, s);
  }
  if (err == cudaSuccess && !ctx.device_rows.empty()) err = CopyOutputToDevice(ctx, lane);
  if (err == cudaSuccess) err = cudaEventRecord(lane->events[3], s);
  if (err != cudaSuccess) return CudaError("launching step " + std::to_string(ctx.generation), err);
  return Status::Ok();
}

Status CudaBackend::FinishStep(Lane* lane, StepOutput* out) {
  out->assignments_computed = 0;
  out->h2d_ns = out->device_ns = out->d2h_ns = 0;
  out->device_faults.clear();
  if (!lane->enqueued) return Status::Ok();
  const uint64_t generation = lane->generation;
  GCMOE_RETURN_IF_ERROR(SelectDevice());
  GCMOE_RETURN_IF_ERROR(Sync("step", *lane));
  if (const std::string broken = graph_->BrokenCheck(); !broken.empty()) {
    return Internal("cuda backend: step " + std::to_string(generation) + ": " + broken);
  }
  if (graph_->Aborted(generation)) {
    connected_ = connected_ && !alltoall_;
    return Aborted("step " + std::to_string(generation) + " aborted");
  }
  out->assignments_computed = lane->rows;
  ReadFaults(*lane, out);
  int64_t* const stages[3] = {&out->h2d_ns, &out->device_ns, &out->d2h_ns};
  for (int i = 0; i < 3; ++i) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, lane->events[i], lane->events[i + 1]) == cudaSuccess) {
      *stages[i] = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    }
  }
  if (trace_role2_) LogRole2Trace(lane->header, lane->bm, generation);
  return Status::Ok();
}

cudaError_t CudaBackend::UploadHidden(const StepContext& ctx, Lane* lane) {
  const int T = ctx.num_tokens;
  const int H = options_.model.hidden;
  const size_t value_bytes = DTypeBytes(ctx.hidden.dtype);
  const size_t row_bytes = static_cast<size_t>(H) * value_bytes;
  const size_t pitch = static_cast<size_t>(dims_.hidden) * value_bytes;
  cudaStream_t s = graph_->stream();
  cudaError_t err = cudaSuccess;
  if (dims_.hidden != H) {
    // The copies write only the first H values of each row, so once a dtype's padding columns
    // are zero they stay zero; another dtype's rows have another pitch, so a change of dtype
    // zeroes the whole buffer first.
    const int dtype = static_cast<int>(ctx.hidden.dtype);
    if (zero_padded_dtype_ != dtype) {
      err = cudaMemsetAsync(graph_->hidden_in(), 0,
                            static_cast<size_t>(options_.max_tokens_per_rank) * pitch, s);
      if (err != cudaSuccess) return err;
      zero_padded_dtype_ = dtype;
    }
  }
  // Every row from host memory (those also in GPU memory are overwritten next, as the host's
  // copy of them is not used), then the rows in GPU memory, checked as they are copied.
  if (ctx.hidden.data != nullptr) {
    err = pitch == row_bytes
              ? cudaMemcpyAsync(graph_->hidden_in(), ctx.hidden.data, T * row_bytes,
                                cudaMemcpyHostToDevice, s)
              : cudaMemcpy2DAsync(graph_->hidden_in(), pitch, ctx.hidden.data, row_bytes, row_bytes,
                                  static_cast<size_t>(T), cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess && !ctx.device_rows.empty()) {
    const size_t n = ctx.device_rows.size();
    err = cudaMemsetAsync(lane->faults, 0xff, 2 * n * sizeof(unsigned long long), s);
    std::vector<kernels::RowCopy>& copies = row_copies_;
    copies.assign(n, kernels::RowCopy{});
    for (size_t i = 0; i < n; ++i) {
      const DeviceRows& r = ctx.device_rows[i];
      if (r.hidden == nullptr) continue;  // rows 0: nothing to copy or check
      copies[i] =
          kernels::RowCopy{r.hidden, static_cast<uint8_t*>(graph_->hidden_in()) + r.row * pitch,
                           r.rows, static_cast<int64_t>(row_bytes), static_cast<int64_t>(pitch)};
    }
    // The bound the coordinator holds host activations to (DESIGN.md §4).
    constexpr float kMaxActivation = 4294967296.0f;  // 2^32
    if (err == cudaSuccess) {
      err = kernels::LaunchCopyRowsChecked(copies, H, ctx.hidden.dtype == DType::kFP32,
                                           kMaxActivation, lane->faults, s);
    }
  }
  if (err == cudaSuccess && ctx.hidden.dtype == DType::kFP8E4M3) {
    // The padding's scales stay as allocated (zero): nothing else writes this buffer.
    err = dims_.hidden == H
              ? cudaMemcpyAsync(graph_->hidden_scales_in(), ctx.hidden.scales,
                                static_cast<size_t>(T) * (H / 32), cudaMemcpyHostToDevice, s)
              : cudaMemcpy2DAsync(graph_->hidden_scales_in(), dims_.hidden / 32, ctx.hidden.scales,
                                  H / 32, H / 32, T, cudaMemcpyHostToDevice, s);
  }
  return err;
}

cudaError_t CudaBackend::CopyOutputToDevice(const StepContext& ctx, Lane* lane) {
  const size_t n = ctx.device_rows.size();
  const size_t out_bytes = ctx.output_fp32 ? 4 : 2;
  const int64_t row_bytes = static_cast<int64_t>(options_.model.hidden * out_bytes);
  const int64_t pitch = static_cast<int64_t>(dims_.hidden * out_bytes);
  std::vector<kernels::RowCopy>& copies = row_copies_;
  copies.assign(n, kernels::RowCopy{});
  for (size_t i = 0; i < n; ++i) {
    const DeviceRows& r = ctx.device_rows[i];
    if (r.output == nullptr) continue;
    copies[i] = kernels::RowCopy{static_cast<const uint8_t*>(graph_->output()) + r.row * pitch,
                                 r.output, r.rows, pitch, row_bytes};
  }
  cudaStream_t s = graph_->stream();
  cudaError_t err =
      kernels::LaunchCopyRowsChecked(copies, options_.model.hidden, ctx.output_fp32,
                                     std::numeric_limits<float>::max(), lane->faults + n, s);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(lane->faults_host, lane->faults, 2 * n * sizeof(unsigned long long),
                          cudaMemcpyDeviceToHost, s);
  }
  return err;
}

void CudaBackend::ReadFaults(const Lane& lane, StepOutput* out) {
  // The value at a found index, for the message: one small copy, on failures only.
  auto value_at = [](const void* data, bool fp32, unsigned long long index) {
    float value = 0.0f;
    if (fp32) {
      cudaMemcpy(&value, static_cast<const float*>(data) + index, 4, cudaMemcpyDefault);
    } else {
      uint16_t bits = 0;
      cudaMemcpy(&bits, static_cast<const uint16_t*>(data) + index, 2, cudaMemcpyDefault);
      const uint32_t wide = static_cast<uint32_t>(bits) << 16;
      std::memcpy(&value, &wide, 4);
    }
    return value;
  };
  const StepContext& ctx = lane.ctx;
  const unsigned long long* const faults = lane.faults_host;
  const size_t n = ctx.device_rows.size();
  out->device_faults.assign(n, DeviceFaults{});
  for (size_t i = 0; i < n; ++i) {
    const DeviceRows& r = ctx.device_rows[i];
    DeviceFaults& f = out->device_faults[i];
    if (r.hidden != nullptr && faults[i] != ~0ull) {
      f.hidden.index = static_cast<int64_t>(faults[i]);
      f.hidden.value = value_at(r.hidden, ctx.hidden.dtype == DType::kFP32, faults[i]);
    }
    if (r.output != nullptr && faults[n + i] != ~0ull) {
      f.output.index = static_cast<int64_t>(faults[n + i]);
      f.output.value = value_at(r.output, ctx.output_fp32, faults[n + i]);
    }
  }
}

}  // namespace gcmoe::engine
