// Internal to the balancer: the kernels that run Relief passes, and the lane program the SIMD
// kernels walk. Not part of the public API; relief.h is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "balancer/transfer_list.h"

namespace gcmoe::balancer::relief_internal {

// 64-byte aligned storage so every SIMD block load is aligned and never splits a cache line.
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, ((n * sizeof(T) + 63) / 64) * 64);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
};
using AlignedInts = std::vector<int32_t, AlignedAllocator<int32_t>>;

// The transfer list in "rank lane" form. Each lane carries one rank (lane_of_rank; padding
// lanes up to a multiple of `width` carry none). In round r, the lane of rank i belongs to the
// one transfer of that round touching rank i, and sees it from rank i: gap = L[i] - L[partner],
// this copy's amount a, the expert's total t (so the partner's amount is t - a). Both ends of a transfer compute the same delta
// from that view (the heavier side sends min(|gap| >> 1, its amount)), so a lane can apply its
// own half of the move without any scatter. A rank no transfer of the round touches is its
// own partner: gap 0, move 0.
//
// A round is a list of block operations:
//  kSelf    every lane of block a pairs inside block a: one permute gives the partner loads.
//  kPair    every lane of block a pairs with a lane of block b and vice versa: the transfers are
//           computed once, from block a's lanes, and block b receives the mirrored move
//           (permuted back unless the pairing is lane-aligned).
//  kGeneral anything else (lanes of a block pairing into several blocks): the whole round runs
//           in two phases, partner loads from per-block source lists, then every lane.
// Only the lanes that compute (all lanes of kSelf and kGeneral blocks, block a of kPair) hold
// per-step state; `transfer_slot` says where each transfer's state lives.
enum LaneOpKind : int32_t { kSelf = 0, kPair = 1, kGeneral = 2 };

struct LaneOp {
  int32_t kind = kSelf;
  int32_t block_a = 0;
  int32_t block_b = 0;
  int32_t index = -1;  // kSelf: partner lanes at src_index[index * width]; kPair: a->b lanes
                       // there and b->a lanes at the next vector; -1 when lane-aligned
};

struct LaneProgram {
  int width = 0;       // lanes per block: 8 (AVX2) or 16 (AVX-512)
  int num_ranks = 0;
  int num_lanes = 0;   // num_ranks rounded up to a multiple of width
  int num_blocks = 0;  // num_lanes / width
  int num_rounds = 0;
  // Which rank each lane carries. The layout changes only speed, never results: it is chosen
  // (see BuildLaneProgram) so that rounds become kPair operations where the matchings allow.
  std::vector<int32_t> lane_of_rank;  // [ranks]
  std::vector<int32_t> rank_of_lane;  // [lanes], -1 for padding lanes
  std::vector<int32_t> op_begin;  // [rounds + 1] into ops
  std::vector<LaneOp> ops;
  // kGeneral rounds: for round r and output block k, sources
  // [src_begin[r * blocks + k], src_begin[r * blocks + k + 1]) of (block, lane index vector,
  // lane mask). Empty ranges for rounds that are not kGeneral.
  std::vector<int32_t> src_begin;  // [rounds * blocks + 1]
  std::vector<int32_t> src_block;  // [sources]
  std::vector<uint32_t> src_bits;  // [sources] bit j set where the source supplies lane j
  AlignedInts src_mask;            // [sources * width] the same as -1 / 0 per lane
  AlignedInts src_general_index;   // [sources * width] lane within the source block
  AlignedInts src_index;           // [vectors * width] partner lanes of kSelf / kPair ops
  // Per transfer: the computing lane that carries its state (round * lanes + lane), whether
  // that lane is the home side, and the other side's slot when it computes too (else -1).
  std::vector<int32_t> transfer_slot;
  std::vector<uint8_t> transfer_slot_is_home;
  std::vector<int32_t> transfer_other_slot;
  AlignedInts lane_home;  // [rounds * lanes] -1 on computing lanes of the home side, else 0
  // Register fast path. When every round is "block k with block k ^ mask" for one mask per
  // round (all kPair, the lower block computing) or "every block by itself" (all kSelf, mask
  // 0), the kernels keep the whole load vector in registers across rounds; block-system
  // layouts of tori and cubes come out this way. Empty when the program does not qualify.
  std::vector<int32_t> xor_mask;   // [rounds]
  std::vector<int32_t> xor_index;  // [rounds * blocks] the op.index of block k's op, -1 if none
};

// Relative cost of one pass under a program (kernel operations, weighted): how layouts and
// widths are compared.
double PassCost(const LaneProgram& program);

// Builds the program for `width`-lane blocks, choosing the lane layout of lowest PassCost among
// the identity and the block systems of the rounds' matchings (sets of ranks that every round
// maps onto a set of the family, found by closure from seed pairs): on a torus these make every
// round a set of kPair operations.
LaneProgram BuildLaneProgram(const TransferList& list, int width);

// Algorithm 1 as written, walking `list` transfer by transfer: the reference every other kernel
// must match bit for bit. load: [G]; mass, tok: [transfers] in list order.
void RunPassesScalar(const TransferList& list, int passes, int32_t* load, int32_t* mass,
                     const int32_t* tok);

// The SIMD step. Buffers are 64-byte aligned; "lanes" follow the program's layout.
//  ScanTokens: OR and sum of the step's counts (validation and the choice of F), copying them
//    to `copy` on the way (emission starts from that copy).
//  Prepare: tok_fx: [E + 1] counts << f, then 0; load and load_init: [lanes] all experts at
//    home, gathered through home_index ([home_rows][lanes], E = none); lane_tok and lane_mass:
//    [rounds * lanes] the expert total of every computing lane (lane_expert, E = none) and the
//    amount on its copy (all of it on the home side: lane_home is -1 there), written for the
//    8-lane chunks listed in fill_chunks (element offsets; the other chunks hold no transfer
//    and stay zero).
//  RunPasses: `passes` full passes over the program; partner: [lanes] scratch.
//  EmitLoads: load_after: [lanes] the integer loads under the emitted split, where a transfer's
//    home copy keeps round_half_up(mass / 2^f) tokens; home_tokens: [rounds * lanes] that
//    rounded home share, on every computing lane.
//  EmitRanks: load_before = load_init >> f and load_after as int64 in rank order ([ranks],
//    through lane_of_rank), with their maxima.
// Prepare and EmitRanks use AVX2 and serve the AVX-512 kernel too (every AVX-512 CPU has AVX2).
struct TokenScan {
  uint64_t all_bits;  // OR of the counts: bit 31 or above set when one is outside [0, 2^31)
  uint64_t total;
};
TokenScan ScanTokensAvx2(const int64_t* tokens, int num_experts, int64_t* copy);
struct RankPeaks {
  int64_t before;
  int64_t after;
};
RankPeaks EmitRanksAvx2(const int32_t* lane_of_rank, int num_ranks, int f,
                        const int32_t* load_init, const int32_t* load_after_lanes,
                        int64_t* load_before, int64_t* load_after);
void PrepareAvx2(const int64_t* tokens, int num_experts, int f, const int32_t* home_index,
                 int home_rows, const int32_t* lane_expert, const int32_t* lane_home,
                 const int32_t* fill_chunks, int num_fill_chunks, const LaneProgram& program,
                 int32_t* tok_fx, int32_t* load, int32_t* load_init, int32_t* lane_mass,
                 int32_t* lane_tok);
void RunPassesAvx2(const LaneProgram& program, int passes, int32_t* load, int32_t* lane_mass,
                   const int32_t* lane_tok, int32_t* partner);
void EmitLoadsAvx2(const LaneProgram& program, int f, const int32_t* load_init,
                   const int32_t* lane_mass, const int32_t* lane_tok, int32_t* load_after,
                   int32_t* home_tokens);
void RunPassesAvx512(const LaneProgram& program, int passes, int32_t* load, int32_t* lane_mass,
                     const int32_t* lane_tok, int32_t* partner);
void EmitLoadsAvx512(const LaneProgram& program, int f, const int32_t* load_init,
                     const int32_t* lane_mass, const int32_t* lane_tok, int32_t* load_after,
                     int32_t* home_tokens);

bool CpuHasAvx2();
bool CpuHasAvx512();

}  // namespace gcmoe::balancer::relief_internal
