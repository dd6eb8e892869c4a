// Relief passes with AVX-512F, sixteen rank lanes per block (see LaneProgram in
// relief_kernels.h). The same operations as the AVX2 kernel; masks live in k-registers.
// Compiled through function attributes only; runs only when CpuHasAvx512() said yes.
//
// GCC 12's AVX-512 intrinsics seed unmasked results with _mm512_undefined_epi32(), which
// -Wmaybe-uninitialized reports at every inlined call (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "balancer/relief_kernels.h"

#define GCMOE_AVX512 __attribute__((target("avx512f"), always_inline)) inline

namespace gcmoe::balancer::relief_internal {
namespace {

constexpr int kWidth = 16;

GCMOE_AVX512 __m512i Load(const int32_t* p) { return _mm512_load_si512(p); }
GCMOE_AVX512 void Store(int32_t* p, __m512i v) { _mm512_store_si512(p, v); }

// See the AVX2 kernel's Move: the signed move seen from this side.
GCMOE_AVX512 __m512i Move(__m512i gap, __m512i a, __m512i t) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i half = _mm512_srli_epi32(_mm512_abs_epi32(gap), 1);
  const __m512i limit =
      _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(gap, zero), _mm512_sub_epi32(t, a), a);
  __m512i delta = _mm512_min_epi32(half, limit);
  delta = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(delta, _mm512_set1_epi32(1)), delta);
  return _mm512_mask_sub_epi32(delta, _mm512_cmplt_epi32_mask(gap, zero), zero, delta);
}


// Register fast path (LaneProgram::xor_mask), as in the AVX2 kernel.
template <int NB, int M, int K>
GCMOE_AVX512 void XorRoundOps(__m512i* l, const int32_t* xor_index, const int32_t* index,
                              int32_t* mass, const int32_t* tok) {
  if constexpr (K < NB) {
    constexpr int J = K ^ M;
    if constexpr (M == 0) {
      const __m512i a = Load(mass + K * kWidth);
      const __m512i other = _mm512_permutexvar_epi32(Load(index + xor_index[K] * kWidth), l[K]);
      const __m512i moved = Move(_mm512_sub_epi32(l[K], other), a, Load(tok + K * kWidth));
      l[K] = _mm512_sub_epi32(l[K], moved);
      Store(mass + K * kWidth, _mm512_sub_epi32(a, moved));
    } else if constexpr (J > K) {
      const __m512i a = Load(mass + K * kWidth);
      const int vec = xor_index[K];
      if (vec < 0) {
        const __m512i moved = Move(_mm512_sub_epi32(l[K], l[J]), a, Load(tok + K * kWidth));
        l[K] = _mm512_sub_epi32(l[K], moved);
        l[J] = _mm512_add_epi32(l[J], moved);
        Store(mass + K * kWidth, _mm512_sub_epi32(a, moved));
      } else {
        const int32_t* ab = index + vec * kWidth;
        const __m512i other = _mm512_permutexvar_epi32(Load(ab), l[J]);
        const __m512i moved = Move(_mm512_sub_epi32(l[K], other), a, Load(tok + K * kWidth));
        l[K] = _mm512_sub_epi32(l[K], moved);
        l[J] = _mm512_add_epi32(l[J], _mm512_permutexvar_epi32(Load(ab + kWidth), moved));
        Store(mass + K * kWidth, _mm512_sub_epi32(a, moved));
      }
    }
    XorRoundOps<NB, M, K + 1>(l, xor_index, index, mass, tok);
  }
}

template <int NB, int M>
GCMOE_AVX512 bool XorRoundIf(int mask, __m512i* l, const int32_t* xor_index,
                             const int32_t* index, int32_t* mass, const int32_t* tok) {
  if constexpr (M < NB) {
    if (mask == M) {
      XorRoundOps<NB, M, 0>(l, xor_index, index, mass, tok);
      return true;
    }
  }
  return false;
}

template <int NB>
__attribute__((target("avx512f"))) void RunXorPasses(const LaneProgram& program, int passes,
                                                      int32_t* __restrict load,
                                                      int32_t* __restrict lane_mass,
                                                      const int32_t* __restrict lane_tok) {
  __m512i l[NB];
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
      XorRoundIf<NB, 0>(m, l, xi, index, mass, tok) || XorRoundIf<NB, 1>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 2>(m, l, xi, index, mass, tok) ||
          XorRoundIf<NB, 3>(m, l, xi, index, mass, tok);
    }
  }
  for (int k = 0; k < NB; ++k) Store(load + k * kWidth, l[k]);
}

}  // namespace

bool CpuHasAvx512() {
  __builtin_cpu_init();
  // libgcc's check includes the OS having enabled the ZMM state (XGETBV). The AVX-512 path
  // also runs the AVX2 prologue and emission helpers, so it needs both.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2");
}

namespace {

// See the AVX2 kernel's EmitDelta.
GCMOE_AVX512 __m512i EmitDelta(__m512i a, __m512i t, __m512i home_side, __m512i half, __m128i f,
                               __m512i* home) {
  const __m512i mass = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(home_side, home_side),
                                               _mm512_sub_epi32(t, a), a);
  *home = _mm512_sra_epi32(_mm512_add_epi32(mass, half), f);
  const __m512i moved = _mm512_sub_epi32(_mm512_sra_epi32(t, f), *home);
  return _mm512_sub_epi32(_mm512_xor_si512(moved, home_side), home_side);
}

}  // namespace

__attribute__((target("avx512f"))) void EmitLoadsAvx512(const LaneProgram& program, int f,
                                                         const int32_t* __restrict load_init,
                                                         const int32_t* __restrict lane_mass,
                                                         const int32_t* __restrict lane_tok,
                                                         int32_t* __restrict load_after,
                                                         int32_t* __restrict home_tokens) {
  const int lanes = program.num_lanes;
  const __m128i shift = _mm_cvtsi32_si128(f);
  const __m512i half = _mm512_set1_epi32(f > 0 ? 1 << (f - 1) : 0);
  for (int off = 0; off < lanes; off += kWidth) {
    Store(load_after + off, _mm512_sra_epi32(Load(load_init + off), shift));
  }
  const int32_t* lane_home = program.lane_home.data();
  const int32_t* index = program.src_index.data();
  for (int r = 0; r < program.num_rounds; ++r) {
    const int base = r * lanes;
    for (int o = program.op_begin[r]; o < program.op_begin[r + 1]; ++o) {
      const LaneOp op = program.ops[o];
      const int first = op.kind == kGeneral ? 0 : op.block_a;
      const int last = op.kind == kGeneral ? program.num_blocks : op.block_a + 1;
      for (int k = first; k < last; ++k) {
        const int off = k * kWidth;
        __m512i home;
        const __m512i delta = EmitDelta(Load(lane_mass + base + off), Load(lane_tok + base + off),
                                        Load(lane_home + base + off), half, shift, &home);
        Store(home_tokens + base + off, home);
        Store(load_after + off, _mm512_add_epi32(Load(load_after + off), delta));
        if (op.kind == kPair) {
          const int b_off = op.block_b * kWidth;
          const __m512i mirrored =
              op.index < 0 ? delta
                           : _mm512_permutexvar_epi32(Load(index + (op.index + 1) * kWidth), delta);
          Store(load_after + b_off, _mm512_sub_epi32(Load(load_after + b_off), mirrored));
        }
      }
    }
  }
}

__attribute__((target("avx512f"))) void RunPassesAvx512(const LaneProgram& program, int passes,
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
          const __m512i l = Load(load + a_off);
          const __m512i other = _mm512_permutexvar_epi32(Load(index + op.index * kWidth), l);
          const __m512i a = Load(mass_r + a_off);
          const __m512i moved = Move(_mm512_sub_epi32(l, other), a, Load(tok_r + a_off));
          Store(load + a_off, _mm512_sub_epi32(l, moved));
          Store(mass_r + a_off, _mm512_sub_epi32(a, moved));
        } else if (op.kind == kPair) {
          const int b_off = op.block_b * kWidth;
          const __m512i la = Load(load + a_off);
          const __m512i lb = Load(load + b_off);
          const __m512i a = Load(mass_r + a_off);
          if (op.index < 0) {
            const __m512i moved = Move(_mm512_sub_epi32(la, lb), a, Load(tok_r + a_off));
            Store(load + a_off, _mm512_sub_epi32(la, moved));
            Store(load + b_off, _mm512_add_epi32(lb, moved));
            Store(mass_r + a_off, _mm512_sub_epi32(a, moved));
          } else {
            const int32_t* ab = index + op.index * kWidth;
            const __m512i other = _mm512_permutexvar_epi32(Load(ab), lb);
            const __m512i moved = Move(_mm512_sub_epi32(la, other), a, Load(tok_r + a_off));
            Store(load + a_off, _mm512_sub_epi32(la, moved));
            Store(load + b_off,
                  _mm512_add_epi32(lb, _mm512_permutexvar_epi32(Load(ab + kWidth), moved)));
            Store(mass_r + a_off, _mm512_sub_epi32(a, moved));
          }
        } else {
          const int32_t* begin = program.src_begin.data() + r * blocks;
          const int32_t* src_block = program.src_block.data();
          const int32_t* src_index = program.src_general_index.data();
          const uint32_t* src_bits = program.src_bits.data();
          for (int k = 0; k < blocks; ++k) {
            int s = begin[k];
            __m512i acc = _mm512_permutexvar_epi32(Load(src_index + s * kWidth),
                                                   Load(load + src_block[s] * kWidth));
            for (++s; s < begin[k + 1]; ++s) {
              acc = _mm512_mask_permutexvar_epi32(acc, static_cast<__mmask16>(src_bits[s]),
                                                  Load(src_index + s * kWidth),
                                                  Load(load + src_block[s] * kWidth));
            }
            Store(partner + k * kWidth, acc);
          }
          for (int k = 0; k < blocks; ++k) {
            const int off = k * kWidth;
            const __m512i l = Load(load + off);
            const __m512i a = Load(mass_r + off);
            const __m512i moved =
                Move(_mm512_sub_epi32(l, Load(partner + off)), a, Load(tok_r + off));
            Store(load + off, _mm512_sub_epi32(l, moved));
            Store(mass_r + off, _mm512_sub_epi32(a, moved));
          }
        }
      }
    }
  }
}

}  // namespace gcmoe::balancer::relief_internal
