// The scores of DESIGN.md §5 Metrics (relief.txt Eq. 1).
#pragma once

#include <cstdint>
#include <span>

namespace gcmoe::balancer {

// mean(L) / max(L) over the ranks: the share of the group's reserved time doing expert work.
// 1 for an empty step (all loads zero): nothing waits on a straggler.
double SpatialUtilization(std::span<const double> loads);
double SpatialUtilization(std::span<const int64_t> loads);

// How much of the per-step optimum's balance a split reaches: spatial / spatial of the exact LP
// on the same placement and step. Both arguments in (0, 1].
double Attainment(double spatial, double spatial_optimum);

// U_eff = spatial / (1 + T_solve / T_moe): balance charged with the decision's latency, which
// holds every rank before dispatch can start.
double EffectiveUtilization(double spatial, double t_solve_us, double t_moe_us);

}  // namespace gcmoe::balancer
