// "Balancing off": every assignment is computed by its expert's home copy.
#include <chrono>

#include "balancer/balancer.h"

namespace gcmoe::balancer {
namespace {

class NoReplicationBalancer final : public Balancer {
 public:
  std::string name() const override { return "none"; }

  Status SetPlacement(const Placement& placement) override {
    GCMOE_RETURN_IF_ERROR(placement.Validate());
    placement_ = placement;
    return Status::Ok();
  }

  const Placement& placement() const override { return placement_; }

  Status Solve(std::span<const int64_t> expert_tokens, Split* split) override {
    const int num_experts = placement_.num_experts;
    if (static_cast<int>(expert_tokens.size()) != num_experts) {
      return InvalidArgument("balancer: expected " + std::to_string(num_experts) +
                             " expert totals, got " + std::to_string(expert_tokens.size()));
    }
    split->home_tokens.assign(expert_tokens.begin(), expert_tokens.end());
    split->load_before.assign(placement_.num_ranks, 0);
    for (int e = 0; e < num_experts; ++e) split->load_before[placement_.home[e]] += expert_tokens[e];
    split->load_after = split->load_before;
    split->passes = 0;
    split->solve_ns = 0;
    return Status::Ok();
  }

 private:
  Placement placement_;
};

}  // namespace

std::unique_ptr<Balancer> CreateNoReplicationBalancer() {
  return std::make_unique<NoReplicationBalancer>();
}

}  // namespace gcmoe::balancer
