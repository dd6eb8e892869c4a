#include "engine/step_plan.h"

#include <string>

namespace gcmoe::engine {

Status BuildStepPlan(std::span<const int> tokens_per_rank, std::span<const int64_t> counts,
                     int num_experts, const balancer::Placement& placement,
                     const balancer::Split& split, StepPlan* plan) {
  const int world = static_cast<int>(tokens_per_rank.size());
  if (world != placement.num_ranks || num_experts != placement.num_experts) {
    return InvalidArgument("step plan: placement is for " + std::to_string(placement.num_ranks) +
                           " ranks and " + std::to_string(placement.num_experts) +
                           " experts, the step has " + std::to_string(world) + " and " +
                           std::to_string(num_experts));
  }
  if (counts.size() != static_cast<size_t>(world) * num_experts) {
    return InvalidArgument("step plan: counts has " + std::to_string(counts.size()) +
                           " entries, expected ranks x experts = " +
                           std::to_string(static_cast<int64_t>(world) * num_experts));
  }
  if (split.home_tokens.size() != static_cast<size_t>(num_experts)) {
    return InvalidArgument("step plan: split has no entry per expert");
  }
  plan->world_size = world;
  plan->num_experts = num_experts;
  plan->tokens_per_rank.assign(tokens_per_rank.begin(), tokens_per_rank.end());
  plan->expert_tokens.assign(num_experts, 0);
  plan->src_offset.resize(counts.size());
  for (int s = 0; s < world; ++s) {
    for (int e = 0; e < num_experts; ++e) {
      const int64_t c = counts[static_cast<size_t>(s) * num_experts + e];
      if (c < 0 || c > tokens_per_rank[s]) {
        return InvalidArgument("step plan: counts[" + std::to_string(s) + "][" +
                               std::to_string(e) + "] is " + std::to_string(c) +
                               ", expected 0.." + std::to_string(tokens_per_rank[s]));
      }
      plan->src_offset[static_cast<size_t>(s) * num_experts + e] = plan->expert_tokens[e];
      plan->expert_tokens[e] += c;
    }
  }
  plan->home = placement.home;
  plan->host = placement.host;
  plan->home_tokens = split.home_tokens;
  plan->load.assign(world, 0);
  for (int e = 0; e < num_experts; ++e) {
    const int64_t total = plan->expert_tokens[e];
    const int64_t at_home = plan->home_tokens[e];
    const bool replicated = placement.host[e] >= 0;
    if (at_home < 0 || at_home > total || (!replicated && at_home != total)) {
      return InvalidArgument("step plan: split keeps " + std::to_string(at_home) +
                             " of expert " + std::to_string(e) + "'s " + std::to_string(total) +
                             " assignments at home, expected " +
                             (replicated ? "0.." + std::to_string(total) : std::to_string(total)));
    }
    plan->load[placement.home[e]] += at_home;
    if (replicated) plan->load[placement.host[e]] += total - at_home;
  }
  return Status::Ok();
}

}  // namespace gcmoe::engine
