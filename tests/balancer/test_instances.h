// Random balancer instances shared by the balancer tests: fixed generators, so every failure
// reproduces from its seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "balancer/balancer.h"
#include "balancer/placement.h"
#include "balancer/topology.h"
#include "common/splitmix64.h"

namespace gcmoe::balancer::testing {

class Rng : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  int Uniform(int lo, int hi) { return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1)); }
  double Real() { return Uniform01(); }
  // Log-normal, sigma 1: skewed like expert popularity.
  double Skewed() {
    const double u = std::max(Real(), 1e-300);
    return std::exp(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * Real()));
  }
};

// Any valid placement: homes uniform, about half the experts replicated to a random other rank
// (so ranks may share several transfers, and rounds are rarely perfect matchings).
inline Placement RandomPlacement(Rng& rng, int num_ranks, int num_experts) {
  Placement p;
  p.num_ranks = num_ranks;
  p.num_experts = num_experts;
  p.home.resize(num_experts);
  p.host.assign(num_experts, -1);
  for (int e = 0; e < num_experts; ++e) {
    p.home[e] = rng.Uniform(0, num_ranks - 1);
    if (num_ranks > 1 && rng.Uniform(0, 1) == 1) {
      p.host[e] = (p.home[e] + rng.Uniform(1, num_ranks - 1)) % num_ranks;
    }
  }
  return p;
}

// A Relief placement (balanced packing + topology replicas) fitted to skewed mean loads.
inline Placement TopologyPlacement(Rng& rng, const Topology& topology, int num_experts,
                                   int replicas_per_rank, std::vector<double>* mean = nullptr) {
  std::vector<double> m(num_experts);
  for (double& x : m) x = rng.Skewed();
  if (mean) *mean = m;
  return FitPlacement(m, topology, replicas_per_rank).value();
}

// Per-expert counts around `mean` (scaled to `total` assignments), with per-step noise.
inline std::vector<int64_t> RandomStep(Rng& rng, const std::vector<double>& mean, int64_t total) {
  double sum = 0;
  for (double m : mean) sum += m;
  std::vector<int64_t> step(mean.size());
  for (size_t e = 0; e < mean.size(); ++e) {
    const double expected = sum > 0 ? mean[e] / sum * static_cast<double>(total) : 0.0;
    step[e] = std::max<int64_t>(0, std::llround(expected * (0.5 + rng.Real())));
  }
  return step;
}

inline std::vector<int64_t> UniformStep(Rng& rng, int num_experts, int64_t max_tokens) {
  std::vector<int64_t> step(num_experts);
  for (int64_t& n : step) n = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(max_tokens + 1));
  return step;
}

inline int64_t MaxOf(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

}  // namespace gcmoe::balancer::testing
