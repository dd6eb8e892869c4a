// The per-step tables the CUDA backend writes to the device before a replay
// (kernels/layer_types.h), derived from the step plan identically on every rank:
//   - routes: for every expert, where each of its positions is computed (home below the split,
//     host above) and at which row of the computing rank's receive index, for every rank; this
//     rank's first position in the expert's order; this rank's first ring block of the expert;
//   - blocks: this rank's receive index cut into ring blocks of at most BM rows of one expert,
//     an expert's short last block optionally marked as computed with the block before it;
//   - for the NCCL baseline, in records: what this rank sends to and receives from each rank,
//     and where in its send records each expert's home and host shares start.
// Every rank's receive index lists, expert after expert (ascending id), the positions of each
// expert it computes, so no rank needs another's tables. Plain host code, tested without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/step_plan.h"
#include "kernels/layer_types.h"

namespace gcmoe::engine {

struct GpuStepTables {
  std::vector<kernels::ExpertRoute> routes;  // [E]
  std::vector<kernels::RingBlock> blocks;    // this rank's ring blocks
  int64_t rows = 0;                          // routed rows this rank computes
  // NCCL baseline, in records, [P] each: grouped by peer rank, then expert, then position.
  std::vector<int64_t> send_count, send_start, recv_count, recv_start;
  int64_t sent() const { return send_start.back() + send_count.back(); }
  int64_t received() const { return recv_start.back() + recv_count.back(); }
  // Whether a block carries a merged tail (RingBlock::tail_rows > 0).
  bool merged_tails() const;
};

// Routed rows `rank` computes in the step (its home shares and host shares).
int64_t RowsComputedBy(const StepPlan& plan, int rank);

// slot_of[e]: the local slot of a held expert (its weights' index), -1 if not held; every
// expert the plan has `rank` compute must be held. bm: rows per ring block. max_tail_rows: an
// expert's last block of at most this many rows (after at least one full block) is merged into
// the block before it (RingBlock::tail_rows); 0 merges none. heaviest_first: the experts' blocks
// in order of the rows this rank computes of them, most first (role2 hands out its tasks in block
// order, so the last are the lightest), else in expert id order; an expert's blocks stay adjacent.
void BuildGpuStepTables(const StepPlan& plan, int rank, std::span<const int> slot_of, int bm,
                        int max_tail_rows, GpuStepTables* tables, bool heaviest_first = false);

// One rank's ring row of every assignment (kernels::StepHeader::direct_rows), [T * k]: block *
// bm + r, where `tables` (of this plan, rank 0, block size bm) put it, or -1 for an unused slot.
// An expert's assignments take its positions in order of token, then slot, as role1 numbers
// them. Only for a plan of one rank (false otherwise).
bool BuildDirectRows(const StepPlan& plan, const GpuStepTables& tables,
                     std::span<const int32_t> topk_ids, int bm, std::vector<int32_t>* rows);

}  // namespace gcmoe::engine
