#include "tools/balance_replay.h"

#include <algorithm>
#include <map>

#include "balancer/eplb.h"
#include "balancer/lp_oracle.h"
#include "balancer/metrics.h"
#include "balancer/placement.h"
#include "balancer/topology.h"

namespace gcmoe::tools {
namespace {

namespace bal = gcmoe::balancer;

constexpr const char* kKnownSchemes[] = {"none", "home", "eplb", "relief", "relief-int", "lp"};

void HashInto(uint64_t& hash, const std::vector<int64_t>& values) {
  for (int64_t v : values) {
    for (int i = 0; i < 8; ++i) {
      hash ^= static_cast<uint64_t>(v >> (8 * i)) & 0xFF;
      hash *= 0x100000001B3ull;
    }
  }
}

// Sums of per-record means, for record-major aggregates.
struct Accumulator {
  double spatial = 0.0;
  double solve_ns = 0.0;
  double worst_ratio = 1e300;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<ReplayResult> RunReplay(const Trace& trace, const ReplayOptions& options,
                               const ReplayProgress& progress) {
  const int g = options.ranks;
  if (g <= 0) return InvalidArgument("--ranks must be positive");
  for (const std::string& s : options.schemes) {
    if (std::find(std::begin(kKnownSchemes), std::end(kKnownSchemes), s) ==
        std::end(kKnownSchemes)) {
      return InvalidArgument("--schemes: unknown scheme \"" + s +
                             "\" (expected none, home, eplb, relief, relief-int, lp)");
    }
  }
  if (options.t_moe_us.empty()) return InvalidArgument("at least one T_moe is needed");
  const bool auto_passes = options.passes < 0;
  GCMOE_ASSIGN_OR_RETURN(bal::Topology topology, bal::ParseTopology(options.topology, g));
  bal::ReliefOptions relief_options;
  relief_options.fraction_bits = options.fraction_bits;
  relief_options.passes = auto_passes ? options.max_passes : options.passes;
  relief_options.kernel = options.kernel;
  GCMOE_ASSIGN_OR_RETURN(auto relief, bal::CreateReliefBalancer(relief_options));
  std::unique_ptr<bal::ReliefBalancer> relief_zero;  // I = 0, for the auto scan's T_solve(0)
  if (auto_passes) {
    relief_options.passes = 0;
    GCMOE_ASSIGN_OR_RETURN(relief_zero, bal::CreateReliefBalancer(relief_options));
  }
  const int e_count = trace.num_experts;

  ReplayResult result;
  result.topology = topology.ToString();
  result.kernel = relief->kernel_name();
  std::map<std::string, Accumulator> acc;
  std::map<std::string, std::vector<double>> step_solve_ns;  // every step, for medians
  double lp_spatial_sum = 0.0;
  std::vector<double> curve_sum(options.max_passes + 1, 0.0);
  double t0_sum = 0.0;
  double tmax_sum = 0.0;
  uint64_t hash = 0xCBF29CE484222325ull;

  bal::Split split;
  std::vector<double> fractional(g);
  std::vector<double> curve(options.max_passes + 1);
  std::vector<int64_t> loads(g);
  const bal::Placement contiguous = bal::ContiguousPlacement(g, e_count);
  int done = 0;
  for (const TraceRecord& record : trace.records) {
    const std::string where = "record \"" + record.name + "\": ";
    Result<bal::Placement> placement =
        bal::FitPlacement(record.mean_load, topology, std::min(options.replicas_per_rank, topology.degree()));
    if (!placement.ok()) return placement.status().WithContext(where);
    GCMOE_RETURN_IF_ERROR(relief->SetPlacement(*placement).WithContext(where));
    if (relief_zero) GCMOE_RETURN_IF_ERROR(relief_zero->SetPlacement(*placement));
    int replicated = 0;
    for (int e = 0; e < e_count; ++e) replicated += placement->replicated(e) ? 1 : 0;
    const int eplb_replicas = (e_count + replicated + g - 1) / g * g;
    result.eplb_replicas = eplb_replicas;
    Result<bal::EplbPlacement> eplb = bal::RebalanceExperts(
        record.mean_load, 1, eplb_replicas, options.eplb_groups, options.eplb_nodes, g);
    if (!eplb.ok()) return eplb.status().WithContext(where);

    std::map<std::string, Accumulator> rec;
    double lp_spatial = 0.0;
    double t0 = 0.0;
    double tmax = 0.0;
    std::vector<double> rec_curve(options.max_passes + 1, 0.0);
    const int steps = static_cast<int>(record.steps.size());
    for (const std::vector<int64_t>& step : record.steps) {
      GCMOE_ASSIGN_OR_RETURN(bal::LpSplit lp, bal::SolveMinMaxLp(*placement, step));
      const double s_lp = bal::SpatialUtilization(lp.loads);
      lp_spatial += s_lp;
      auto add = [&](const char* name, double spatial, double solve_ns) {
        Accumulator& a = rec[name];
        a.spatial += spatial;
        a.solve_ns += solve_ns;
        a.worst_ratio = std::min(a.worst_ratio, spatial / s_lp);
        step_solve_ns[name].push_back(solve_ns);
      };
      add("lp", s_lp, static_cast<double>(lp.solve_ns));

      GCMOE_RETURN_IF_ERROR(relief->Solve(step, &split));
      relief->FractionalLoads(fractional);
      add("relief", bal::SpatialUtilization(fractional), static_cast<double>(split.solve_ns));
      add("relief-int", bal::SpatialUtilization(split.load_after),
          static_cast<double>(split.solve_ns));
      add("home", bal::SpatialUtilization(split.load_before), 0.0);
      HashInto(hash, split.home_tokens);
      result.relief_fallbacks += relief->fell_back() ? 1 : 0;
      if (auto_passes) {
        tmax += static_cast<double>(split.solve_ns);
        GCMOE_RETURN_IF_ERROR(relief_zero->Solve(step, &split));
        t0 += static_cast<double>(split.solve_ns);
        GCMOE_RETURN_IF_ERROR(relief->RecordBalanceCurve(step, curve));
        for (size_t p = 0; p < curve.size(); ++p) rec_curve[p] += curve[p];
      }

      GCMOE_RETURN_IF_ERROR(bal::EplbStepLoads(*eplb, 0, step, loads));
      add("eplb", bal::SpatialUtilization(loads), 0.0);

      std::fill(loads.begin(), loads.end(), 0);
      for (int e = 0; e < e_count; ++e) loads[contiguous.home[e]] += step[e];
      add("none", bal::SpatialUtilization(loads), 0.0);
    }
    if (steps > 0) {
      for (auto& [name, a] : rec) {
        Accumulator& total = acc[name];
        total.spatial += a.spatial / steps;
        total.solve_ns += a.solve_ns / steps;
        total.worst_ratio = std::min(total.worst_ratio, a.worst_ratio);
      }
      lp_spatial_sum += lp_spatial / steps;
      for (size_t p = 0; p < curve_sum.size(); ++p) curve_sum[p] += rec_curve[p] / steps;
      t0_sum += t0 / steps;
      tmax_sum += tmax / steps;
      ++result.records;
      result.steps += steps;
    }
    if (progress) progress(++done, static_cast<int>(trace.records.size()));
  }
  if (result.records == 0) return InvalidArgument("the trace has no steps to replay");
  const double n = result.records;
  const double lp_spatial = lp_spatial_sum / n;

  auto make = [&](const std::string& name, double spatial, double solve_us, double worst) {
    SchemeResult s;
    s.name = name;
    s.spatial = spatial;
    s.attainment = bal::Attainment(spatial, lp_spatial);
    s.worst_attainment = worst;
    s.solve_us = solve_us;
    for (double t : options.t_moe_us) s.u_eff.push_back(bal::EffectiveUtilization(spatial, solve_us, t));
    return s;
  };
  for (const std::string& name : options.schemes) {
    const Accumulator& a = acc[name];
    result.schemes.push_back(make(name, a.spatial / n, a.solve_ns / n / 1e3, a.worst_ratio));
    result.schemes.back().solve_us_p50 = Median(step_solve_ns[name]) / 1e3;
  }
  if (auto_passes) {
    // T_solve(p) is linear in p (every pass does the same work): measured at 0 and max passes.
    std::vector<double> balance(curve_sum.size()), solve_ns(curve_sum.size());
    const double t_zero = t0_sum / n;
    const double per_pass = (tmax_sum / n - t_zero) / std::max(options.max_passes, 1);
    for (size_t p = 0; p < balance.size(); ++p) {
      balance[p] = curve_sum[p] / n;
      solve_ns[p] = t_zero + per_pass * static_cast<double>(p);
    }
    SchemeResult s;
    s.name = "relief-auto";
    s.worst_attainment = 0.0;
    for (double t : options.t_moe_us) {
      GCMOE_ASSIGN_OR_RETURN(int best, bal::ChoosePassCount(balance, solve_ns, t));
      s.passes.push_back(best);
      s.u_eff.push_back(bal::EffectiveUtilization(balance[best], solve_ns[best] / 1e3, t));
    }
    // The spatial and time columns describe the I* of the middle operating point.
    const int mid = s.passes[s.passes.size() / 2];
    s.spatial = balance[mid];
    s.attainment = bal::Attainment(s.spatial, lp_spatial);
    s.solve_us = s.solve_us_p50 = solve_ns[mid] / 1e3;
    result.schemes.push_back(s);
  }
  result.relief_split_hash = hash;
  return result;
}

}  // namespace gcmoe::tools
