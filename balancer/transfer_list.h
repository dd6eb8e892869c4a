// The transfer list: every replicated expert's edge home-host, compiled once per placement into
// rounds of rank-disjoint transfers by a proper edge colouring of the replica graph (DESIGN.md §5).
#pragma once

#include <vector>

#include "balancer/balancer.h"
#include "common/status.h"

namespace gcmoe::balancer {

struct Transfer {
  int expert = 0;
  int home = 0;  // u: the home copy's rank
  int host = 0;  // v: the second copy's rank
};

struct TransferList {
  int num_ranks = 0;
  // Colour by colour; inside a colour by home rank, then expert. Invariant: no two transfers of
  // one round share a rank, so a round's transfers commute and may run together.
  std::vector<Transfer> transfers;
  std::vector<int> round_begin;  // [rounds + 1] offsets into `transfers`

  int num_rounds() const { return static_cast<int>(round_begin.size()) - 1; }
  // The largest number of transfers touching one rank: no colouring uses fewer rounds.
  int max_degree = 0;
};

// Greedy first-fit colouring, tried over a few deterministic edge orders, keeping the first
// order that needs the fewest colours. On the torus, cube and ring placements of placement.h
// with even sides it reaches the lower bound 2D (every round a perfect matching).
Result<TransferList> CompileTransferList(const Placement& placement);

}  // namespace gcmoe::balancer
