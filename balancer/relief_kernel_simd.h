// The Relief SIMD passes and emission, written once over the instruction set: the loops walk the
// lane program (LaneProgram in relief_kernels.h) a block of T::kWidth lanes at a time, and every
// vector operation goes through a traits struct T. relief_kernel_avx2.cc and
// relief_kernel_avx512.cc each hold their traits and instantiate RunPasses<T> and EmitLoads<T>
// behind the entry points relief_kernels.h declares. All arithmetic is on int32 lanes, so both
// instantiations match the scalar reference bit for bit.
//
// The ISA reaches this code through function attributes only, so the kernels link into binaries
// that run on CPUs without it (nothing here runs unless CpuHasAvx2() / CpuHasAvx512() said yes).
// An attribute cannot come from a template argument, so the including file names its target
// before the include, once per file:
//   #define GCMOE_RELIEF_SIMD_TARGET "avx2"
//   #include "balancer/relief_kernel_simd.h"
// Every function here, and every member of the traits (declared GCMOE_SIMD_INLINE), carries that
// target, since an intrinsic inlines only into a function compiled for its ISA. Everything sits
// in an unnamed namespace: each ISA file compiles its own copy for its own target.
//
// A traits struct T has, all static:
//   Vec                      kWidth int32 lanes
//   Mask                     a per-lane predicate in the ISA's own form (a vector of all-ones or
//                            zero lanes for AVX2, a k-register for AVX-512)
//   kWidth                   lanes per block, the LaneProgram's width
//   kMaxXorBlocks            the largest block count the register fast path is instantiated for
//                            (a power of two; lane_program.cc's PassCost assumes the same)
//   Load(p), Store(p, v)     aligned block access
//   Zero(), Set1(x)
//   Add, Sub, Xor, Min, Abs  lane-wise, signed where it matters
//   ShiftRight1(v)           logical shift right by one
//   ShiftRightArith(v, n)    arithmetic shift right by the count in the low 64 bits of n
//   Permute(v, index)        lane j of the result is lane index[j] of v
//   Greater(a, b)            the Mask of a > b
//   MaskOf(v)                the Mask of a vector whose lanes are all ones or zero
//   SourceMask(lanes, bits)  the Mask of a kGeneral source, from whichever of the program's two
//                            encodings suits the ISA: `lanes` (src_mask, -1 / 0 per lane) or
//                            `bits` (src_bits, a bit per lane)
//   Select(m, a, b)          a where m, else b
//   KeepWhere(m, v)          v where m, else 0
//   WithSignOf(v, s)         v where s > 0, -v where s < 0; callers guarantee v == 0 where s == 0
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "balancer/relief_kernels.h"

#ifndef GCMOE_RELIEF_SIMD_TARGET
#error "define GCMOE_RELIEF_SIMD_TARGET (the target attribute string) before including this header"
#endif

#define GCMOE_SIMD __attribute__((target(GCMOE_RELIEF_SIMD_TARGET)))
#define GCMOE_SIMD_INLINE __attribute__((target(GCMOE_RELIEF_SIMD_TARGET), always_inline)) inline

namespace gcmoe::balancer::relief_internal {
namespace {

// The signed move of kWidth transfers seen from this side: positive when this side sends.
// gap = this load - partner load, a = tokens on this side's copy, t = the expert's total.
template <typename T>
GCMOE_SIMD_INLINE typename T::Vec Move(typename T::Vec gap, typename T::Vec a, typename T::Vec t) {
  using V = typename T::Vec;
  const V half = T::ShiftRight1(T::Abs(gap));
  // The heavier side sends at most what it holds: a when this side is heavier, else t - a.
  const V limit = T::Select(T::Greater(gap, T::Zero()), a, T::Sub(t, a));
  V delta = T::Min(half, limit);
  delta = T::KeepWhere(T::Greater(delta, T::Set1(1)), delta);  // > epsilon
  return T::WithSignOf(delta, gap);                            // gap == 0 implies delta == 0
}

// Register fast path (LaneProgram::xor_mask): the NB load blocks live in registers for the whole
// solve; each round's block pairing is k <-> k ^ M, so with M a template argument every block
// index below is a compile-time constant.
template <typename T, int NB, int M, int K>
GCMOE_SIMD_INLINE void XorRoundOps(typename T::Vec* l, const int32_t* xor_index,
                                   const int32_t* index, int32_t* mass, const int32_t* tok) {
  using V = typename T::Vec;
  constexpr int W = T::kWidth;
  if constexpr (K < NB) {
    constexpr int J = K ^ M;
    if constexpr (M == 0) {
      const V a = T::Load(mass + K * W);
      const V other = T::Permute(l[K], T::Load(index + xor_index[K] * W));
      const V moved = Move<T>(T::Sub(l[K], other), a, T::Load(tok + K * W));
      l[K] = T::Sub(l[K], moved);
      T::Store(mass + K * W, T::Sub(a, moved));
    } else if constexpr (J > K) {
      const V a = T::Load(mass + K * W);
      const int vec = xor_index[K];
      if (vec < 0) {  // lane-aligned pairing
        const V moved = Move<T>(T::Sub(l[K], l[J]), a, T::Load(tok + K * W));
        l[K] = T::Sub(l[K], moved);
        l[J] = T::Add(l[J], moved);
        T::Store(mass + K * W, T::Sub(a, moved));
      } else {
        const int32_t* ab = index + vec * W;
        const V other = T::Permute(l[J], T::Load(ab));
        const V moved = Move<T>(T::Sub(l[K], other), a, T::Load(tok + K * W));
        l[K] = T::Sub(l[K], moved);
        l[J] = T::Add(l[J], T::Permute(moved, T::Load(ab + W)));
        T::Store(mass + K * W, T::Sub(a, moved));
      }
    }
    XorRoundOps<T, NB, M, K + 1>(l, xor_index, index, mass, tok);
  }
}

// One round of the fast path: the ops of the round whose mask is `mask`. At most one arm runs;
// a chain of compare-and-branch the predictor learns.
template <typename T, int NB, int... M>
GCMOE_SIMD_INLINE void XorRound(int mask, typename T::Vec* l, const int32_t* xor_index,
                                const int32_t* index, int32_t* mass, const int32_t* tok,
                                std::integer_sequence<int, M...>) {
  (void)((mask == M && (XorRoundOps<T, NB, M, 0>(l, xor_index, index, mass, tok), true)) || ...);
}

template <typename T, int NB>
GCMOE_SIMD void RunXorPasses(const LaneProgram& program, int passes, int32_t* __restrict load,
                             int32_t* __restrict lane_mass, const int32_t* __restrict lane_tok) {
  constexpr int W = T::kWidth;
  typename T::Vec l[NB];
  for (int k = 0; k < NB; ++k) l[k] = T::Load(load + k * W);
  const int lanes = program.num_lanes;
  const int rounds = program.num_rounds;
  const int32_t* masks = program.xor_mask.data();
  const int32_t* xor_index = program.xor_index.data();
  const int32_t* index = program.src_index.data();
  for (int p = 0; p < passes; ++p) {
    for (int r = 0; r < rounds; ++r) {
      XorRound<T, NB>(masks[r], l, xor_index + r * NB, index, lane_mass + r * lanes,
                      lane_tok + r * lanes, std::make_integer_sequence<int, NB>());
    }
  }
  for (int k = 0; k < NB; ++k) T::Store(load + k * W, l[k]);
}

// Runs the fast path when the program has NB blocks and the ISA instantiates NB.
template <typename T, int NB>
GCMOE_SIMD_INLINE bool RunXorPassesIf(const LaneProgram& program, int passes, int32_t* load,
                                      int32_t* lane_mass, const int32_t* lane_tok) {
  if constexpr (NB <= T::kMaxXorBlocks) {
    if (program.num_blocks == NB) {
      RunXorPasses<T, NB>(program, passes, load, lane_mass, lane_tok);
      return true;
    }
  }
  return false;
}

// `passes` full passes over the program (RunPassesAvx2 / RunPassesAvx512). The state pointers
// are declared __restrict: they never alias each other or the program, and without the promise
// the compiler reloads the op list after every store.
template <typename T>
GCMOE_SIMD void RunPasses(const LaneProgram& program, int passes, int32_t* __restrict load,
                          int32_t* __restrict lane_mass, const int32_t* __restrict lane_tok,
                          int32_t* __restrict partner) {
  using V = typename T::Vec;
  constexpr int W = T::kWidth;
  if (!program.xor_mask.empty() &&
      (RunXorPassesIf<T, 1>(program, passes, load, lane_mass, lane_tok) ||
       RunXorPassesIf<T, 2>(program, passes, load, lane_mass, lane_tok) ||
       RunXorPassesIf<T, 4>(program, passes, load, lane_mass, lane_tok) ||
       RunXorPassesIf<T, 8>(program, passes, load, lane_mass, lane_tok))) {
    return;
  }
  const int blocks = program.num_blocks;
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
        const int a_off = op.block_a * W;
        if (op.kind == kSelf) {
          const V l = T::Load(load + a_off);
          const V other = T::Permute(l, T::Load(index + op.index * W));
          const V a = T::Load(mass_r + a_off);
          const V moved = Move<T>(T::Sub(l, other), a, T::Load(tok_r + a_off));
          T::Store(load + a_off, T::Sub(l, moved));
          T::Store(mass_r + a_off, T::Sub(a, moved));
        } else if (op.kind == kPair) {
          const int b_off = op.block_b * W;
          const V la = T::Load(load + a_off);
          const V lb = T::Load(load + b_off);
          const V a = T::Load(mass_r + a_off);
          if (op.index < 0) {  // lane-aligned pairing
            const V moved = Move<T>(T::Sub(la, lb), a, T::Load(tok_r + a_off));
            T::Store(load + a_off, T::Sub(la, moved));
            T::Store(load + b_off, T::Add(lb, moved));
            T::Store(mass_r + a_off, T::Sub(a, moved));
          } else {
            const int32_t* ab = index + op.index * W;
            const V other = T::Permute(lb, T::Load(ab));
            const V moved = Move<T>(T::Sub(la, other), a, T::Load(tok_r + a_off));
            T::Store(load + a_off, T::Sub(la, moved));
            T::Store(load + b_off, T::Add(lb, T::Permute(moved, T::Load(ab + W))));
            T::Store(mass_r + a_off, T::Sub(a, moved));
          }
        } else {
          // kGeneral. Phase 1: partner loads, to scratch, because phase 2 overwrites loads
          // that later blocks of phase 1 still read.
          const int32_t* begin = program.src_begin.data() + r * blocks;
          const int32_t* src_block = program.src_block.data();
          const int32_t* src_index = program.src_general_index.data();
          const int32_t* src_mask = program.src_mask.data();
          const uint32_t* src_bits = program.src_bits.data();
          for (int k = 0; k < blocks; ++k) {
            int s = begin[k];
            V acc = T::Permute(T::Load(load + src_block[s] * W), T::Load(src_index + s * W));
            for (++s; s < begin[k + 1]; ++s) {
              const V part =
                  T::Permute(T::Load(load + src_block[s] * W), T::Load(src_index + s * W));
              acc = T::Select(T::SourceMask(src_mask + s * W, src_bits[s]), part, acc);
            }
            T::Store(partner + k * W, acc);
          }
          // Phase 2: every lane applies its own side of its transfer's move.
          for (int k = 0; k < blocks; ++k) {
            const int off = k * W;
            const V l = T::Load(load + off);
            const V a = T::Load(mass_r + off);
            const V moved = Move<T>(T::Sub(l, T::Load(partner + off)), a, T::Load(tok_r + off));
            T::Store(load + off, T::Sub(l, moved));
            T::Store(mass_r + off, T::Sub(a, moved));
          }
        }
      }
    }
  }
}

// A lane's rounded home share and the integer change of its load, for one round. The home
// share is round_half_up(mass) with mass = a on the home side and t - a on the host side (a is
// the lane's own amount). The change is home - total on the home side and total - home on the
// host side. In tokens: shifted right by f.
template <typename T>
GCMOE_SIMD_INLINE typename T::Vec EmitDelta(typename T::Vec a, typename T::Vec t,
                                            typename T::Vec home_side, typename T::Vec half,
                                            __m128i f, typename T::Vec* home) {
  using V = typename T::Vec;
  const V mass = T::Select(T::MaskOf(home_side), a, T::Sub(t, a));
  *home = T::ShiftRightArith(T::Add(mass, half), f);
  const V moved = T::Sub(T::ShiftRightArith(t, f), *home);
  // -moved on the home side, +moved on the host side: negate where home_side is all ones.
  return T::Sub(T::Xor(moved, home_side), home_side);
}

// The integer loads and home shares under the emitted split (EmitLoadsAvx2 / EmitLoadsAvx512).
template <typename T>
GCMOE_SIMD void EmitLoads(const LaneProgram& program, int f, const int32_t* __restrict load_init,
                          const int32_t* __restrict lane_mass, const int32_t* __restrict lane_tok,
                          int32_t* __restrict load_after, int32_t* __restrict home_tokens) {
  using V = typename T::Vec;
  constexpr int W = T::kWidth;
  const int lanes = program.num_lanes;
  const __m128i shift = _mm_cvtsi32_si128(f);
  const V half = T::Set1(f > 0 ? 1 << (f - 1) : 0);
  for (int off = 0; off < lanes; off += W) {
    T::Store(load_after + off, T::ShiftRightArith(T::Load(load_init + off), shift));
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
        const int off = k * W;
        V home;
        const V delta =
            EmitDelta<T>(T::Load(lane_mass + base + off), T::Load(lane_tok + base + off),
                         T::Load(lane_home + base + off), half, shift, &home);
        T::Store(home_tokens + base + off, home);
        T::Store(load_after + off, T::Add(T::Load(load_after + off), delta));
        if (op.kind == kPair) {
          const int b_off = op.block_b * W;
          const V mirrored =
              op.index < 0 ? delta : T::Permute(delta, T::Load(index + (op.index + 1) * W));
          T::Store(load_after + b_off, T::Sub(T::Load(load_after + b_off), mirrored));
        }
      }
    }
  }
}

}  // namespace
}  // namespace gcmoe::balancer::relief_internal
