#include "balancer/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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

Result<Placement> FitPlacement(std::span<const double> mean_load, const Topology& topology,
                               int replicas_per_rank) {
  const int num_ranks = topology.num_ranks;
  const int num_experts = static_cast<int>(mean_load.size());
  if (num_ranks <= 0) return InvalidArgument("placement: topology has no ranks");
  if (num_experts <= 0) return InvalidArgument("placement: mean_load is empty");
  if (replicas_per_rank < 0 || replicas_per_rank > topology.degree()) {
    return InvalidArgument("placement: replicas per rank is " + std::to_string(replicas_per_rank) +
                           ", expected 0.." + std::to_string(topology.degree()) + " for " +
                           topology.ToString());
  }
  for (int e = 0; e < num_experts; ++e) {
    if (!std::isfinite(mean_load[e]) || mean_load[e] < 0) {
      return InvalidArgument("placement: mean_load[" + std::to_string(e) +
                             "] must be finite and >= 0");
    }
  }

  // Heaviest first; equal loads keep expert order so the result never depends on sort details.
  std::vector<int> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return mean_load[a] > mean_load[b]; });

  const int capacity = (num_experts + num_ranks - 1) / num_ranks;
  std::vector<double> rank_load(num_ranks, 0.0);
  std::vector<int> rank_count(num_ranks, 0);
  Placement p;
  p.num_ranks = num_ranks;
  p.num_experts = num_experts;
  p.home.assign(num_experts, -1);
  p.host.assign(num_experts, -1);
  for (int e : order) {
    int best = -1;
    for (int r = 0; r < num_ranks; ++r) {
      if (rank_count[r] < capacity && (best < 0 || rank_load[r] < rank_load[best])) best = r;
    }
    p.home[e] = best;
    rank_load[best] += mean_load[e];
    ++rank_count[best];
  }

  // `order` is already heaviest-first with id tie-break, so the first experts met per rank are
  // that rank's heaviest.
  std::vector<int> replicated_on_rank(num_ranks, 0);
  for (int e : order) {
    const int r = p.home[e];
    const int d = replicated_on_rank[r];
    if (d < replicas_per_rank) {
      p.host[e] = topology.Neighbour(r, d);
      ++replicated_on_rank[r];
    }
  }
  GCMOE_RETURN_IF_ERROR(p.Validate());
  return p;
}

}  // namespace gcmoe::balancer
