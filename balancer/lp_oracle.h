// The exact per-step split (relief.txt Eq. 2), solved with GLPK: the reference that Relief's
// attainment is measured against in tests and benchmarks. Lives in its own library target,
// gcmoe_balancer_lp, so that the serving balancer never links an LP solver.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balancer/balancer.h"
#include "common/status.h"

namespace gcmoe::balancer {

struct LpSplit {
  double max_load = 0.0;              // z*: the smallest achievable peak rank load
  std::vector<double> home_fraction;  // [E] x_e in [0, 1]; 1 for an expert that is not replicated
  std::vector<double> loads;          // [G] L_i(x*) in tokens
  int64_t solve_ns = 0;               // build + solve wall time
};

// min z  s.t.  L_i(x) <= z for every rank i,  0 <= x_e <= 1 for every replicated expert, where
// L_i(x) = sum_{home e = i} n_e x_e + sum_{host e = i} n_e (1 - x_e) (+ n_e of unreplicated
// experts homed on i). Primal simplex; GLPK's terminal output is switched off for the call.
Result<LpSplit> SolveMinMaxLp(const Placement& placement, std::span<const int64_t> expert_tokens);

}  // namespace gcmoe::balancer
