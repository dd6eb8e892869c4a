#include "server/service_stats.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/percentile.h"

namespace gcmoe::server {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void LatencyWindow::Add(double us) {
  if (samples_.size() < capacity_) {
    samples_.push_back(us);
  } else {
    samples_[next_] = us;
    next_ = (next_ + 1) % capacity_;
  }
  ++count_;
}

void LatencyWindow::Fill(gcmoe::v1::LatencySummary* out) const {
  out->set_count(count_);
  if (samples_.empty()) return;
  std::vector<double> sorted = samples_;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double v : sorted) sum += v;
  out->set_p50_us(NearestRankPercentile<double>(sorted, 0.50));
  out->set_p90_us(NearestRankPercentile<double>(sorted, 0.90));
  out->set_p99_us(NearestRankPercentile<double>(sorted, 0.99));
  out->set_max_us(sorted.back());
  out->set_mean_us(sum / static_cast<double>(sorted.size()));
}

double SpatialUtilization(const std::vector<int64_t>& load) {
  if (load.empty()) return 1.0;
  int64_t max = 0;
  double sum = 0;
  for (int64_t l : load) {
    max = std::max(max, l);
    sum += static_cast<double>(l);
  }
  if (max == 0) return 1.0;
  return sum / static_cast<double>(load.size()) / static_cast<double>(max);
}

ServiceStats::ServiceStats(int world_size)
    : start_ns_(NowNs()),
      load_before_total_(world_size, 0),
      load_after_total_(world_size, 0),
      rank_engine_us_sum_(world_size, 0.0) {}

void ServiceStats::RecordSuccess(const StepRecord& step) {
  std::lock_guard<std::mutex> lock(mu_);
  ++ok_;
  tokens_ += static_cast<uint64_t>(step.tokens);
  latency_.Add(static_cast<double>(step.total_ns) / 1e3);
  engine_latency_.Add(static_cast<double>(step.engine_ns) / 1e3);
  for (size_t r = 0; r < load_before_total_.size(); ++r) {
    if (r < step.load_before.size()) load_before_total_[r] += step.load_before[r];
    if (r < step.load_after.size()) load_after_total_[r] += step.load_after[r];
    if (r < step.rank_engine_ns.size()) {
      rank_engine_us_sum_[r] += static_cast<double>(step.rank_engine_ns[r]) / 1e3;
    }
  }
  spatial_before_sum_ += SpatialUtilization(step.load_before);
  spatial_after_sum_ += SpatialUtilization(step.load_after);
  solve_us_sum_ += static_cast<double>(step.solve_ns) / 1e3;
  passes_sum_ += step.passes;
}

void ServiceStats::RecordFailure(const std::string& code_name) {
  std::lock_guard<std::mutex> lock(mu_);
  ++failed_;
  ++failures_[code_name];
}

void ServiceStats::Fill(gcmoe::v1::Stats* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out->set_uptime_s(static_cast<double>(NowNs() - start_ns_) / 1e9);
  out->set_requests_ok(ok_);
  out->set_requests_failed(failed_);
  for (const auto& [code, n] : failures_) (*out->mutable_failures_by_code())[code] = n;
  out->set_tokens_total(tokens_);
  out->set_steps(ok_);
  latency_.Fill(out->mutable_latency());
  engine_latency_.Fill(out->mutable_engine_latency());
  const double steps = ok_ > 0 ? static_cast<double>(ok_) : 1.0;
  for (size_t r = 0; r < load_before_total_.size(); ++r) {
    gcmoe::v1::RankStats* rank = out->add_ranks();
    rank->set_rank(static_cast<uint32_t>(r));
    rank->set_load_before_total(load_before_total_[r]);
    rank->set_load_after_total(load_after_total_[r]);
    rank->set_engine_us_mean(rank_engine_us_sum_[r] / steps);
  }
  out->set_spatial_utilization_before(ok_ > 0 ? spatial_before_sum_ / steps : 0.0);
  out->set_spatial_utilization_after(ok_ > 0 ? spatial_after_sum_ / steps : 0.0);
  out->set_relief_solve_us_mean(solve_us_sum_ / steps);
  out->set_relief_passes_mean(passes_sum_ / steps);
}

}  // namespace gcmoe::server
