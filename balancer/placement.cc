#include <string>

#include "balancer/balancer.h"

namespace gcmoe::balancer {

std::vector<int> Placement::ExpertsOnRank(int rank) const {
  std::vector<int> experts;
  for (int e = 0; e < num_experts; ++e) {
    if (home[e] == rank || host[e] == rank) experts.push_back(e);
  }
  return experts;
}

Status Placement::Validate() const {
  if (num_ranks <= 0) return InvalidArgument("placement: num_ranks must be positive");
  if (num_experts <= 0) return InvalidArgument("placement: num_experts must be positive");
  if (static_cast<int>(home.size()) != num_experts || static_cast<int>(host.size()) != num_experts) {
    return InvalidArgument("placement: home and host must have one entry per expert");
  }
  for (int e = 0; e < num_experts; ++e) {
    if (home[e] < 0 || home[e] >= num_ranks) {
      return InvalidArgument("placement: expert " + std::to_string(e) + " has home rank " +
                             std::to_string(home[e]) + ", expected [0, " +
                             std::to_string(num_ranks) + ")");
    }
    if (host[e] >= num_ranks || host[e] < -1 || host[e] == home[e]) {
      return InvalidArgument("placement: expert " + std::to_string(e) + " has host rank " +
                             std::to_string(host[e]) + ", expected -1 or a rank other than home");
    }
  }
  return Status::Ok();
}

Placement ContiguousPlacement(int num_ranks, int num_experts) {
  Placement p;
  p.num_ranks = num_ranks;
  p.num_experts = num_experts;
  p.home.resize(num_experts);
  p.host.assign(num_experts, -1);
  for (int e = 0; e < num_experts; ++e) {
    p.home[e] = static_cast<int>(static_cast<int64_t>(e) * num_ranks / num_experts);
  }
  return p;
}

}  // namespace gcmoe::balancer
