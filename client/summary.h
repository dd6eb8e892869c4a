// What `gcmoe client forward` measured: calls by status, client-side latency percentiles, the
// server's ForwardStats and the outputs' health, accumulated across threads and printed.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::client {

// Nearest-rank percentile (p in [0, 100]) of unsorted values: the smallest value with at least
// p% of the values at or below it. 0 for no values.
double Percentile(std::vector<double> values, double p);

// mean(L) / max(L) of per-rank loads: 1 is perfect balance; 0 for no load.
double SpatialUtilization(const google::protobuf::RepeatedField<int64_t>& loads);

// The health of one response's output.
struct OutputCheck {
  int64_t values = 0;
  double sum_abs = 0.0;
  int64_t nan = 0;
  int64_t inf = 0;
};
OutputCheck CheckOutput(const std::vector<float>& values);

class ForwardSummary {
 public:
  // Thread-safe: worker threads record as their calls complete.
  void AddOk(double latency_us, const v1::ForwardResponse& response, const OutputCheck& output);
  void AddFailure(double latency_us, const std::string& code_name, const std::string& message);

  int64_t ok() const;
  int64_t failed() const;
  bool outputs_finite() const;

  struct RunInfo {
    int64_t tokens_per_request = 0;
    double wall_s = 0.0;
  };
  // The multi-line report (ends with a newline).
  std::string Format(const RunInfo& run) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> latency_us_;
  std::map<std::string, int64_t> failures_;           // code name -> count
  std::map<std::string, std::string> first_message_;  // code name -> first message seen
  int64_t ok_ = 0;
  std::vector<double> engine_us_;
  std::vector<double> server_total_us_;
  std::vector<double> queue_us_;
  std::vector<double> spatial_before_;
  std::vector<double> spatial_after_;
  std::vector<double> relief_passes_;
  std::vector<double> relief_solve_us_;
  std::vector<int64_t> load_before_sum_;
  std::vector<int64_t> load_after_sum_;
  bool balancer_enabled_ = false;
  OutputCheck output_;
  std::string output_shape_;
};

}  // namespace gcmoe::client
