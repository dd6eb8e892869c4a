// role1: token dispatch on the communication partition (DESIGN.md §6, paper §4.3).
//
//   A. Quantize this rank's tokens (E4M3 k32) into x_q/x_s, the buffer peers pull from; then
//      number every local assignment within its expert's global order (source rank, token,
//      slot) and write its receive entry (token, slot, source, weight) into the receive index
//      of the rank that computes that position: home copy below the balancer's split, host
//      copy above it. A warp owns an expert and ranks its assignments with a ballot scan, so
//      the numbering is stable and equals the plan's on every rank.
//   B. Grid barrier over role1's CTAs, then the cross-rank tag-1 barrier: every rank adds 1
//      to every rank's tag1[parity]; a rank goes on once its own counter reaches P. After it,
//      every receive entry and every source's x_q are complete.
//   C. Pull: block b of the step's block table goes to ring slot b % R as generation b / R,
//      once role2 has released the slot's previous generation (ring_empty), in PullParts
//      pieces of its rows, one CTA each; a piece's rows (codes, scales) and metadata are
//      copied, then one is added to ring_full[slot]. Role2 acquires the slot at
//      RingFullTarget before its W1 tasks read it (layer_types.h).
//
// Counters written here are reset by role3 for the next replay (see layer_types.h Signals).
#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/layer_roles.h"
#include "kernels/quantize_act.cuh"

namespace gcmoe::kernels {
namespace {

constexpr int kWarps = kRoleThreads / 32;
constexpr int kRouteBatch = 16;  // groups of 32 assignments a warp ranks per round (phase A)
constexpr int kPullBatch = 4;    // 32-value blocks a thread converts per round (phase C)

__global__ void __launch_bounds__(kRoleThreads)
    DispatchRole1Kernel(const __grid_constant__ LayerParams p) {
  __shared__ int s_go;       // phase B's outcome
  __shared__ int s_pull_go;  // each pulled block's slot wait (a separate word: threads may
                             // still read s_go when thread 0 starts the first slot wait)
  __shared__ uint4 s_rows[kBlockSizes[kNumBlockSizes - 1]];  // a piece's receive entries
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  // A role2 launched behind this kernel with programmatic serialization (the roles in sequence,
  // LayerGraph::Capture) may start now: it waits for what it reads through the ring and signal
  // flags, and for this grid's end before its own.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (p.smid_log != nullptr && threadIdx.x == 0) p.smid_log[blockIdx.x] = SmId();
  const StepHeader& hdr = *p.header;
  const WaitEnv env = MakeWaitEnv(p, 1);
  const int T = hdr.num_tokens;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  const int world = p.dims.world_size;
  const uint32_t parity = p.sig->parity;  // set by the previous replay's role3

  // A. Quantize, one thread per 32-value block of the grid's (row, block) items: at decode
  // sizes a warp per row would serialize a row's loads (the step's first latency).
  const int row_blocks = H / 32;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < T * row_blocks;
       i += gridDim.x * blockDim.x) {
    QuantizeBlock(p.hidden_in, p.hidden_scales_in, hdr.in_dtype, H, i / row_blocks, i % row_blocks,
                  p.x_q, p.x_s, p.x_bf, p.act_bf16);
  }
  // A. Route: receive entries at the computing rank. A warp per expert (spread over the CTAs,
  // one per SM first) scans every assignment, kRouteBatch groups of 32 per round with their ids
  // and weights loaded at once: staging the ids in shared memory first, and a weight loaded per
  // group with a hit, made each a dependent L2 round trip (role1 took 50-66 us at GLM-5.2
  // T = 256, H200, 2026-12-02).
  const int assignments = T * k;
  for (int e = warp * gridDim.x + blockIdx.x; e < p.dims.num_experts; e += gridDim.x * kWarps) {
    const ExpertRoute route = p.routes[e];
    int seen = 0;
    for (int a0 = 0; a0 < assignments; a0 += 32 * kRouteBatch) {
      int32_t id[kRouteBatch];
      float weight[kRouteBatch];
#pragma unroll
      for (int u = 0; u < kRouteBatch; ++u) {
        const int a = a0 + 32 * u + lane;
        id[u] = a < assignments ? __ldg(&p.topk_ids[a]) : -1;
        weight[u] = a < assignments ? __ldg(&p.topk_weights[a]) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kRouteBatch; ++u) {
        const int a = a0 + 32 * u + lane;
        const bool hit = id[u] == e;
        const uint32_t mask = __ballot_sync(0xFFFFFFFFu, hit);
        if (hit) {
          const int position = route.src_offset + seen + __popc(mask & ((1u << lane) - 1u));
          const bool at_home = position < route.home_tokens;
          const int target = at_home ? route.home_rank : route.host_rank;
          const int index = at_home ? route.home_base + position
                                    : route.host_base + (position - route.home_tokens);
          p.peers.recv[target][index] = RowMeta{a / k, a % k, p.dims.rank, weight[u]};
        }
        seen += __popc(mask);
      }
    }
  }

  // B. Barriers. Thread 0's fence orders the whole CTA's stores (after bar.sync) before its
  // arrival; the system-scope fence covers peer writes of receive entries. Every thread that
  // wrote another GPU's receive index also waits for its own stores to land there first.
  if (world > 1) __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    RedAddReleaseGpu(&p.sig->r1_arrive, 1);
    bool ok = WaitAtLeast(env, &p.sig->r1_arrive, gridDim.x, false, kWaitRole1Barrier,
                          static_cast<int>(blockIdx.x));
    if (ok && blockIdx.x == 0) {
      StReleaseGpu(&p.sig->x_ready, 1);  // the shared expert's W1 may read x_q
      for (int q = 0; q < world; ++q) RedAddReleaseSys(&p.peers.signals[q]->tag1[parity], 1);
    }
    if (ok) {
      ok = WaitAtLeast(env, &p.sig->tag1[parity], static_cast<uint32_t>(world), true, kWaitTag1,
                       static_cast<int>(parity));
    }
    s_go = ok;
  }
  __syncthreads();
  if (!s_go) return;

  // C. Pull ring blocks in increasing logical order, each in `parts` pieces of its rows.
  const int n1 = p.dims.intermediate / 32;  // W1 tiles that read each ring block
  const int scale_bytes = H / 32;
  const int parts = PullParts(hdr.num_blocks, p.role1_grid);  // as role2 derives it
  for (int piece = blockIdx.x; piece < hdr.num_blocks * parts; piece += gridDim.x) {
    const int b = piece / parts;
    const int slot = b % p.ring_blocks;
    const uint32_t generation = static_cast<uint32_t>(b / p.ring_blocks);
    if (threadIdx.x == 0) {
      s_pull_go = generation == 0 ||
                  WaitAtLeast(env, &p.ring_empty[slot], generation * static_cast<uint32_t>(n1),
                              false, kWaitRingEmpty, slot);
    }
    __syncthreads();
    if (!s_pull_go) return;
    const RingBlock blk = p.blocks[b];
    const int r0 = blk.rows * (piece % parts) / parts;
    const int rows = blk.rows * (piece % parts + 1) / parts - r0;
    // The piece's receive entries, once: every item below reads its row's.
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      const uint4 raw = LdCg128(&p.recv[blk.row_begin + r0 + r]);
      s_rows[r] = raw;
      *reinterpret_cast<uint4*>(&p.meta[static_cast<int64_t>(b) * p.bm + r0 + r]) = raw;
    }
    __syncthreads();
    if (p.act_bf16) {
      // The bf16 role2's BF16 rows: one thread per (row, 32-value block), kPullBatch of them
      // with their loads in flight at once.
      const int items = rows * scale_bytes;
      for (int i0 = threadIdx.x; i0 < items; i0 += kPullBatch * blockDim.x) {
        uint4 lo[kPullBatch], hi[kPullBatch];
        uint32_t scale_word[kPullBatch];
#pragma unroll
        for (int u = 0; u < kPullBatch; ++u) {
          const int i = i0 + u * blockDim.x;
          if (i >= items) break;
          const uint4 raw = s_rows[i / scale_bytes];
          const int token = static_cast<int>(raw.x);
          const int src = static_cast<int>(raw.z);
          // Another GPU's activations: fetched afresh (ld.cv), never from a line this GPU cached
          // in an earlier replay.
          LoadE4m3Block(p.peers.x_q[src] + static_cast<int64_t>(token) * H,
                        p.peers.x_s[src] + static_cast<int64_t>(token) * scale_bytes,
                        i % scale_bytes, src != p.dims.rank, &lo[u], &hi[u], &scale_word[u]);
        }
#pragma unroll
        for (int u = 0; u < kPullBatch; ++u) {
          const int i = i0 + u * blockDim.x;
          if (i >= items) break;
          const int r = i / scale_bytes;
          const int blk32 = i % scale_bytes;
          StoreE4m3BlockAsBf16(lo[u], hi[u], scale_word[u], blk32, p.act_bf16,
                               reinterpret_cast<uint16_t*>(p.ring) +
                                   (static_cast<int64_t>(slot) * p.bm + r0 + r) * H);
        }
      }
    } else {
      for (int r = warp; r < rows; r += kWarps) {
        const uint4 raw = s_rows[r];
        const int token = static_cast<int>(raw.x);
        const int src = static_cast<int>(raw.z);
        // Another GPU's activations: fetched afresh (ld.cv), never from a line this GPU cached
        // in an earlier replay.
        const bool remote = src != p.dims.rank;
        const uint8_t* src_row = p.peers.x_q[src] + static_cast<int64_t>(token) * H;
        const uint8_t* src_scales = p.peers.x_s[src] + static_cast<int64_t>(token) * scale_bytes;
        const int64_t ring_row = static_cast<int64_t>(slot) * p.bm + r0 + r;
        uint8_t* dst_row = p.ring + ring_row * H;
        uint8_t* dst_scales = p.ring_scales + ring_row * scale_bytes;
#pragma unroll 4
        for (int o = lane * 16; o < H; o += 32 * 16) {
          *reinterpret_cast<uint4*>(dst_row + o) =
              remote ? LdCv128(src_row + o) : LdCg128(src_row + o);
        }
        for (int o = lane * 4; o < scale_bytes; o += 32 * 4) {
          *reinterpret_cast<uint32_t*>(dst_scales + o) =
              remote ? LdCv32(src_scales + o) : LdCg32(src_scales + o);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      RedAddReleaseGpu(&p.ring_full[slot], 1);  // one piece (RingFullTarget)
    }
  }
}

}  // namespace

cudaError_t LoadDispatchRole1Kernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, DispatchRole1Kernel);
}

cudaError_t LaunchDispatchRole1(const LayerParams& params, int grid, cudaStream_t stream) {
  DispatchRole1Kernel<<<grid, kRoleThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace gcmoe::kernels
