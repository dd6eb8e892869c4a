// Who computes which assignment in one step, derived identically on every rank from the count
// matrix C[src][expert] and the balancer's split, with no exchange between ranks.
//
// Assignment order of one expert: (source rank, token index, slot). Position p of expert e is
// computed by its home copy when p < split.home_tokens[e], else by its host copy.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balancer/balancer.h"
#include "common/status.h"

namespace gcmoe::engine {

struct StepPlan {
  int world_size = 0;
  int num_experts = 0;
  std::vector<int> tokens_per_rank;   // [P] shard sizes, the source ranks
  std::vector<int64_t> expert_tokens; // [E] assignments per expert over all sources
  std::vector<int64_t> src_offset;    // [P, E] position of source s's first assignment to e
  std::vector<int64_t> home_tokens;   // [E] the split (copied from the balancer)
  std::vector<int> home;              // [E] placement, copied so the plan stands alone
  std::vector<int> host;              // [E]
  std::vector<int64_t> load;          // [P] assignments each rank computes

  int ComputeRank(int expert, int64_t position) const {
    return position < home_tokens[expert] ? home[expert] : host[expert];
  }
};

// counts: [P, E] row-major. Validates that counts match the shard sizes' capacity (at most k
// assignments per token) and that the split is within range; fills `plan` reusing its storage.
Status BuildStepPlan(std::span<const int> tokens_per_rank, std::span<const int64_t> counts,
                     int num_experts, const balancer::Placement& placement,
                     const balancer::Split& split, StepPlan* plan);

}  // namespace gcmoe::engine
