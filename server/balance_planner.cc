#include "server/balance_planner.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "server/engine_config.h"

namespace gcmoe::server {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<std::unique_ptr<BalancePlanner>> BalancePlanner::Create(const config::Config& config) {
  std::unique_ptr<BalancePlanner> planner(new BalancePlanner());
  planner->config_ = config;
  planner->enabled_ = config.balancer.enabled;
  GCMOE_ASSIGN_OR_RETURN(planner->placement_, InitialPlacement(config));
  if (!planner->enabled_) return planner;

  planner->auto_passes_ = !config.balancer.passes.has_value();
  planner->passes_ =
      planner->auto_passes_ ? kCalibrationMaxPasses : *config.balancer.passes;
  if (planner->auto_passes_) {
    balancer::ReliefOptions options;
    options.fraction_bits = config.balancer.fractional_bits;
    options.passes = kCalibrationMaxPasses;
    GCMOE_ASSIGN_OR_RETURN(planner->relief_, balancer::CreateReliefBalancer(options));
    GCMOE_RETURN_IF_ERROR(planner->relief_->SetPlacement(planner->placement_));
    planner->balance_sum_.assign(kCalibrationMaxPasses + 1, 0.0);
    planner->curve_.assign(kCalibrationMaxPasses + 1, 0.0);
  }
  if (config.balancer.placement == "observed") {
    planner->refit_steps_ = config.balancer.refit_steps;
    planner->observed_.assign(config.model.experts, 0.0);
  }
  int replicated = 0;
  for (int host : planner->placement_.host) replicated += host >= 0;
  spdlog::info("balancer: relief on {} ranks, {} replicated experts ({}), passes {}",
               config.parallel.ranks, replicated, config.balancer.topology,
               planner->auto_passes_ ? "auto (calibrating)" : std::to_string(planner->passes_));
  return planner;
}

double BalancePlanner::TimeSolveNs(std::span<const int64_t> expert_tokens, int passes) {
  constexpr int kRepeats = 32;
  if (!relief_->SetPasses(passes).ok()) return 0;
  std::vector<double> samples;
  for (int i = 0; i < kRepeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (!relief_->Solve(expert_tokens, &split_).ok()) return 0;
    samples.push_back(static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - start)
                                              .count()));
  }
  return Median(std::move(samples));
}

void BalancePlanner::Calibrate(std::span<const int64_t> expert_tokens, int64_t engine_ns) {
  if (!relief_->RecordBalanceCurve(expert_tokens, curve_).ok()) return;
  for (size_t p = 0; p < curve_.size(); ++p) balance_sum_[p] += curve_[p];
  solve_ns_1_.push_back(TimeSolveNs(expert_tokens, 1));
  solve_ns_max_.push_back(TimeSolveNs(expert_tokens, kCalibrationMaxPasses));
  engine_us_.push_back(static_cast<double>(engine_ns) / 1e3);
  if (++calibrated_steps_ < kCalibrationSteps) return;

  // T_solve(p) is affine in p: a fixed prologue and emission plus one cost per pass.
  const double t1 = Median(solve_ns_1_);
  const double tmax = Median(solve_ns_max_);
  const double per_pass = std::max(0.0, (tmax - t1) / (kCalibrationMaxPasses - 1));
  std::vector<double> balance(kCalibrationMaxPasses + 1);
  std::vector<double> solve_ns(kCalibrationMaxPasses + 1);
  for (int p = 0; p <= kCalibrationMaxPasses; ++p) {
    balance[p] = balance_sum_[p] / kCalibrationSteps;
    solve_ns[p] = t1 + per_pass * (p - 1);
  }
  const double t_moe_us = std::max(1.0, Median(engine_us_));
  auto chosen = balancer::ChoosePassCount(balance, solve_ns, t_moe_us);
  passes_ = chosen.ok() ? *chosen : kDefaultReliefPasses;
  spdlog::info("balancer: calibrated I* = {} passes (balance {:.4f}, solve {:.2f} us, layer "
               "{:.0f} us)",
               passes_, balance[passes_], solve_ns[passes_] / 1e3, t_moe_us);
}

bool BalancePlanner::Refit() {
  std::vector<double> mean(observed_.size());
  for (size_t e = 0; e < mean.size(); ++e) mean[e] = observed_[e] / steps_since_refit_;
  std::fill(observed_.begin(), observed_.end(), 0.0);
  steps_since_refit_ = 0;
  auto fitted = FitObservedPlacement(config_, mean);
  if (!fitted.ok()) {
    spdlog::error("balancer: refit failed: {}", fitted.status().ToString());
    return false;
  }
  if (fitted->home == placement_.home && fitted->host == placement_.host) return false;
  placement_ = std::move(fitted).value();
  ++placement_version_;
  if (relief_) (void)relief_->SetPlacement(placement_);
  spdlog::info("balancer: placement refitted to the last {} steps' loads (version {})",
               refit_steps_, placement_version_);
  return true;
}

bool BalancePlanner::Observe(std::span<const int64_t> expert_tokens, int64_t engine_ns) {
  if (!enabled_) return false;
  if (calibrating()) Calibrate(expert_tokens, engine_ns);
  if (refit_steps_ <= 0) return false;
  for (size_t e = 0; e < observed_.size(); ++e) {
    observed_[e] += static_cast<double>(expert_tokens[e]);
  }
  if (++steps_since_refit_ < refit_steps_) return false;
  return Refit();
}

}  // namespace gcmoe::server
