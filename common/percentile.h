// The nearest-rank percentile, one definition for every latency and timing summary (the
// service's stats, the client's report, the benchmarks, the role2 trace).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

namespace gcmoe {

// The smallest of `sorted` (ascending) with at least a fraction q (0..1) of the samples at or
// below it; q = 0 gives the smallest sample. 0 when there are no samples.
template <typename T>
double NearestRankPercentile(std::span<const T> sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const size_t index = rank < 1.0 ? 0 : static_cast<size_t>(rank) - 1;
  return static_cast<double>(sorted[std::min(index, sorted.size() - 1)]);
}

}  // namespace gcmoe
