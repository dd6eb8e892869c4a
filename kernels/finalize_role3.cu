// role3: finalize on the compute partition, after role1 and role2 of the same replay.
//
// Combine readiness (P > 1): CTA 0 adds 1 to every rank's combine_ready[parity] (this rank's
// role2 is complete, so its partials sit in every source's combine buffer); every CTA then waits
// for its own counter to reach P. One rank's partials are complete by the graph dependency.
// Each token's k slots (unused ones skipped) and the shared slot are reduced in FP32 in slot
// order into the output (DESIGN.md §4 step 5).
//
// Checks: before resetting, the last CTA checks role2's bookkeeping of the replay (every task
// claimed exactly once, every routed block's W1 tiles all counted) and records a broken check
// in the host-mapped diagnostic, which fails the step (LayerGraph::BrokenCheck).
//
// Signal reset: the last CTA to finish restores the invariant of layer_types.h Signals for the
// next replay (so replays need no host-side reset): ring and W1 counters, the task cursor,
// role1's barrier, x_ready, this parity's tag1 and combine_ready, and it flips the parity.
// Why flipping is safe without a trailing cross-rank barrier: a peer can add to this rank's
// counters of the same parity again only in replay N + 2, after passing replay N + 1's tag-1
// barrier, which needs this rank's role1 of N + 1, which starts after this kernel.
#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/layer_roles.h"
#include "kernels/programmatic_launch.h"

namespace gcmoe::kernels {
namespace {

constexpr int kSlotBatch = 9;  // a token's slots whose partials are loaded at once (top-8 + shared)

__global__ void __launch_bounds__(kRoleThreads)
    FinalizeRole3Kernel(const __grid_constant__ LayerParams p) {
  __shared__ int s_go;
  __shared__ int s_last;
  __shared__ int s_first_bad;  // the lowest block whose W1 tiles did not all count
  const StepHeader& hdr = *p.header;
  const WaitEnv env = MakeWaitEnv(p, 3);
  const int T = hdr.num_tokens;
  const int H = p.dims.hidden;
  const int k = p.dims.top_k;
  const int world = p.dims.world_size;
  // Launched programmatically behind role2 (one rank: LaunchFinalizeRole3's `early`), the grid
  // may start while role2's last tasks run; nothing role2 writes may be read before it completed.
  // A no-op otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint32_t parity = p.sig->parity;

  // One rank has no peer to wait for: role2's partials are complete (graph dependency).
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0 && world > 1) {
      __threadfence_system();
      for (int q = 0; q < world; ++q)
        RedAddReleaseSys(&p.peers.signals[q]->combine_ready[parity], 1);
    }
    s_go =
        world == 1 || WaitAtLeast(env, &p.sig->combine_ready[parity], static_cast<uint32_t>(world),
                                  true, kWaitCombine, static_cast<int>(parity));
  }
  __syncthreads();

  if (s_go) {
    const int chunks_per_token = H / 8;
    const int64_t items = static_cast<int64_t>(T) * chunks_per_token;
    const bool has_shared = p.dims.shared_intermediate > 0;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int t = static_cast<int>(i / chunks_per_token);
      const int c = static_cast<int>(i % chunks_per_token) * 8;
      float acc[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
      const uint16_t* partials = p.combine + static_cast<int64_t>(t) * (k + 1) * H + c;
      // kSlotBatch slots' loads in flight at once, then summed in slot order: one slot at a
      // time, each item waited for k + 1 L2 round trips (role3 took 32 us at GLM-5.2 T = 256).
      for (int s0 = 0; s0 <= k; s0 += kSlotBatch) {
        uint4 v[kSlotBatch];
        bool used[kSlotBatch];
#pragma unroll
        for (int j = 0; j < kSlotBatch; ++j) {
          const int s = s0 + j;
          used[j] = s < k ? p.topk_ids[t * k + s] >= 0 : s == k && has_shared;
          if (used[j]) v[j] = LdCg128(partials + static_cast<int64_t>(s) * H);
        }
#pragma unroll
        for (int j = 0; j < kSlotBatch; ++j) {
          if (!used[j]) continue;
          const uint32_t words[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            acc[2 * q] += Bf16ToFloat(words[q] & 0xFFFFu);
            acc[2 * q + 1] += Bf16ToFloat(words[q] >> 16);
          }
        }
      }
      if (hdr.out_fp32) {
        float4* dst =
            reinterpret_cast<float4*>(static_cast<float*>(p.out) + static_cast<int64_t>(t) * H + c);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      } else {
        uint32_t packed[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          packed[j] = Bf16Bits(acc[2 * j]) | (Bf16Bits(acc[2 * j + 1]) << 16);
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + static_cast<int64_t>(t) * H + c) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
      }
    }
  }

  // Last CTA out resets. Every other role has finished (graph dependency) and every role3 CTA
  // has read `parity` before counting itself in r3_done.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    s_last = atomicAdd(&p.sig->r3_done, 1u) == gridDim.x - 1;
    s_first_bad = hdr.num_blocks;  // the last CTA's checks below lower it
  }
  __syncthreads();
  if (!s_last) return;
  // The replay's bookkeeping, before it is reset (role2 has finished: graph dependency): every
  // thread checks its share of the blocks' W1 counts at once (a loop of dependent loads by one
  // thread cost a round trip per block at the end of every step), thread 0 the task claims and
  // whether the step was aborted (a host-mapped read, meanwhile).
  const int n1 = p.dims.intermediate / 32;
  for (int b = threadIdx.x; b < hdr.num_blocks; b += blockDim.x) {
    if (p.w1_done[b] != static_cast<uint32_t>(n1)) atomicMin(&s_first_bad, b);
  }
  const bool check = threadIdx.x == 0 && p.diag != nullptr && !StepAborted(env);
  __syncthreads();
  if (check) {
    const uint32_t tasks = static_cast<uint32_t>(
        Role2TaskCount(p.dims, hdr.num_blocks, hdr.num_shared_blocks, p.r2_tiles_per_task));
    const uint32_t claims = tasks + static_cast<uint32_t>(p.role2_grid);
    int broken = 0, index = 0;
    uint32_t expected = 0, seen = 0;
    if (p.sig->task_next != claims) {
      broken = kCheckTaskClaims, expected = claims, seen = p.sig->task_next;
    } else if (s_first_bad < hdr.num_blocks) {
      broken = kCheckW1Tiles, index = s_first_bad, expected = n1, seen = p.w1_done[s_first_bad];
    }
    if (broken != 0 && atomicCAS(&p.diag->broken, 0, broken) == 0) {
      p.diag->broken_index = index;
      p.diag->broken_expected = expected;
      p.diag->broken_seen = seen;
      __threadfence_system();
    }
  }
  __syncthreads();  // the checks read what the loops below reset
  const int used_slots = min(p.ring_blocks, hdr.num_blocks);
  for (int i = threadIdx.x; i < used_slots; i += blockDim.x) {
    p.ring_full[i] = 0;
    p.ring_empty[i] = 0;
  }
  for (int i = threadIdx.x; i < hdr.num_blocks; i += blockDim.x) p.w1_done[i] = 0;
  for (int i = threadIdx.x; i < hdr.num_shared_blocks; i += blockDim.x) p.w1s_done[i] = 0;
  if (threadIdx.x == 0) {
    Signals* sig = p.sig;
    sig->task_next = 0;
    sig->r1_arrive = 0;
    sig->x_ready = 0;
    sig->tag1[parity] = 0;
    sig->combine_ready[parity] = 0;
    sig->r3_done = 0;
    sig->replays += 1;
    sig->parity = parity ^ 1u;
  }
}

}  // namespace

cudaError_t LoadFinalizeRole3Kernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, FinalizeRole3Kernel);
}

cudaError_t Role3CtasPerSm(int* ctas) {
  int resident = 0;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &resident, FinalizeRole3Kernel, kRoleThreads, 0);
  if (err != cudaSuccess) return err;
  *ctas = resident < 1 ? 1 : resident < kRole3CtasPerSm ? resident : kRole3CtasPerSm;
  return cudaSuccess;
}

cudaError_t LaunchFinalizeRole3(const LayerParams& params, int grid, cudaStream_t stream,
                                bool early) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(kRoleThreads));
  config.stream = stream;
  cudaLaunchAttribute attribute;
  AllowProgrammaticLaunch(early, &config, &attribute);
  return cudaLaunchKernelEx(&config, FinalizeRole3Kernel, params);
}

}  // namespace gcmoe::kernels
