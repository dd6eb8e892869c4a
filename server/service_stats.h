// Counters and recent latencies of the service, for GetStats and the logs.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::server {

// The last `capacity` samples, for percentiles over a recent window.
class LatencyWindow {
 public:
  explicit LatencyWindow(size_t capacity = 8192) : capacity_(capacity) {}
  void Add(double us);
  void Fill(gcmoe::v1::LatencySummary* out) const;

 private:
  size_t capacity_;
  std::vector<double> samples_;
  size_t next_ = 0;
  uint64_t count_ = 0;
};

struct StepRecord {
  int64_t total_ns = 0;
  int64_t engine_ns = 0;
  int tokens = 0;
  std::vector<int64_t> load_before;  // [P]
  std::vector<int64_t> load_after;   // [P]
  int passes = 0;
  int64_t solve_ns = 0;
  std::vector<int64_t> rank_engine_ns;  // [P]
};

class ServiceStats {
 public:
  explicit ServiceStats(int world_size);

  void RecordSuccess(const StepRecord& step);
  void RecordFailure(const std::string& code_name);
  // Fills everything but the per-rank readiness (the coordinator's).
  void Fill(gcmoe::v1::Stats* out) const;

 private:
  mutable std::mutex mu_;
  const int64_t start_ns_;
  uint64_t ok_ = 0;
  uint64_t failed_ = 0;
  std::map<std::string, uint64_t> failures_;
  uint64_t tokens_ = 0;
  LatencyWindow latency_;
  LatencyWindow engine_latency_;
  std::vector<int64_t> load_before_total_;
  std::vector<int64_t> load_after_total_;
  std::vector<double> rank_engine_us_sum_;
  double spatial_before_sum_ = 0;
  double spatial_after_sum_ = 0;
  double solve_us_sum_ = 0;
  double passes_sum_ = 0;
};

// mean(L) / max(L); 1 for an idle step.
double SpatialUtilization(const std::vector<int64_t>& load);

}  // namespace gcmoe::server
