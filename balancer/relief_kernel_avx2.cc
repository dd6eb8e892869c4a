// Relief passes with AVX2, eight rank lanes per block (see LaneProgram in relief_kernels.h).
// Compiled for AVX2 through function attributes only, so this file is safe to link into a
// binary that runs on older CPUs: nothing here runs unless CpuHasAvx2() said yes.
#include <immintrin.h>

#include <algorithm>

#include "balancer/relief_kernels.h"

#define GCMOE_AVX2 __attribute__((target("avx2"), always_inline)) inline

namespace gcmoe::balancer::relief_internal {
namespace {

constexpr int kWidth = 8;

GCMOE_AVX2 __m256i Load(const int32_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}
GCMOE_AVX2 void Store(int32_t* p, __m256i v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(p), v);
}

// The signed move of eight transfers seen from this side: positive when this side sends.
// gap = this load - partner load, a = tokens on this side's copy, t = the expert's total.
GCMOE_AVX2 __m256i Move(__m256i gap, __m256i a, __m256i t) {
  const __m256i half = _mm256_srli_epi32(_mm256_abs_epi32(gap), 1);
  // The heavier side sends at most what it holds: a when this side is heavier, else t - a.
  const __m256i limit =
      _mm256_blendv_epi8(_mm256_sub_epi32(t, a), a, _mm256_cmpgt_epi32(gap, _mm256_setzero_si256()));
  __m256i delta = _mm256_min_epi32(half, limit);
  delta = _mm256_and_si256(delta, _mm256_cmpgt_epi32(delta, _mm256_set1_epi32(1)));  // > epsilon
  return _mm256_sign_epi32(delta, gap);  // gap == 0 implies delta == 0
}


// Register fast path (LaneProgram::xor_mask): the NB load blocks live in registers for the whole
// solve; each round's block pairing is k <-> k ^ M, so with M a template argument every block
// index below is a compile-time constant.
template <int NB, int M, int K>
GCMOE_AVX2 void XorRoundOps(__m256i* l, const int32_t* xor_index, const int32_t* index,
                            int32_t* mass, const int32_t* tok) {
  if constexpr (K < NB) {
    constexpr int J = K ^ M;
    if constexpr (M == 0) {
      const __m256i a = Load(mass + K * kWidth);
      const __m256i other = _mm256_permutevar8x32_epi32(l[K], Load(index + xor_index[K] * kWidth));
      const __m256i moved = Move(_mm256_sub_epi32(l[K], other), a, Load(tok + K * kWidth));
      l[K] = _mm256_sub_epi32(l[K], moved);
      Store(mass + K * kWidth, _mm256_sub_epi32(a, moved));
    } else if constexpr (J > K) {
      const __m256i a = Load(mass + K * kWidth);
      const int vec = xor_index[K];
      if (vec < 0) {  // lane-aligned pairing
        const __m256i moved = Move(_mm256_sub_epi32(l[K], l[J]), a, Load(tok + K * kWidth));
        l[K] = _mm256_sub_epi32(l[K], moved);
        l[J] = _mm256_add_epi32(l[J], moved);
        Store(mass + K * kWidth, _mm256_sub_epi32(a, moved));
      } else {
        const int32_t* ab = index + vec * kWidth;
        const __m256i other = _mm256_permutevar8x32_epi32(l[J], Load(ab));
        const __m256i moved = Move(_mm256_sub_epi32(l[K], other), a, Load(tok + K * kWidth));
        l[K] = _mm256_sub_epi32(l[K], moved);
        l[J] = _mm256_add_epi32(l[J], _mm256_permutevar8x32_epi32(moved, Load(ab + kWidth)));
        Store(mass + K * kWidth, _mm256_sub_epi32(a, moved));
      }
    }
    XorRoundOps<NB, M, K + 1>(l, xor_index, index, mass, tok);
  }
}

template <int NB, int M>
GCMOE_AVX2 bool XorRoundIf(int mask, __m256i* l, const int32_t* xor_index, const int32_t* index,
                           int32_t* mass, const int32_t* tok) {
  if constexpr (M < NB) {
    if (mask == M) {
      XorRoundOps<NB, M, 0>(l, xor_index, index, mass, tok);
      return true;
    }
  }
  return false;
}

template <int NB>
__attribute__((target("avx2"))) void RunXorPasses(const LaneProgram& program, int passes,
                                                   int32_t* __restrict load,
                                                   int32_t* __restrict lane_mass,
                                                   const int32_t* __restrict lane_tok) {
  __m256i l[NB];
  for (int k = 0; k < NB; ++k) l[k] = Load(load + k * kWidth);
  const int lanes = program.num_lanes;
  const int rounds = program.num_rounds;
  const int32_t* masks = program.xor_mask.data();
  const int32_t* xor_index = program.xor_index.data();
  const int32_t* index = program.src_index.data();
  for (int p = 0; p < passes; ++p) {
    for (int r = 0; r < rounds; ++r) {
      int32_t* mass = lane_mass + r * lanes;
      const int32_t* tok = lane_tok + r * lanes;
      const int32_t* xi = xor_index + r * NB;
      const int m = masks[r];
      // At most one of these runs; a chain of compare-and-branch the predictor learns.
      XorRoundIf<NB, 0>(m, l, xi, index, mass, tok) || XorRoundIf<NB, 1>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 2>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 3>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 4>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 5>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 6>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 7>(m, l, xi, index, mass, tok);
    }
  }
  for (int k = 0; k < NB; ++k) Store(load + k * kWidth, l[k]);
}

}  // namespace

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

TokenScan __attribute__((target("avx2"))) ScanTokensAvx2(const int64_t* __restrict tokens,
                                                         int num_experts,
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

RankPeaks __attribute__((target("avx2"))) EmitRanksAvx2(const int32_t* __restrict lane_of_rank,
                                                       int num_ranks, int f,
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

__attribute__((target("avx2"))) void PrepareAvx2(
    const int64_t* __restrict tokens, int num_experts, int f, const int32_t* __restrict home_index,
    int home_rows, const int32_t* __restrict lane_expert, const int32_t* __restrict lane_home,
    const int32_t* __restrict fill_chunks, int num_fill_chunks, const LaneProgram& program,
    int32_t* __restrict tok_fx, int32_t* __restrict load, int32_t* __restrict load_init,
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
      sum = _mm256_add_epi32(sum, _mm256_i32gather_epi32(tok_fx, Load(home_index + row * lanes + off), 4));
    }
    Store(load + off, sum);
    Store(load_init + off, sum);
  }
  for (int c = 0; c < num_fill_chunks; ++c) {
    const int i = fill_chunks[c];
    const __m256i t = _mm256_i32gather_epi32(tok_fx, Load(lane_expert + i), 4);
    Store(lane_tok + i, t);
    Store(lane_mass + i, _mm256_and_si256(t, Load(lane_home + i)));
  }
}

namespace {

// A lane's rounded home share and the integer change of its load, for one round. The home
// share is round_half_up(mass) with mass = a on the home side and t - a on the host side (a is
// the lane's own amount). The change is home - total on the home side and total - home on the
// host side. In tokens: shifted right by f.
GCMOE_AVX2 __m256i EmitDelta(__m256i a, __m256i t, __m256i home_side, __m256i half, __m128i f,
                             __m256i* home) {
  const __m256i mass = _mm256_blendv_epi8(_mm256_sub_epi32(t, a), a, home_side);
  *home = _mm256_sra_epi32(_mm256_add_epi32(mass, half), f);
  const __m256i moved = _mm256_sub_epi32(_mm256_sra_epi32(t, f), *home);
  // -moved on the home side, +moved on the host side: negate where home_side is all ones.
  return _mm256_sub_epi32(_mm256_xor_si256(moved, home_side), home_side);
}

}  // namespace

__attribute__((target("avx2"))) void EmitLoadsAvx2(const LaneProgram& program, int f,
                                                    const int32_t* __restrict load_init,
                                                    const int32_t* __restrict lane_mass,
                                                    const int32_t* __restrict lane_tok,
                                                    int32_t* __restrict load_after,
                                                    int32_t* __restrict home_tokens) {
  const int lanes = program.num_lanes;
  const __m128i shift = _mm_cvtsi32_si128(f);
  const __m256i half = _mm256_set1_epi32(f > 0 ? 1 << (f - 1) : 0);
  for (int off = 0; off < lanes; off += kWidth) {
    Store(load_after + off, _mm256_sra_epi32(Load(load_init + off), shift));
  }
  const int32_t* lane_home = program.lane_home.data();
  const int32_t* index = program.src_index.data();
  for (int r = 0; r < program.num_rounds; ++r) {
    const int base = r * lanes;
    for (int o = program.op_begin[r]; o < program.op_begin[r + 1]; ++o) {
      const LaneOp op = program.ops[o];
      // kSelf: block a; kPair: block a, mirrored into b; kGeneral: every block.
      const int first = op.kind == kGeneral ? 0 : op.block_a;
      const int last = op.kind == kGeneral ? program.num_blocks : op.block_a + 1;
      for (int k = first; k < last; ++k) {
        const int off = k * kWidth;
        __m256i home;
        const __m256i delta = EmitDelta(Load(lane_mass + base + off), Load(lane_tok + base + off),
                                        Load(lane_home + base + off), half, shift, &home);
        Store(home_tokens + base + off, home);
        Store(load_after + off, _mm256_add_epi32(Load(load_after + off), delta));
        if (op.kind == kPair) {
          const int b_off = op.block_b * kWidth;
          const __m256i mirrored =
              op.index < 0 ? delta
                           : _mm256_permutevar8x32_epi32(delta, Load(index + (op.index + 1) * kWidth));
          Store(load_after + b_off, _mm256_sub_epi32(Load(load_after + b_off), mirrored));
        }
      }
    }
  }
}

// The state pointers are declared __restrict: they never alias each other or the program, and
// without the promise the compiler reloads the op list after every store.
__attribute__((target("avx2"))) void RunPassesAvx2(const LaneProgram& program, int passes,
                                                    int32_t* __restrict load,
                                                    int32_t* __restrict lane_mass,
                                                    const int32_t* __restrict lane_tok,
                                                    int32_t* __restrict partner) {
  const int blocks = program.num_blocks;
  if (!program.xor_mask.empty()) {
    switch (blocks) {
      case 1: return RunXorPasses<1>(program, passes, load, lane_mass, lane_tok);
      case 2: return RunXorPasses<2>(program, passes, load, lane_mass, lane_tok);
      case 4: return RunXorPasses<4>(program, passes, load, lane_mass, lane_tok);
      case 8: return RunXorPasses<8>(program, passes, load, lane_mass, lane_tok);
      default: break;
    }
  }
  const int lanes = program.num_lanes;
  const int rounds = program.num_rounds;
  const int32_t* op_begin = program.op_begin.data();
  const LaneOp* ops = program.ops.data();
  const int32_t* index = program.src_index.data();

  for (int p = 0; p < passes; ++p) {
    for (int r = 0; r < rounds; ++r) {
      int32_t* mass_r = lane_mass + r * lanes;
      const int32_t* tok_r = lane_tok + r * lanes;
      for (int o = op_begin[r]; o < op_begin[r + 1]; ++o) {
        const LaneOp op = ops[o];
        const int a_off = op.block_a * kWidth;
        if (op.kind == kSelf) {
          const __m256i l = Load(load + a_off);
          const __m256i other = _mm256_permutevar8x32_epi32(l, Load(index + op.index * kWidth));
          const __m256i a = Load(mass_r + a_off);
          const __m256i moved = Move(_mm256_sub_epi32(l, other), a, Load(tok_r + a_off));
          Store(load + a_off, _mm256_sub_epi32(l, moved));
          Store(mass_r + a_off, _mm256_sub_epi32(a, moved));
        } else if (op.kind == kPair) {
          const int b_off = op.block_b * kWidth;
          const __m256i la = Load(load + a_off);
          const __m256i lb = Load(load + b_off);
          const __m256i a = Load(mass_r + a_off);
          if (op.index < 0) {  // lane-aligned pairing
            const __m256i moved = Move(_mm256_sub_epi32(la, lb), a, Load(tok_r + a_off));
            Store(load + a_off, _mm256_sub_epi32(la, moved));
            Store(load + b_off, _mm256_add_epi32(lb, moved));
            Store(mass_r + a_off, _mm256_sub_epi32(a, moved));
          } else {
            const int32_t* ab = index + op.index * kWidth;
            const __m256i other = _mm256_permutevar8x32_epi32(lb, Load(ab));
            const __m256i moved = Move(_mm256_sub_epi32(la, other), a, Load(tok_r + a_off));
            Store(load + a_off, _mm256_sub_epi32(la, moved));
            Store(load + b_off,
                  _mm256_add_epi32(lb, _mm256_permutevar8x32_epi32(moved, Load(ab + kWidth))));
            Store(mass_r + a_off, _mm256_sub_epi32(a, moved));
          }
        } else {
          // kGeneral. Phase 1: partner loads, to scratch, because phase 2 overwrites loads
          // that later blocks of phase 1 still read.
          const int32_t* begin = program.src_begin.data() + r * blocks;
          const int32_t* src_block = program.src_block.data();
          const int32_t* src_index = program.src_general_index.data();
          const int32_t* src_mask = program.src_mask.data();
          for (int k = 0; k < blocks; ++k) {
            int s = begin[k];
            __m256i acc = _mm256_permutevar8x32_epi32(Load(load + src_block[s] * kWidth),
                                                      Load(src_index + s * kWidth));
            for (++s; s < begin[k + 1]; ++s) {
              const __m256i part = _mm256_permutevar8x32_epi32(Load(load + src_block[s] * kWidth),
                                                               Load(src_index + s * kWidth));
              acc = _mm256_blendv_epi8(acc, part, Load(src_mask + s * kWidth));
            }
            Store(partner + k * kWidth, acc);
          }
          // Phase 2: every lane applies its own side of its transfer's move.
          for (int k = 0; k < blocks; ++k) {
            const int off = k * kWidth;
            const __m256i l = Load(load + off);
            const __m256i a = Load(mass_r + off);
            const __m256i moved =
                Move(_mm256_sub_epi32(l, Load(partner + off)), a, Load(tok_r + off));
            Store(load + off, _mm256_sub_epi32(l, moved));
            Store(mass_r + off, _mm256_sub_epi32(a, moved));
          }
        }
      }
    }
  }
}

}  // namespace gcmoe::balancer::relief_internal
