// The NCCL all-to-all baseline's kernels (DESIGN.md §6 multi-GPU; issue: "the same layer with
// NCCL all-to-all dispatch and combine around the same grouped GEMM"). The engine launches them
// eagerly on one stream around its two grouped NCCL send/receive rounds:
//
//   quantize + pack ─ NCCL (records) ─ unpack ─ role2 ─ pack return ─ NCCL (partials)
//     ─ unpack return ─ role3
//
// role2 and role3 are the GC-MoE kernels unchanged, given a peer table that names only this
// rank's buffers: role2 scatters the partials of source q into a per-source staging buffer
// (peers.combine[q]; this rank's own entry is its combine buffer), role3's readiness counter
// is only ever its own. Record order is fixed by the step tables, so both sides know every
// record's place without exchanging counts.
#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/layer_roles.h"
#include "kernels/quantize_act.cuh"

namespace gcmoe::kernels {
namespace {

constexpr int kWarps = kRoleThreads / 32;

// Copies `bytes` (a multiple of 16) with one warp.
__device__ __forceinline__ void WarpCopy16(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
  for (int o = lane * 16; o < bytes; o += 32 * 16) {
    *reinterpret_cast<uint4*>(dst + o) = LdCg128(src + o);
  }
}

// Copies `bytes` (a multiple of 4) with one warp.
__device__ __forceinline__ void WarpCopy4(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
  for (int o = lane * 4; o < bytes; o += 32 * 4) {
    *reinterpret_cast<uint32_t*>(dst + o) = LdCg32(src + o);
  }
}

__global__ void __launch_bounds__(kRoleThreads)
    A2aQuantizeKernel(const __grid_constant__ LayerParams p) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const StepHeader& hdr = *p.header;
  for (int row = blockIdx.x * kWarps + warp; row < hdr.num_tokens; row += gridDim.x * kWarps) {
    QuantizeRowWarp(p.hidden_in, p.hidden_scales_in, hdr.in_dtype, p.dims.hidden, row, lane, p.x_q,
                    p.x_s, p.x_bf, p.act_bf16);
  }
}

// Where this rank's assignment at `position` of e's global order goes: its computing rank, its
// row there and its index in the send records.
struct Destination {
  int dst;
  int recv_index;
  int send_index;
};
__device__ __forceinline__ Destination Destine(const ExpertRoute& route, int position) {
  if (position < route.home_tokens) {
    return {route.home_rank, route.home_base + position,
            route.send_home + (position - route.src_offset)};
  }
  return {route.host_rank, route.host_base + (position - route.home_tokens),
          route.send_host + (position - max(route.src_offset, route.home_tokens))};
}

// One warp per expert numbers this rank's assignments of it in the global order (as role1
// does) and writes one record per assignment at its place in the send records.
__global__ void __launch_bounds__(kRoleThreads)
    A2aPackKernel(const __grid_constant__ LayerParams p) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const StepHeader& hdr = *p.header;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  const int assignments = hdr.num_tokens * k;
  const int64_t record_bytes = A2aRecordBytes(H);
  for (int e = blockIdx.x * kWarps + warp; e < p.dims.num_experts; e += gridDim.x * kWarps) {
    const ExpertRoute route = p.routes[e];
    int seen = 0;
    for (int a0 = 0; a0 < assignments; a0 += 32) {
      const int a = a0 + lane;
      const bool hit = a < assignments && p.topk_ids[a] == e;
      const uint32_t mask = __ballot_sync(0xFFFFFFFFu, hit);
      if (hit) {
        const Destination d =
            Destine(route, route.src_offset + seen + __popc(mask & ((1u << lane) - 1u)));
        A2aRecordHeader h;
        h.meta = RowMeta{a / k, a % k, p.dims.rank, p.topk_weights[a]};
        h.recv_index = d.recv_index;
        h.expert = e;
        h.dst = d.dst;
        h.pad = 0;
        *reinterpret_cast<A2aRecordHeader*>(p.a2a_send + d.send_index * record_bytes) = h;
      }
      // The warp copies the hits' rows one after the other.
      for (uint32_t pending = mask; pending != 0; pending &= pending - 1) {
        const int hit_lane = __ffs(pending) - 1;
        const Destination d =
            Destine(route, route.src_offset + seen + __popc(mask & ((1u << hit_lane) - 1u)));
        const int token = (a0 + hit_lane) / k;
        uint8_t* rec = p.a2a_send + d.send_index * record_bytes + sizeof(A2aRecordHeader);
        WarpCopy16(rec, p.x_q + static_cast<int64_t>(token) * H, H, lane);
        WarpCopy4(rec + H, p.x_s + static_cast<int64_t>(token) * (H / 32), H / 32, lane);
      }
      seen += __popc(mask);
    }
  }
}

// One warp per received record: its row and metadata into the ring block of its expert share
// (no slot reuse: block b is slot b). Block 0 then opens every block and the shared expert.
__global__ void __launch_bounds__(kRoleThreads)
    A2aUnpackKernel(const __grid_constant__ LayerParams p) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const StepHeader& hdr = *p.header;
  const int H = p.dims.hidden;
  const int64_t record_bytes = A2aRecordBytes(H);
  for (int i = blockIdx.x * kWarps + warp; i < hdr.a2a_recv_rows; i += gridDim.x * kWarps) {
    const uint8_t* rec = p.a2a_recv + i * record_bytes;
    const A2aRecordHeader h = *reinterpret_cast<const A2aRecordHeader*>(rec);
    const ExpertRoute route = p.routes[h.expert];
    const int base = route.home_rank == p.dims.rank ? route.home_base : route.host_base;
    const int64_t ring_row = static_cast<int64_t>(route.first_block) * p.bm + (h.recv_index - base);
    WarpRowToBf16(rec + sizeof(A2aRecordHeader), rec + sizeof(A2aRecordHeader) + H, H, lane, false,
                  p.act_bf16, reinterpret_cast<uint16_t*>(p.ring) + ring_row * H);
    if (lane == 0) p.meta[ring_row] = h.meta;
  }
  if (blockIdx.x == 0) {
    // Generation 0 of every slot, complete (RingFullTarget).
    const uint32_t full = RingFullTarget(0, 1, PullParts(hdr.num_blocks, p.role1_grid));
    for (int b = threadIdx.x; b < hdr.num_blocks; b += blockDim.x) p.ring_full[b] = full;
    if (threadIdx.x == 0) p.sig->x_ready = 1;
  }
}

// One warp per received record from another rank: its partial (role2 left it in the staging
// buffer of its source) into the return rows, in receive order.
__global__ void __launch_bounds__(kRoleThreads)
    A2aPackReturnKernel(const __grid_constant__ LayerParams p) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const StepHeader& hdr = *p.header;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  const int64_t record_bytes = A2aRecordBytes(H);
  for (int i = blockIdx.x * kWarps + warp; i < hdr.a2a_recv_rows; i += gridDim.x * kWarps) {
    const RowMeta m = reinterpret_cast<const A2aRecordHeader*>(p.a2a_recv + i * record_bytes)->meta;
    if (m.src_rank == p.dims.rank) continue;  // already in this rank's combine buffer
    const uint16_t* src =
        p.peers.combine[m.src_rank] + (static_cast<int64_t>(m.token) * (k + 1) + m.slot) * H;
    WarpCopy16(reinterpret_cast<uint8_t*>(p.a2a_ret_send + static_cast<int64_t>(i) * H),
               reinterpret_cast<const uint8_t*>(src), H * 2, lane);
  }
}

// One warp per sent record computed elsewhere: the returned partial into the combine buffer.
__global__ void __launch_bounds__(kRoleThreads)
    A2aUnpackReturnKernel(const __grid_constant__ LayerParams p) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const StepHeader& hdr = *p.header;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  const int64_t record_bytes = A2aRecordBytes(H);
  for (int i = blockIdx.x * kWarps + warp; i < hdr.a2a_send_rows; i += gridDim.x * kWarps) {
    const A2aRecordHeader h =
        *reinterpret_cast<const A2aRecordHeader*>(p.a2a_send + i * record_bytes);
    if (h.dst == p.dims.rank) continue;
    uint16_t* dst = p.combine + (static_cast<int64_t>(h.meta.token) * (k + 1) + h.meta.slot) * H;
    WarpCopy16(reinterpret_cast<uint8_t*>(dst),
               reinterpret_cast<const uint8_t*>(p.a2a_ret_recv + static_cast<int64_t>(i) * H),
               H * 2, lane);
  }
}

}  // namespace

cudaError_t LoadAllToAllKernels() {
  cudaFuncAttributes attributes;
  cudaError_t err = cudaFuncGetAttributes(&attributes, A2aQuantizeKernel);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, A2aPackKernel);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, A2aUnpackKernel);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, A2aPackReturnKernel);
  if (err == cudaSuccess) err = cudaFuncGetAttributes(&attributes, A2aUnpackReturnKernel);
  return err;
}

cudaError_t LaunchAllToAllStage(AllToAllStage stage, const LayerParams& params, int grid,
                                cudaStream_t stream) {
  switch (stage) {
    case AllToAllStage::kQuantize:
      A2aQuantizeKernel<<<grid, kRoleThreads, 0, stream>>>(params);
      break;
    case AllToAllStage::kPack:
      A2aPackKernel<<<grid, kRoleThreads, 0, stream>>>(params);
      break;
    case AllToAllStage::kUnpack:
      A2aUnpackKernel<<<grid, kRoleThreads, 0, stream>>>(params);
      break;
    case AllToAllStage::kPackReturn:
      A2aPackReturnKernel<<<grid, kRoleThreads, 0, stream>>>(params);
      break;
    case AllToAllStage::kUnpackReturn:
      A2aUnpackReturnKernel<<<grid, kRoleThreads, 0, stream>>>(params);
      break;
  }
  return cudaGetLastError();
}

}  // namespace gcmoe::kernels
