#include "balancer/metrics.h"

#include <algorithm>

namespace gcmoe::balancer {
namespace {

template <typename T>
double Spatial(std::span<const T> loads) {
  if (loads.empty()) return 1.0;
  double sum = 0.0;
  double peak = 0.0;
  for (T l : loads) {
    sum += static_cast<double>(l);
    peak = std::max(peak, static_cast<double>(l));
  }
  if (peak <= 0.0) return 1.0;
  return sum / static_cast<double>(loads.size()) / peak;
}

}  // namespace

double SpatialUtilization(std::span<const double> loads) { return Spatial(loads); }
double SpatialUtilization(std::span<const int64_t> loads) { return Spatial(loads); }

double Attainment(double spatial, double spatial_optimum) {
  return spatial_optimum > 0.0 ? spatial / spatial_optimum : 0.0;
}

double EffectiveUtilization(double spatial, double t_solve_us, double t_moe_us) {
  return spatial / (1.0 + t_solve_us / t_moe_us);
}

}  // namespace gcmoe::balancer
