// Hopper (sm_90a) asynchronous primitives the warp-specialized grouped GEMM is built from:
// mbarriers, bulk global->shared copies completing on an mbarrier, cp.async arrivals, proxy
// fences, named barriers, register-A wgmma m64nNk32 E4M3 and m64nNk16
// BF16, with their shared-memory descriptor.
// Thin PTX wrappers; the protocols that use them are documented where they are used.
#pragma once

#include <cstdint>

#include "kernels/device_common.cuh"

namespace gcmoe::kernels {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers --------------------------------------------------------------------------------

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (bulk copies complete on them).
__device__ __forceinline__ void FenceMbarInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrive (release, CTA scope): orders this thread's prior accesses before the phase completes.
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar)
               : "memory");
}
// Adds `bytes` to the phase's expected transaction count, then arrives.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(bar),
      "r"(bytes)
      : "memory");
}
// True once the phase of the given parity has completed (acquire, CTA scope).
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Records a wait that expired in the host-mapped diagnostic and traps. No printf: any call in a
// kernel that issues wgmma makes ptxas serialize every wgmma (C7510); the host names the wait
// from the diagnostic (LayerGraph::TimeoutDiagnostic).
__device__ __forceinline__ void TimeoutTrap(const WaitEnv& env, int what, int index,
                                            uint32_t target, uint32_t seen) {
  RecordTimeout(env, what, index, target, seen);
  __trap();
}

// Waits for the phase of `parity`. Only a bug can make this wait long (every task's stages are
// issued in full once published, and the producer's own flag waits time out first); after
// `timeout_ns` it records barrier `index` (kWaitPipeline) and traps.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity, uint64_t timeout_ns,
                                         const WaitEnv& env, int index) {
  if (MbarTryWait(bar, parity)) return;
  const uint64_t start = GlobalTimerNs();
  for (uint32_t spin = 1;; ++spin) {
    if (MbarTryWait(bar, parity)) return;
    if ((spin & 255) == 0 && GlobalTimerNs() - start > timeout_ns) {
      TimeoutTrap(env, kWaitPipeline, index, parity, threadIdx.x);
    }
  }
}

// ---- copies -----------------------------------------------------------------------------------

// L2 policy for data read once per replay (the weights): evicted first, so the activations and
// W1 outputs that many tasks re-read stay in L2.
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// Bulk copy (async proxy) of `bytes` (multiple of 16, both addresses 16-byte aligned) that
// completes `bytes` transactions on `bar`.
__device__ __forceinline__ void BulkCopyG2S(uint32_t dst, const void* src, uint32_t bytes,
                                            uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
// TMA tile load (async proxy): box (x, y) of tensor map `map` (in global memory, written before
// the launch) into shared memory at `dst`, completing its bytes as transactions on `bar`.
__device__ __forceinline__ void TmaLoad2D(uint32_t dst, const void* map, int x, int y,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// 16 bytes through L2 only (never a stale L1 line of data another CTA wrote this replay).
__device__ __forceinline__ void CpAsyncCg16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// Arrives on `bar` once every cp.async this thread issued before has landed. The arrival is one
// of the barrier's expected arrivals (.noinc), and a thread observing the completed phase sees
// the copied bytes. With no copy in flight it arrives at once.
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// Orders this thread's view of shared memory written through the generic proxy (cp.async,
// ordinary stores) before its later async-proxy accesses (wgmma reading B).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Orders global memory this thread acquired (written by other threads through the generic
// proxy) before its later async-proxy reads of it (TMA loads).
__device__ __forceinline__ void FenceProxyAsyncGlobal() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Barrier `id` over `threads` threads (a warpgroup's own barrier; id 0 is __syncthreads).
__device__ __forceinline__ void NamedBarrier(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ------------------------------------------------------------------------------------

// Descriptor of a K-major operand in shared memory without swizzle: 8x16-byte core matrices,
// `lbo` bytes apart along K, `sbo` bytes apart along N (PTX ISA, matrix descriptor format).
__device__ __forceinline__ uint64_t SmemDescNoSwizzle(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}
// Descriptor of a K-major operand in shared memory with the 128-byte swizzle: rows of 128 bytes
// (64 BF16 of K) in atoms of 8 rows (1024 bytes, 1024-aligned), 16-byte unit j of row r stored at
// unit j ^ (r % 8); consecutive 8-row groups 1024 bytes apart. `addr` is the atom's base plus the
// K offset of the step within the row (a multiple of 32 bytes for K16 BF16).
// As two words: the address word (address >> 4, leading byte offset 1) and a constant upper word
// (stride 1024 bytes, the swizzle mode). A K step adds its offset / 16 to the address word alone
// (shared addresses are below 2^18: no carry out of the field), which spares the 64-bit add and
// its carry per wgmma (1-2 % at BM 64).
inline constexpr uint32_t kSmemDescSwizzle128Hi = (1024 >> 4) | (1u << (62 - 32));
__device__ __forceinline__ uint32_t SmemDescSwizzle128Lo(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t SmemDescFromLo(uint32_t lo) {
  return (static_cast<uint64_t>(kSmemDescSwizzle128Hi) << 32) | lo;
}
// Byte offset of 16-byte unit `unit` (of 8 per 128-byte row) of row `row` in that layout.
__host__ __device__ constexpr uint32_t Swizzle128Offset(int row, int unit) {
  return static_cast<uint32_t>(row * 128 + ((unit ^ (row & 7)) << 4));
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Ties a register to the wgmma ordering points: the compiler may not move its reads or writes
// across the asm statements around it.
__device__ __forceinline__ void FenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void FenceOperand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// D (m64 x N, FP32, fresh: scale-d = 0) = A (m64 x k32 E4M3 in registers, the per-warp
// m16n8k32 A layout) x B (k32 x N E4M3, shared memory via descriptor).
template <int N>
struct WgmmaE4m3;

template <>
struct WgmmaE4m3<8> {
  static __device__ __forceinline__ void Run(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, "
        "1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(0));
  }
};

template <>
struct WgmmaE4m3<16> {
  static __device__ __forceinline__ void Run(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, %12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(0));
  }
};

template <>
struct WgmmaE4m3<32> {
  static __device__ __forceinline__ void Run(float (&d)[16], const uint32_t (&a)[4],
                                             uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, "
        "1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(0));
  }
};

template <>
struct WgmmaE4m3<64> {
  static __device__ __forceinline__ void Run(float (&d)[32], const uint32_t (&a)[4],
                                             uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%"
        "24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(0));
  }
};

// D (m64 x N, FP32, accumulated: scale-d = 1) += A (m64 x k16 BF16 in registers, the per-warp
// m16n8k16 A layout) x B (k16 x N BF16, K-major in shared memory by descriptor). One
// specialization per N the BM 64 role2 runs (its MMA widths: every multiple of 8 up to 80),
// each written out by GCMOE_WGMMA_BF16_RS from its accumulator operands' list: PTX names them
// %0.. in the instruction text, so each N has its own text.
template <int N>
struct WgmmaBf16Rs;

// Accumulator operands d[4k] .. d[4k + 3] of a wgmma's asm statement (also for the wgmma forms
// that only bench/gpu/wgmma_overlap times).
#define GCMOE_WGMMA_D4(k) \
  "+f"(d[4 * (k)]), "+f"(d[4 * (k) + 1]), "+f"(d[4 * (k) + 2]), "+f"(d[4 * (k) + 3])
#define GCMOE_WGMMA_D8(k) GCMOE_WGMMA_D4(2 * (k)), GCMOE_WGMMA_D4(2 * (k) + 1)
// D_TEXT lists the N / 2 accumulators, "%0,%1,..."; A_TEXT the A registers and the descriptor,
// the next five operands.
#define GCMOE_WGMMA_BF16_RS(N, D_TEXT, A_TEXT, ...)                                       \
  template <>                                                                             \
  struct WgmmaBf16Rs<N> {                                                                 \
    static __device__ __forceinline__ void Run(float (&d)[N / 2], const uint32_t (&a)[4], \
                                               uint64_t desc) {                           \
      asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" D_TEXT    \
                   "}, " A_TEXT ", 1, 1, 1, 0;\n"                                         \
                   : __VA_ARGS__                                                          \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));              \
    }                                                                                     \
  };

GCMOE_WGMMA_BF16_RS(8, "%0,%1,%2,%3", "{%4,%5,%6,%7}, %8", GCMOE_WGMMA_D4(0))
GCMOE_WGMMA_BF16_RS(16, "%0,%1,%2,%3,%4,%5,%6,%7", "{%8,%9,%10,%11}, %12", GCMOE_WGMMA_D8(0))
GCMOE_WGMMA_BF16_RS(24, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11", "{%12,%13,%14,%15}, %16",
                    GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D4(2))
GCMOE_WGMMA_BF16_RS(32, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15",
                    "{%16,%17,%18,%19}, %20", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1))
GCMOE_WGMMA_BF16_RS(40, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19",
                    "{%20,%21,%22,%23}, %24", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1),
                    GCMOE_WGMMA_D4(4))
GCMOE_WGMMA_BF16_RS(
    48, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23",
    "{%24,%25,%26,%27}, %28", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1), GCMOE_WGMMA_D8(2))
GCMOE_WGMMA_BF16_RS(56,
                    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                    "%22,%23,%24,%25,%26,%27",
                    "{%28,%29,%30,%31}, %32", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1),
                    GCMOE_WGMMA_D8(2), GCMOE_WGMMA_D4(6))
GCMOE_WGMMA_BF16_RS(64,
                    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                    "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31",
                    "{%32,%33,%34,%35}, %36", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1),
                    GCMOE_WGMMA_D8(2), GCMOE_WGMMA_D8(3))
GCMOE_WGMMA_BF16_RS(72,
                    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                    "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35",
                    "{%36,%37,%38,%39}, %40", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1),
                    GCMOE_WGMMA_D8(2), GCMOE_WGMMA_D8(3), GCMOE_WGMMA_D4(8))
GCMOE_WGMMA_BF16_RS(80,
                    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"
                    "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39",
                    "{%40,%41,%42,%43}, %44", GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1),
                    GCMOE_WGMMA_D8(2), GCMOE_WGMMA_D8(3), GCMOE_WGMMA_D8(4))
#undef GCMOE_WGMMA_BF16_RS

}  // namespace gcmoe::kernels
