// role1: token dispatch on the communication partition (DESIGN.md §6, paper §4.3).
//
//   A. Quantize this rank's tokens (E4M3 k32) into x_q/x_s, the buffer peers pull from; then
//      number every local assignment within its expert's global order (source rank, token,
//      slot) and write its receive entry (token, slot, source, weight) into the receive index
//      of the rank that computes that position: home copy below the balancer's split, host
//      copy above it. A warp owns an expert and ranks its assignments with a ballot scan, so
//      the numbering is stable and equals the plan's on every rank.
//   B. Grid barrier over role1's CTAs, then (P > 1) the cross-rank tag-1 barrier: every rank
//      adds 1 to every rank's tag1[parity]; a rank goes on once its own counter reaches P.
//      After it, every receive entry and every source's x_q are complete.
//   C. Pull: block b of the step's block table goes to ring slot b % R as generation b / R,
//      once role2 has released the slot's previous generation (ring_empty), in PullParts
//      pieces of its rows, one CTA each; a piece's rows (codes, scales) and metadata are
//      copied, then one is added to ring_full[slot]. Role2 acquires the slot at
//      RingFullTarget before its W1 tasks read it (layer_types.h).
//   Direct rows (StepHeader::direct_rows: one rank, the host's ring row of every
//   assignment in LayerParams::direct_rows): A writes each token's BF16 values into its slots'
//   ring rows and their metadata, instead of routing; after B every block is marked full at once
//   and there is no pull.
//
// Counters written here are reset by role3 for the next replay (see layer_types.h Signals).
#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/layer_roles.h"
#include "kernels/quantize_act.cuh"

namespace gcmoe::kernels {
namespace {

constexpr int kWarps = kRoleThreads / 32;
constexpr int kRouteBatch = 8;  // groups of 32 assignments a warp loads at once (phase A)
constexpr int kPullBatch = 4;   // 32-value blocks of other ranks' rows a thread converts per
                                // round (phase C)
constexpr int kCopyBatch = 8;   // 16-byte copies of this rank's own BF16 rows a thread has in
                                // flight per round (phase C)

// Registers unbounded (ptxas gives it 128 a thread), so that beside a role1 CTA only one BM 64
// role2 CTA of three is resident. A cap of 80, which keeps two, spilled 64 bytes and measured
// slightly slower than the unbounded kernel.
__global__ void __launch_bounds__(kRoleThreads)
    DispatchRole1Kernel(const __grid_constant__ LayerParams p) {
  __shared__ int s_go;       // phase B's outcome
  __shared__ int s_pull_go;  // each pulled block's slot wait (a separate word: threads may
                             // still read s_go when thread 0 starts the first slot wait)
  __shared__ int s_route_hits[kWarps];                       // phase A: an expert's hits per warp
  __shared__ uint4 s_rows[kBlockSizes[kNumBlockSizes - 1]];  // a piece's receive entries
  __shared__ uint4 s_stage[kWarps][32][4];  // direct rows: each lane's block as BF16 (64 bytes)
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

  // Direct rows (one rank, StepHeader::direct_rows): phase A writes each token's BF16 values
  // into the ring rows of its slots and their metadata, so phase C only marks the blocks full.
  const bool direct = hdr.direct_rows != 0;
  // A. Quantize, one thread per 32-value block of the grid's (row, block) items: at decode
  // sizes a warp per row would serialize a row's loads (the step's first latency).
  const int row_blocks = H / 32;
  // Without a shared expert nothing reads x_bf once role1 writes the ring rows itself.
  uint16_t* x_bf = direct && p.dims.shared_intermediate == 0 ? nullptr : p.x_bf;
  // Where a warp's 32 lanes cover 32 blocks of one row (H a multiple of 1024), the warp stores
  // each ring row's 2 KB from s_stage 16 bytes a lane, 512 contiguous bytes per instruction; each
  // lane storing its own 64 bytes into every slot's row made role1 as slow as the pull it
  // replaces.
  const bool coalesce = direct && row_blocks % 32 == 0;
  uint16_t* ring_bf = reinterpret_cast<uint16_t*>(p.ring);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < T * row_blocks;
       i += gridDim.x * blockDim.x) {
    const int row = i / row_blocks;
    const int b = i % row_blocks;
    QuantizeBlock(p.hidden_in, p.hidden_scales_in, hdr.in_dtype, H, row, b, p.x_q, p.x_s, x_bf,
                  p.act_bf16, direct ? reinterpret_cast<uint16_t*>(s_stage[warp][lane]) : nullptr);
    if (!direct) continue;
    const int32_t* dest = p.direct_rows + static_cast<int64_t>(row) * k;
    if (coalesce) __syncwarp();
    for (int s = 0; s < k; ++s) {
      const int32_t ring_row = __ldg(&dest[s]);
      if (ring_row < 0) continue;  // the warp's lanes agree where they coalesce: one row
      if (coalesce) {
        uint4* to = reinterpret_cast<uint4*>(ring_bf + static_cast<int64_t>(ring_row) * H +
                                             (b - lane) * 32);
#pragma unroll
        for (int u = 0; u < 4; ++u) to[32 * u + lane] = s_stage[warp][8 * u + lane / 4][lane % 4];
      } else {
        uint4* to = reinterpret_cast<uint4*>(ring_bf + static_cast<int64_t>(ring_row) * H + b * 32);
#pragma unroll
        for (int u = 0; u < 4; ++u) to[u] = s_stage[warp][lane][u];
      }
    }
    if (coalesce) __syncwarp();  // s_stage is the next item's
  }
  if (direct) {
    for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < T * k; a += gridDim.x * blockDim.x) {
      const int32_t row = __ldg(&p.direct_rows[a]);
      if (row >= 0) p.meta[row] = RowMeta{a / k, a % k, p.dims.rank, __ldg(&p.topk_weights[a])};
    }
  }
  // A. Route: receive entries at the computing rank. A CTA per expert: its warps split the
  // assignments into kWarps runs of 32-assignment groups, count their run's hits, then number
  // them after the earlier runs' counts, so that the numbering is the expert's assignment order
  // (the plan's) while each warp ranks a kWarps-th of the groups. (A warp per expert ranked
  // every group in turn, each hit's entry a chain of dependent instructions: 64 groups took
  // about 25 us at GLM-5.2 T = 256.)
  const int assignments = T * k;
  const int groups = (assignments + 31) / 32;
  const int run = (groups + kWarps - 1) / kWarps;  // groups per warp
  const int g_begin = min(groups, warp * run);
  const int g_end = min(groups, g_begin + run);
  // The lane's expert ids of groups g0.. g0 + kRouteBatch - 1 of the warp's run (-1 past it),
  // and with `weight` their routing weights, all loads in flight at once.
  auto load_batch = [&](int g0, int32_t(&id)[kRouteBatch], float* weight) {
#pragma unroll
    for (int u = 0; u < kRouteBatch; ++u) {
      const int a = (g0 + u) * 32 + lane;
      const bool valid = g0 + u < g_end && a < assignments;
      id[u] = valid ? __ldg(&p.topk_ids[a]) : -1;
      if (weight != nullptr) weight[u] = valid ? __ldg(&p.topk_weights[a]) : 0.0f;
    }
  };
  // The grid's last CTAs take the experts: the quantization's grid-stride loop gives its items
  // to the first ones. None with direct rows: phase A wrote every row and its metadata.
  for (int e = direct ? p.dims.num_experts : gridDim.x - 1 - blockIdx.x; e < p.dims.num_experts;
       e += gridDim.x) {
    int hits = 0;
    for (int g0 = g_begin; g0 < g_end; g0 += kRouteBatch) {
      int32_t id[kRouteBatch];
      load_batch(g0, id, nullptr);
#pragma unroll
      for (int u = 0; u < kRouteBatch; ++u) hits += __popc(__ballot_sync(0xFFFFFFFFu, id[u] == e));
    }
    if (lane == 0) s_route_hits[warp] = hits;
    __syncthreads();
    int seen = 0;
    for (int w = 0; w < warp; ++w) seen += s_route_hits[w];
    const ExpertRoute route = p.routes[e];
    for (int g0 = g_begin; g0 < g_end; g0 += kRouteBatch) {
      int32_t id[kRouteBatch];
      float weight[kRouteBatch];
      // The ids again (L1 hits): a run of any length cannot stay in registers between passes.
      load_batch(g0, id, weight);
#pragma unroll
      for (int u = 0; u < kRouteBatch; ++u) {
        const int a = (g0 + u) * 32 + lane;
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
    __syncthreads();  // s_route_hits is the next expert's
  }

  // B. Barriers. Thread 0's release orders the whole CTA's stores (after bar.sync; a release is
  // cumulative) before its arrival; with peers a system-scope fence before it covers peer writes
  // of receive entries, and every thread that wrote another GPU's receive index also waits for
  // its own stores to land there first. On one rank nothing here is another GPU's: the GPU-scope
  // release alone, and the grid barrier alone completes every receive entry (no tag-1 barrier).
  if (world > 1) __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    if (world > 1) __threadfence_system();
    RedAddReleaseGpu(&p.sig->r1_arrive, 1);
    bool ok = WaitAtLeast(env, &p.sig->r1_arrive, gridDim.x, false, kWaitRole1Barrier,
                          static_cast<int>(blockIdx.x));
    if (ok && blockIdx.x == 0) {
      StReleaseGpu(&p.sig->x_ready, 1);  // the shared expert's W1 may read x_q
      if (world > 1) {
        for (int q = 0; q < world; ++q) RedAddReleaseSys(&p.peers.signals[q]->tag1[parity], 1);
      }
    }
    if (ok && world > 1) {
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
  if (direct) {
    // Every block's rows are in place (phase B): each its full count of pieces at once, past
    // the barrier's acquire.
    if (threadIdx.x == 0) {
      for (int b = blockIdx.x; b < hdr.num_blocks; b += gridDim.x) {
        RedAddReleaseGpu(&p.ring_full[b], static_cast<uint32_t>(parts));
      }
    }
    return;
  }
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
    // role2's BF16 rows. This rank's own tokens: copies of the rows phase A wrote (x_bf), 16 bytes
    // per item, kCopyBatch items in flight per thread. (Converting each
    // E4M3 block again, once per routed copy of its token, made the pull issue-bound.)
    const int chunks = H / 8;  // 16-byte pieces of a BF16 row
    const int local_items = rows * chunks;
    uint16_t* ring_rows =
        reinterpret_cast<uint16_t*>(p.ring) + (static_cast<int64_t>(slot) * p.bm + r0) * H;
    for (int i0 = threadIdx.x; i0 < local_items; i0 += kCopyBatch * blockDim.x) {
      uint4 v[kCopyBatch];
      bool own[kCopyBatch];
#pragma unroll
      for (int u = 0; u < kCopyBatch; ++u) {
        const int i = i0 + u * blockDim.x;
        const uint4 raw = s_rows[min(i, local_items - 1) / chunks];
        own[u] = i < local_items && static_cast<int>(raw.z) == p.dims.rank;
        if (own[u]) v[u] = LdCg128(p.x_bf + static_cast<int64_t>(raw.x) * H + (i % chunks) * 8);
      }
#pragma unroll
      for (int u = 0; u < kCopyBatch; ++u) {
        const int i = i0 + u * blockDim.x;
        if (own[u]) {
          *reinterpret_cast<uint4*>(ring_rows + static_cast<int64_t>(i / chunks) * H +
                                    (i % chunks) * 8) = v[u];
        }
      }
    }
    // Other ranks' tokens: their E4M3 blocks converted, one thread per (row, 32-value block).
    // One rank has none: its pass would only test every item's row.
    const int items = world > 1 ? rows * scale_bytes : 0;
    for (int i0 = threadIdx.x; i0 < items; i0 += kPullBatch * blockDim.x) {
      uint4 lo[kPullBatch], hi[kPullBatch];
      uint32_t scale_word[kPullBatch];
      bool remote[kPullBatch];
#pragma unroll
      for (int u = 0; u < kPullBatch; ++u) {
        const int i = i0 + u * blockDim.x;
        const uint4 raw = s_rows[min(i, items - 1) / scale_bytes];
        const int token = static_cast<int>(raw.x);
        const int src = static_cast<int>(raw.z);
        remote[u] = i < items && src != p.dims.rank;
        // Fetched afresh (ld.cv), never from a line this GPU cached in an earlier replay.
        if (remote[u]) {
          LoadE4m3Block(p.peers.x_q[src] + static_cast<int64_t>(token) * H,
                        p.peers.x_s[src] + static_cast<int64_t>(token) * scale_bytes,
                        i % scale_bytes, true, &lo[u], &hi[u], &scale_word[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kPullBatch; ++u) {
        const int i = i0 + u * blockDim.x;
        if (remote[u]) {
          StoreE4m3BlockAsBf16(lo[u], hi[u], scale_word[u], i % scale_bytes, p.act_bf16,
                               ring_rows + static_cast<int64_t>(i / scale_bytes) * H);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      RedAddReleaseGpu(&p.ring_full[slot], 1);  // one piece (RingFullTarget), as B's release
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
