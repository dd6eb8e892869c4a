#include "client/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "client/tensors.h"
#include "common/percentile.h"

namespace gcmoe::client {
namespace {

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

std::string Fixed(double v, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, v);
  return text;
}

std::string Join(const std::vector<int64_t>& values) {
  std::string s;
  for (const int64_t v : values) s += (s.empty() ? "" : " ") + std::to_string(v);
  return s;
}

void AddInto(std::vector<int64_t>* sums, const google::protobuf::RepeatedField<int64_t>& loads) {
  if (sums->size() < static_cast<size_t>(loads.size())) sums->resize(loads.size(), 0);
  for (int i = 0; i < loads.size(); ++i) (*sums)[i] += loads[i];
}

}  // namespace

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return NearestRankPercentile<double>(values, p / 100.0);
}

double SpatialUtilization(const google::protobuf::RepeatedField<int64_t>& loads) {
  if (loads.empty()) return 0.0;
  const int64_t max = *std::max_element(loads.begin(), loads.end());
  if (max <= 0) return 0.0;
  const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / loads.size();
  return mean / static_cast<double>(max);
}

OutputCheck CheckOutput(const std::vector<float>& values) {
  OutputCheck c;
  c.values = static_cast<int64_t>(values.size());
  for (const float v : values) {
    if (std::isnan(v)) {
      ++c.nan;
    } else if (std::isinf(v)) {
      ++c.inf;
    } else {
      c.sum_abs += std::fabs(v);
    }
  }
  return c;
}

void ForwardSummary::AddOk(double latency_us, const v1::ForwardResponse& response,
                           const OutputCheck& output) {
  const v1::ForwardStats& s = response.stats();
  std::lock_guard<std::mutex> lock(mu_);
  ++ok_;
  latency_us_.push_back(latency_us);
  engine_us_.push_back(s.engine_ns() / 1e3);
  server_total_us_.push_back(s.total_ns() / 1e3);
  queue_us_.push_back(s.queue_ns() / 1e3);
  if (!s.load_before().empty()) spatial_before_.push_back(SpatialUtilization(s.load_before()));
  if (!s.load_after().empty()) spatial_after_.push_back(SpatialUtilization(s.load_after()));
  AddInto(&load_before_sum_, s.load_before());
  AddInto(&load_after_sum_, s.load_after());
  balancer_enabled_ = balancer_enabled_ || s.balancer_enabled();
  if (s.balancer_enabled()) {
    relief_passes_.push_back(s.relief_passes());
    relief_solve_us_.push_back(s.relief_solve_ns() / 1e3);
  }
  output_.values += output.values;
  output_.sum_abs += output.sum_abs;
  output_.nan += output.nan;
  output_.inf += output.inf;
  std::string shape;
  for (const int64_t d : response.output().shape())
    shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  output_shape_ = "[" + shape + "] " + DTypeName(response.output().dtype());
}

void ForwardSummary::AddFailure(double latency_us, const std::string& code_name,
                                const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  latency_us_.push_back(latency_us);
  ++failures_[code_name];
  first_message_.emplace(code_name, message);
}

int64_t ForwardSummary::ok() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ok_;
}

int64_t ForwardSummary::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [code, count] : failures_) n += count;
  return n;
}

bool ForwardSummary::outputs_finite() const {
  std::lock_guard<std::mutex> lock(mu_);
  return output_.nan == 0 && output_.inf == 0;
}

std::string ForwardSummary::Format(const RunInfo& run) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t failed = 0;
  for (const auto& [code, count] : failures_) failed += count;
  std::string out;
  auto line = [&out](const std::string& label, const std::string& text) {
    out += "  " + label + std::string(label.size() < 12 ? 12 - label.size() : 1, ' ') + text + "\n";
  };
  line("requests", std::to_string(ok_ + failed) + " sent, " + std::to_string(ok_) + " ok, " +
                       std::to_string(failed) + " failed");
  for (const auto& [code, count] : failures_) {
    line("", code + " x" + std::to_string(count) + ": " + first_message_.at(code));
  }
  const double wall = run.wall_s > 0 ? run.wall_s : 1e-9;
  line("throughput", Fixed(ok_ * run.tokens_per_request / wall, 1) + " tokens/s, " +
                         Fixed(ok_ / wall, 1) + " requests/s (ok ones, over " +
                         Fixed(run.wall_s, 3) + " s)");
  line("latency", "p50 " + Fixed(Percentile(latency_us_, 50), 1) + "  p90 " +
                      Fixed(Percentile(latency_us_, 90), 1) + "  p99 " +
                      Fixed(Percentile(latency_us_, 99), 1) + "  max " +
                      Fixed(Percentile(latency_us_, 100), 1) + " us (at the client, all calls)");
  if (ok_ == 0) return out;
  line("server", "engine p50 " + Fixed(Percentile(engine_us_, 50), 1) + " mean " +
                     Fixed(Mean(engine_us_), 1) + " us; total p50 " +
                     Fixed(Percentile(server_total_us_, 50), 1) + " us; queue mean " +
                     Fixed(Mean(queue_us_), 1) + " us");
  if (!spatial_before_.empty()) {
    std::string balance = "mean(L)/max(L) " + Fixed(Mean(spatial_before_), 3) + " before -> " +
                          Fixed(Mean(spatial_after_), 3) + " after balancing";
    if (balancer_enabled_) {
      balance += "; relief " + Fixed(Mean(relief_passes_), 1) + " passes, " +
                 Fixed(Mean(relief_solve_us_), 2) + " us";
    } else {
      balance += " (balancer off)";
    }
    line("balance", balance);
    line("", "load per rank, summed: before [" + Join(load_before_sum_) + "] after [" +
                 Join(load_after_sum_) + "]");
  }
  const double mean_abs = output_.values > output_.nan + output_.inf
                              ? output_.sum_abs / (output_.values - output_.nan - output_.inf)
                              : 0.0;
  line("output", output_shape_ + ", mean |y| " + Fixed(mean_abs, 6) + ", NaN " +
                     std::to_string(output_.nan) + ", Inf " + std::to_string(output_.inf) +
                     " (all ok responses)");
  return out;
}

}  // namespace gcmoe::client
