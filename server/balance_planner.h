// The coordinator's side of balancing: it owns the placement every rank solves on and the pass
// count every rank runs, so that all ranks (a restarted one too) compute the same split.
//   - Placement: fitted at start-up (config), and refitted from the loads it observes every
//     balancer.refit_steps steps when balancer.placement is "observed".
//   - Passes: balancer.passes, or with "auto" I* = argmax_p s[p] / (1 + T_solve(p) / T_moe)
//     (DESIGN.md §5) from the first calibration steps: s[p] is the balance after p passes on
//     those steps' counts, T_solve(p) is timed here, T_moe is the slowest rank's engine time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "balancer/balancer.h"
#include "balancer/relief.h"
#include "common/status.h"
#include "config/config.h"

namespace gcmoe::server {

class BalancePlanner {
 public:
  static constexpr int kCalibrationSteps = 8;
  static constexpr int kCalibrationMaxPasses = 32;

  static Result<std::unique_ptr<BalancePlanner>> Create(const config::Config& config);

  const balancer::Placement& placement() const { return placement_; }
  uint64_t placement_version() const { return placement_version_; }
  // Passes the next step runs on every rank (0 with the balancer off).
  int passes() const { return passes_; }
  bool calibrating() const { return calibrated_steps_ < kCalibrationSteps && auto_passes_; }

  // After each successful step: its per-expert totals and the slowest rank's engine time.
  // Returns true when the placement changed, i.e. the ranks need a new epoch to load it.
  bool Observe(std::span<const int64_t> expert_tokens, int64_t engine_ns);

 private:
  BalancePlanner() = default;
  void Calibrate(std::span<const int64_t> expert_tokens, int64_t engine_ns);
  double TimeSolveNs(std::span<const int64_t> expert_tokens, int passes);
  bool Refit();

  config::Config config_;
  bool enabled_ = false;
  balancer::Placement placement_;
  uint64_t placement_version_ = 1;
  int passes_ = 0;

  // "auto" passes.
  bool auto_passes_ = false;
  std::unique_ptr<balancer::ReliefBalancer> relief_;  // the coordinator's own, for calibration
  balancer::Split split_;
  int calibrated_steps_ = 0;
  std::vector<double> balance_sum_;  // [max + 1] sum over calibration steps of s[p]
  std::vector<double> curve_;        // [max + 1]
  std::vector<double> solve_ns_1_, solve_ns_max_, engine_us_;

  // "observed" placement.
  int refit_steps_ = 0;
  int steps_since_refit_ = 0;
  std::vector<double> observed_;  // [E] summed totals since the last refit
};

}  // namespace gcmoe::server
