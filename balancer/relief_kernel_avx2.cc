// Relief with AVX2, eight rank lanes per block: the traits the shared passes and emission
// (relief_kernel_simd.h) run on, their instantiation, and the step's prologue and rank output,
// which the AVX-512 kernel uses too (every AVX-512 CPU has AVX2). Compiled for AVX2 through
// function attributes only, so this file is safe to link into a binary that runs on older CPUs:
// nothing here runs unless CpuHasAvx2() said yes.
#define GCMOE_RELIEF_SIMD_TARGET "avx2"
#include "balancer/relief_kernel_simd.h"

#include <algorithm>

namespace gcmoe::balancer::relief_internal {
namespace {

// Masks are vectors of all-ones or zero lanes, as the compares make them and blendv reads them.
struct Avx2 {
  using Vec = __m256i;
  using Mask = __m256i;
  static constexpr int kWidth = 8;
  static constexpr int kMaxXorBlocks = 8;

  GCMOE_SIMD_INLINE static Vec Load(const int32_t* p) {
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
  }
  GCMOE_SIMD_INLINE static void Store(int32_t* p, Vec v) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(p), v);
  }
  GCMOE_SIMD_INLINE static Vec Zero() { return _mm256_setzero_si256(); }
  GCMOE_SIMD_INLINE static Vec Set1(int32_t x) { return _mm256_set1_epi32(x); }
  GCMOE_SIMD_INLINE static Vec Add(Vec a, Vec b) { return _mm256_add_epi32(a, b); }
  GCMOE_SIMD_INLINE static Vec Sub(Vec a, Vec b) { return _mm256_sub_epi32(a, b); }
  GCMOE_SIMD_INLINE static Vec Xor(Vec a, Vec b) { return _mm256_xor_si256(a, b); }
  GCMOE_SIMD_INLINE static Vec Min(Vec a, Vec b) { return _mm256_min_epi32(a, b); }
  GCMOE_SIMD_INLINE static Vec Abs(Vec v) { return _mm256_abs_epi32(v); }
  GCMOE_SIMD_INLINE static Vec ShiftRight1(Vec v) { return _mm256_srli_epi32(v, 1); }
  GCMOE_SIMD_INLINE static Vec ShiftRightArith(Vec v, __m128i n) { return _mm256_sra_epi32(v, n); }
  GCMOE_SIMD_INLINE static Vec Permute(Vec v, Vec index) {
    return _mm256_permutevar8x32_epi32(v, index);
  }
  GCMOE_SIMD_INLINE static Mask Greater(Vec a, Vec b) { return _mm256_cmpgt_epi32(a, b); }
  GCMOE_SIMD_INLINE static Mask MaskOf(Vec v) { return v; }
  GCMOE_SIMD_INLINE static Mask SourceMask(const int32_t* lanes, uint32_t) { return Load(lanes); }
  GCMOE_SIMD_INLINE static Vec Select(Mask m, Vec a, Vec b) { return _mm256_blendv_epi8(b, a, m); }
  GCMOE_SIMD_INLINE static Vec KeepWhere(Mask m, Vec v) { return _mm256_and_si256(v, m); }
  // vpsignd: v, -v or 0 as s is positive, negative or zero.
  GCMOE_SIMD_INLINE static Vec WithSignOf(Vec v, Vec s) { return _mm256_sign_epi32(v, s); }
};

constexpr int kWidth = Avx2::kWidth;

}  // namespace

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

GCMOE_SIMD void RunPassesAvx2(const LaneProgram& program, int passes, int32_t* load,
                              int32_t* lane_mass, const int32_t* lane_tok, int32_t* partner) {
  RunPasses<Avx2>(program, passes, load, lane_mass, lane_tok, partner);
}

GCMOE_SIMD void EmitLoadsAvx2(const LaneProgram& program, int f, const int32_t* load_init,
                              const int32_t* lane_mass, const int32_t* lane_tok,
                              int32_t* load_after, int32_t* home_tokens) {
  EmitLoads<Avx2>(program, f, load_init, lane_mass, lane_tok, load_after, home_tokens);
}

GCMOE_SIMD TokenScan ScanTokensAvx2(const int64_t* __restrict tokens, int num_experts,
                                    int64_t* __restrict copy) {
  __m256i all = _mm256_setzero_si256();
  __m256i sum = _mm256_setzero_si256();
  int e = 0;
  for (; e + 4 <= num_experts; e += 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tokens + e));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(copy + e), v);
    all = _mm256_or_si256(all, v);
    sum = _mm256_add_epi64(sum, v);
  }
  alignas(32) uint64_t a[4], s[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), all);
  _mm256_store_si256(reinterpret_cast<__m256i*>(s), sum);
  TokenScan scan{a[0] | a[1] | a[2] | a[3], s[0] + s[1] + s[2] + s[3]};
  for (; e < num_experts; ++e) {
    copy[e] = tokens[e];
    scan.all_bits |= static_cast<uint64_t>(tokens[e]);
    scan.total += static_cast<uint64_t>(tokens[e]);
  }
  return scan;
}

GCMOE_SIMD RankPeaks EmitRanksAvx2(const int32_t* __restrict lane_of_rank, int num_ranks, int f,
                                   const int32_t* __restrict load_init,
                                   const int32_t* __restrict load_after_lanes,
                                   int64_t* __restrict load_before,
                                   int64_t* __restrict load_after) {
  const __m128i shift = _mm_cvtsi32_si128(f);
  __m256i peak_before = _mm256_setzero_si256();
  __m256i peak_after = _mm256_setzero_si256();
  int r = 0;
  for (; r + kWidth <= num_ranks; r += kWidth) {
    const __m256i lane = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lane_of_rank + r));
    const __m256i before = _mm256_sra_epi32(_mm256_i32gather_epi32(load_init, lane, 4), shift);
    const __m256i after = _mm256_i32gather_epi32(load_after_lanes, lane, 4);
    peak_before = _mm256_max_epi32(peak_before, before);
    peak_after = _mm256_max_epi32(peak_after, after);
    auto* b = reinterpret_cast<__m256i*>(load_before + r);
    auto* a = reinterpret_cast<__m256i*>(load_after + r);
    _mm256_storeu_si256(b, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(before)));
    _mm256_storeu_si256(b + 1, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(before, 1)));
    _mm256_storeu_si256(a, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(after)));
    _mm256_storeu_si256(a + 1, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(after, 1)));
  }
  alignas(32) int32_t pb[kWidth], pa[kWidth];
  _mm256_store_si256(reinterpret_cast<__m256i*>(pb), peak_before);
  _mm256_store_si256(reinterpret_cast<__m256i*>(pa), peak_after);
  RankPeaks peaks{0, 0};
  for (int j = 0; j < kWidth; ++j) {
    peaks.before = std::max<int64_t>(peaks.before, pb[j]);
    peaks.after = std::max<int64_t>(peaks.after, pa[j]);
  }
  for (; r < num_ranks; ++r) {
    load_before[r] = load_init[lane_of_rank[r]] >> f;
    load_after[r] = load_after_lanes[lane_of_rank[r]];
    peaks.before = std::max(peaks.before, load_before[r]);
    peaks.after = std::max(peaks.after, load_after[r]);
  }
  return peaks;
}

GCMOE_SIMD void PrepareAvx2(const int64_t* __restrict tokens, int num_experts, int f,
                            const int32_t* __restrict home_index, int home_rows,
                            const int32_t* __restrict lane_expert,
                            const int32_t* __restrict lane_home,
                            const int32_t* __restrict fill_chunks, int num_fill_chunks,
                            const LaneProgram& program, int32_t* __restrict tok_fx,
                            int32_t* __restrict load, int32_t* __restrict load_init,
                            int32_t* __restrict lane_mass, int32_t* __restrict lane_tok) {
  // Counts << f, narrowed to 32 bits (the caller chose f so that they fit): the low halves of
  // two vectors of four 64-bit counts, gathered into one vector of eight.
  const __m128i shift = _mm_cvtsi32_si128(f);
  const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  int e = 0;
  for (; e + 8 <= num_experts; e += 8) {
    const __m256i lo = _mm256_permutevar8x32_epi32(
        _mm256_sll_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tokens + e)), shift),
        low_halves);
    const __m256i hi = _mm256_permutevar8x32_epi32(
        _mm256_sll_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tokens + e + 4)), shift),
        low_halves);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tok_fx + e), _mm256_permute2x128_si256(lo, hi, 0x20));
  }
  for (; e < num_experts; ++e) tok_fx[e] = static_cast<int32_t>(tokens[e] << f);
  tok_fx[num_experts] = 0;

  const int lanes = program.num_lanes;
  for (int off = 0; off < lanes; off += kWidth) {
    __m256i sum = _mm256_setzero_si256();
    for (int row = 0; row < home_rows; ++row) {
      sum = _mm256_add_epi32(
          sum, _mm256_i32gather_epi32(tok_fx, Avx2::Load(home_index + row * lanes + off), 4));
    }
    Avx2::Store(load + off, sum);
    Avx2::Store(load_init + off, sum);
  }
  for (int c = 0; c < num_fill_chunks; ++c) {
    const int i = fill_chunks[c];
    const __m256i t = _mm256_i32gather_epi32(tok_fx, Avx2::Load(lane_expert + i), 4);
    Avx2::Store(lane_tok + i, t);
    Avx2::Store(lane_mass + i, _mm256_and_si256(t, Avx2::Load(lane_home + i)));
  }
}

}  // namespace gcmoe::balancer::relief_internal
