// Relief with AVX-512F, sixteen rank lanes per block: the traits the shared passes and emission
// (relief_kernel_simd.h) run on, and their instantiation. Predicates live in k-registers, so the
// blends, the epsilon test and the sign are masked operations. The step's prologue and rank
// output are the AVX2 ones (relief_kernel_avx2.cc). Compiled through function attributes only;
// runs only when CpuHasAvx512() said yes.
//
// GCC 12's AVX-512 intrinsics seed unmasked results with _mm512_undefined_epi32(), which
// -Wmaybe-uninitialized reports at every inlined call (a known false positive). Clang has no
// such warning and refuses an unknown one under -Werror (the fuzz build, .ci/fuzz).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define GCMOE_RELIEF_SIMD_TARGET "avx512f"
#include "balancer/relief_kernel_simd.h"

namespace gcmoe::balancer::relief_internal {
namespace {

struct Avx512 {
  using Vec = __m512i;
  using Mask = __mmask16;
  static constexpr int kWidth = 16;
  static constexpr int kMaxXorBlocks = 4;

  GCMOE_SIMD_INLINE static Vec Load(const int32_t* p) { return _mm512_load_si512(p); }
  GCMOE_SIMD_INLINE static void Store(int32_t* p, Vec v) { _mm512_store_si512(p, v); }
  GCMOE_SIMD_INLINE static Vec Zero() { return _mm512_setzero_si512(); }
  GCMOE_SIMD_INLINE static Vec Set1(int32_t x) { return _mm512_set1_epi32(x); }
  GCMOE_SIMD_INLINE static Vec Add(Vec a, Vec b) { return _mm512_add_epi32(a, b); }
  GCMOE_SIMD_INLINE static Vec Sub(Vec a, Vec b) { return _mm512_sub_epi32(a, b); }
  GCMOE_SIMD_INLINE static Vec Xor(Vec a, Vec b) { return _mm512_xor_si512(a, b); }
  GCMOE_SIMD_INLINE static Vec Min(Vec a, Vec b) { return _mm512_min_epi32(a, b); }
  GCMOE_SIMD_INLINE static Vec Abs(Vec v) { return _mm512_abs_epi32(v); }
  GCMOE_SIMD_INLINE static Vec ShiftRight1(Vec v) { return _mm512_srli_epi32(v, 1); }
  GCMOE_SIMD_INLINE static Vec ShiftRightArith(Vec v, __m128i n) { return _mm512_sra_epi32(v, n); }
  GCMOE_SIMD_INLINE static Vec Permute(Vec v, Vec index) {
    return _mm512_permutexvar_epi32(index, v);
  }
  GCMOE_SIMD_INLINE static Mask Greater(Vec a, Vec b) { return _mm512_cmpgt_epi32_mask(a, b); }
  GCMOE_SIMD_INLINE static Mask MaskOf(Vec v) { return _mm512_test_epi32_mask(v, v); }
  GCMOE_SIMD_INLINE static Mask SourceMask(const int32_t*, uint32_t bits) {
    return static_cast<Mask>(bits);
  }
  GCMOE_SIMD_INLINE static Vec Select(Mask m, Vec a, Vec b) {
    return _mm512_mask_blend_epi32(m, b, a);
  }
  GCMOE_SIMD_INLINE static Vec KeepWhere(Mask m, Vec v) { return _mm512_maskz_mov_epi32(m, v); }
  // No vpsignd in AVX-512F: negate where s < 0. Where s == 0 this keeps v, which the callers
  // guarantee is 0 there.
  GCMOE_SIMD_INLINE static Vec WithSignOf(Vec v, Vec s) {
    return _mm512_mask_sub_epi32(v, _mm512_cmplt_epi32_mask(s, Zero()), Zero(), v);
  }
};

}  // namespace

bool CpuHasAvx512() {
  __builtin_cpu_init();
  // libgcc's check includes the OS having enabled the ZMM state (XGETBV). The AVX-512 path
  // also runs the AVX2 prologue and emission helpers, so it needs both.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2");
}

GCMOE_SIMD void RunPassesAvx512(const LaneProgram& program, int passes, int32_t* load,
                                int32_t* lane_mass, const int32_t* lane_tok, int32_t* partner) {
  RunPasses<Avx512>(program, passes, load, lane_mass, lane_tok, partner);
}

GCMOE_SIMD void EmitLoadsAvx512(const LaneProgram& program, int f, const int32_t* load_init,
                                const int32_t* lane_mass, const int32_t* lane_tok,
                                int32_t* load_after, int32_t* home_tokens) {
  EmitLoads<Avx512>(program, f, load_init, lane_mass, lane_tok, load_after, home_tokens);
}

}  // namespace gcmoe::balancer::relief_internal
