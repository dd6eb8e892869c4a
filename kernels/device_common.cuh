// Device helpers shared by the role kernels: memory-ordering primitives (PTX acquire/release),
// the bounded spin-wait every cross-kernel wait goes through, and the number formats of
// DESIGN.md §4 mirrored bit for bit from engine/numerics.cc.
#pragma once

#include <cstdint>
#include <cstdio>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/layer_types.h"
#include "kernels/scale_bytes.h"
#include "kernels/wait_backoff.h"

namespace gcmoe::kernels {

// ---- memory ordering --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t LdAcquireGpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// System scope: the flag may be written by a peer GPU over NVLink.
__device__ __forceinline__ uint32_t LdAcquireSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void StReleaseGpu(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void RedAddReleaseGpu(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Several counters released at once: one fence, then relaxed adds. A fence.acq_rel followed by
// a strong write is a release pattern (PTX memory model), so each add releases what the fence
// orders, for the price of one fence (each red.release carries its own).
__device__ __forceinline__ void FenceAcqRelGpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
__device__ __forceinline__ void RedAddRelaxedGpu(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void RedAddReleaseSys(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t SmId() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// L2-only loads for data another kernel or CTA of this replay wrote: the ring, the quantized
// activations and the W1 outputs. They are read after an acquire, and bypassing L1 keeps a
// stale line of an earlier ring generation from ever being served.
__device__ __forceinline__ uint2 LdCg64(const void* p) {
  return __ldcg(reinterpret_cast<const uint2*>(p));
}
__device__ __forceinline__ uint32_t LdCg32(const void* p) {
  return __ldcg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint4 LdCg128(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}
// A warp's shared-memory read of a weight chunk's codes (weight_tiles_sm90.h: 512-byte pieces,
// 16 bytes per lane): lane `lane`'s words of piece q land in w[4 q .. 4 q + 3].
template <int kPieces>
__device__ __forceinline__ void LoadLaneWords(const uint8_t* chunk, int lane,
                                              uint32_t (&w)[4 * kPieces]) {
#pragma unroll
  for (int q = 0; q < kPieces; ++q) {
    const uint4 v = *reinterpret_cast<const uint4*>(chunk + q * 512 + lane * 16);
    w[q * 4 + 0] = v.x;
    w[q * 4 + 1] = v.y;
    w[q * 4 + 2] = v.z;
    w[q * 4 + 3] = v.w;
  }
}
// Volatile loads (ld.cv: any cached copy is stale, fetch again) for another GPU's memory, which
// a cache of this GPU need not see change.
__device__ __forceinline__ uint4 LdCv128(const void* p) {
  return __ldcv(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint32_t LdCv32(const void* p) {
  return __ldcv(reinterpret_cast<const unsigned int*>(p));
}

// ---- bounded waits ----------------------------------------------------------------------------

// What every wait needs besides its flag, gathered once per kernel so a wait costs no copy of
// the parameter block.
struct WaitEnv {
  const volatile uint64_t* abort_generation;
  uint64_t generation;
  uint64_t timeout_ns;
  WaitDiagnostic* diag;
  const Signals* sig;
  int32_t role;
  uint32_t max_sleep_ns;  // LayerParams::wait_sleep_ns (NextWaitSleep's long cap)
};

__device__ __forceinline__ WaitEnv MakeWaitEnv(const LayerParams& p, int role) {
  return WaitEnv{p.abort_generation, p.header->generation, p.timeout_ns, p.diag, p.sig, role,
                 p.wait_sleep_ns};
}

__device__ __forceinline__ bool StepAborted(const WaitEnv& env) {
  return env.abort_generation != nullptr && env.generation != 0 &&
         *env.abort_generation >= env.generation;
}

// Records an expired wait in the host-mapped diagnostic (the first one wins), so the host can
// name it after the trap; returns the replay it happened in.
__device__ __forceinline__ uint32_t RecordTimeout(const WaitEnv& env, int what, int index,
                                                  uint32_t target, uint32_t seen) {
  const uint32_t replay = env.sig->replays;
  if (env.diag != nullptr && atomicCAS(&env.diag->timed_out, 0, 1) == 0) {
    env.diag->role = env.role;
    env.diag->what = what;
    env.diag->index = index;
    env.diag->target = target;
    env.diag->seen = seen;
    env.diag->replay = replay;
    __threadfence_system();
  }
  return replay;
}

// Spins until *flag >= target. Returns false when the step was aborted (the caller leaves its
// loop; role3 still restores the signal invariant). On timeout it records and prints what it
// waited for, then traps: a lost peer kills the step instead of hanging the device.
static __device__ __noinline__ bool WaitAtLeast(WaitEnv env, const uint32_t* flag, uint32_t target,
                                                bool system_scope, int what, int index) {
  uint32_t seen = system_scope ? LdAcquireSys(flag) : LdAcquireGpu(flag);
  if (seen >= target) return true;
  const uint64_t start = GlobalTimerNs();
  uint32_t sleep_ns = kFirstWaitSleepNs;
  for (uint32_t spin = 1;; ++spin) {
    __nanosleep(sleep_ns);
    sleep_ns = NextWaitSleep(sleep_ns, spin, env.max_sleep_ns);
    seen = system_scope ? LdAcquireSys(flag) : LdAcquireGpu(flag);
    if (seen >= target) return true;
    if ((spin & 63) == 0) {
      if (StepAborted(env)) return false;
      if (GlobalTimerNs() - start > env.timeout_ns) {
        const uint32_t replay = RecordTimeout(env, what, index, target, seen);
        printf("gcmoe role%d: timed out waiting for %s %d: need >= %u, saw %u (replay %u)\n",
               env.role, WaitWhatName(what), index, target, seen, replay);
        __trap();
      }
    }
  }
}

// ---- number formats (engine/numerics.h, bit for bit) ------------------------------------------

// 2^(127 - code): the exact inverse of a block scale (a multiply equals the division).
__device__ __forceinline__ float InverseScale(uint32_t code) {
  const int e = 127 - static_cast<int>(code);  // [-127, 127]
  return __uint_as_float(e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 0x00400000u);
}
// Round to nearest even, saturate to +-448 (cvt.rn.satfinite).
__device__ __forceinline__ uint32_t EncodeE4m3(float v) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
// The same for two values, `lo` in the low byte: one cvt.rn.satfinite.e4m3x2.f32.
__device__ __forceinline__ uint32_t EncodeE4m3x2(float lo, float hi) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
__device__ __forceinline__ uint32_t Bf16Bits(float v) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
}
__device__ __forceinline__ float Bf16ToFloat(uint32_t bits) { return __uint_as_float(bits << 16); }

}  // namespace gcmoe::kernels
