// Replaying routing traces through every balancing scheme on the same placements:
// `gcmoe balance replay`, and the balancer's attainment tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "balancer/relief.h"
#include "common/status.h"
#include "tools/balance_trace.h"

namespace gcmoe::tools {

struct ReplayOptions {
  int ranks = 8;                   // G
  int replicas_per_rank = 2;       // D
  std::string topology = "torus";  // balancer::ParseTopology spec
  // none        ContiguousPlacement, no replicas: the engine's "balancing off".
  // home        the Relief placement with every token at home (the placement alone).
  // eplb        EPLB's rebalance_experts fitted to the same mean load with as many extra slots
  //             as the Relief placement has replicas (rounded up to a multiple of G); replicas
  //             split each expert's tokens evenly (EplbStepLoads).
  // relief      the Relief split on the Relief placement, scored on its fixed-point loads (the
  //             relaxation's fractional split, as the LP is).
  // relief-int  the same split after emission rounds it to whole tokens (what is dispatched).
  // lp          the exact per-step LP on the Relief placement (GLPK): the reference.
  std::vector<std::string> schemes = {"none", "eplb", "relief", "relief-int", "lp"};
  int passes = 12;      // I; -1 chooses I* per T_moe column (Eq. 3), reported as relief-auto
  int max_passes = 32;  // the scan range of -1
  int fraction_bits = 20;
  std::vector<double> t_moe_us = {100, 500, 2000};
  int eplb_groups = 1;
  int eplb_nodes = 1;
  balancer::ReliefKernel kernel = balancer::ReliefKernel::kAuto;
};

struct SchemeResult {
  std::string name;
  double spatial = 0.0;           // record-major mean of mean(L) / max(L)
  double attainment = 0.0;        // spatial / the LP's spatial
  double worst_attainment = 0.0;  // the lowest per-step spatial / LP spatial
  double solve_us = 0.0;          // mean decision time charged (0 for static schemes)
  double solve_us_p50 = 0.0;      // median over all steps (robust to preemption on busy hosts)
  std::vector<double> u_eff;      // [t_moe] spatial / (1 + solve_us / T_moe)
  std::vector<int> passes;        // [t_moe] I* (relief-auto only)
};

struct ReplayResult {
  int records = 0;
  int steps = 0;
  std::string topology;  // e.g. "torus 2x4"
  std::string kernel;    // Relief kernel that ran
  int eplb_replicas = 0;
  std::vector<SchemeResult> schemes;
  uint64_t relief_split_hash = 0;  // FNV-1a over every Relief home_tokens, in replay order
  int relief_fallbacks = 0;        // steps emitted all-home by the rounding guard
};

using ReplayProgress = std::function<void(int records_done, int records_total)>;

Result<ReplayResult> RunReplay(const Trace& trace, const ReplayOptions& options,
                               const ReplayProgress& progress = nullptr);

}  // namespace gcmoe::tools
