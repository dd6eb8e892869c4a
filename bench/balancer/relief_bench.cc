// Relief solve time (SIMD kernel and scalar reference) beside the exact LP (GLPK) on the same
// instances, at G in {8,16,32,64}, E in {64,128,256}, D = 2, I = 12, on one thread.
//   bench_relief [--benchmark_filter=...]      then a summary table with the GLPK/Relief ratio
// Instances: mean loads log-normal (sigma 1), placement fitted to them on the default torus;
// 64 steps of ~2048 assignments (256 tokens x top-8) drawn around the mean; the loop cycles
// through the steps. Times are Split::solve_ns / LpSplit::solve_ns medians. The summary also
// prints the effective clock, since on a shared host the same binary's times move with load.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "balancer/lp_oracle.h"
#include "balancer/placement.h"
#include "balancer/relief.h"
#include "common/splitmix64.h"

namespace gcmoe::balancer {
namespace {

constexpr int kSteps = 64;
constexpr int kReplicasPerRank = 2;
constexpr int kPasses = 12;

// SplitMix64 with Box-Muller: fixed, library-independent instances.
class Rng : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  double Uniform() { return Uniform01(); }
  double Normal() {
    const double u = std::max(Uniform(), 1e-300);
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * Uniform());
  }
};

struct Instance {
  Placement placement;
  std::vector<std::vector<int64_t>> steps;
};

const Instance& GetInstance(int g, int e) {
  static std::map<std::pair<int, int>, Instance> cache;
  auto it = cache.find({g, e});
  if (it != cache.end()) return it->second;
  Rng rng(1000003ull * g + e);
  std::vector<double> mean(e);
  double sum = 0;
  for (double& m : mean) sum += (m = std::exp(rng.Normal()));
  for (double& m : mean) m *= 2048.0 / sum;
  Instance inst;
  inst.placement = FitPlacement(mean, *DefaultTopology(g), kReplicasPerRank).value();
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> step(e);
    for (int i = 0; i < e; ++i) {
      step[i] = std::max<int64_t>(0, std::llround(mean[i] + std::sqrt(mean[i]) * rng.Normal()));
    }
    inst.steps.push_back(std::move(step));
  }
  return cache.emplace(std::make_pair(g, e), std::move(inst)).first->second;
}

std::map<std::tuple<std::string, int, int>, double> g_median_ns;
std::map<std::pair<int, int>, int> g_rounds;

double Median(std::vector<int64_t> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return static_cast<double>(v[v.size() / 2]);
}

void BM_Relief(benchmark::State& state, ReliefKernel kernel) {
  const int g = static_cast<int>(state.range(0));
  const int e = static_cast<int>(state.range(1));
  const Instance& inst = GetInstance(g, e);
  auto relief = std::move(CreateReliefBalancer({.passes = kPasses, .kernel = kernel}).value());
  if (!relief->SetPlacement(inst.placement).ok()) {
    state.SkipWithError("SetPlacement failed");
    return;
  }
  Split split;
  (void)relief->Solve(inst.steps[0], &split);  // sizes the Split once
  std::vector<int64_t> solve_ns;
  solve_ns.reserve(1 << 20);
  size_t i = 0;
  for (auto _ : state) {
    if (!relief->Solve(inst.steps[i++ % kSteps], &split).ok()) state.SkipWithError("Solve failed");
    benchmark::DoNotOptimize(split.home_tokens.data());
    if (solve_ns.size() < solve_ns.capacity()) solve_ns.push_back(split.solve_ns);
  }
  const double median = Median(solve_ns);
  state.counters["median_solve_ns"] = median;
  state.counters["rounds"] = relief->transfer_list().num_rounds();
  state.SetLabel(relief->kernel_name());
  g_median_ns[{relief->kernel_name(), g, e}] = median;
  g_rounds[{g, e}] = relief->transfer_list().num_rounds();
}

void BM_Glpk(benchmark::State& state) {
  const int g = static_cast<int>(state.range(0));
  const int e = static_cast<int>(state.range(1));
  const Instance& inst = GetInstance(g, e);
  std::vector<int64_t> solve_ns;
  size_t i = 0;
  for (auto _ : state) {
    Result<LpSplit> lp = SolveMinMaxLp(inst.placement, inst.steps[i++ % kSteps]);
    if (!lp.ok()) {
      state.SkipWithError(lp.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(lp->max_load);
    solve_ns.push_back(lp->solve_ns);
  }
  if (solve_ns.empty()) return;
  const double median = Median(solve_ns);
  state.counters["median_solve_ns"] = median;
  g_median_ns[{"glpk", g, e}] = median;
}

void Register() {
  std::vector<ReliefKernel> kernels = {ReliefKernel::kScalar};
  if (ReliefKernelAvailable(ReliefKernel::kAvx2)) kernels.push_back(ReliefKernel::kAvx2);
  if (ReliefKernelAvailable(ReliefKernel::kAvx512)) kernels.push_back(ReliefKernel::kAvx512);
  for (int g : {8, 16, 32, 64}) {
    for (int e : {64, 128, 256}) {
      for (ReliefKernel k : kernels) {
        const char* name = k == ReliefKernel::kScalar ? "scalar" : k == ReliefKernel::kAvx2 ? "avx2" : "avx512";
        benchmark::RegisterBenchmark((std::string("relief_") + name).c_str(), BM_Relief, k)
            ->Args({g, e})
            ->ArgNames({"G", "E"});
      }
      benchmark::RegisterBenchmark("glpk", BM_Glpk)->Args({g, e})->ArgNames({"G", "E"});
    }
  }
}

// Effective core clock over short windows: a chain of dependent adds runs one per cycle, so
// its median rate says how much of a core this (possibly shared) host gave the benchmark.
double EffectiveGhz() {
  std::vector<int64_t> ns;
  for (int rep = 0; rep < 2000; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t x = 1;
    // Eight dependent adds per iteration, so the loop branch (and where it happens to fall in
    // the instruction cache) cannot set the pace.
    for (int i = 0; i < 10000 / 8; ++i) {
      for (int k = 0; k < 8; ++k) {
        x += 1;
        asm volatile("" : "+r"(x));  // keeps each add: one dependent chain
      }
    }
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count());
  }
  return 10000.0 / Median(ns);
}

void PrintSummary(double ghz_before, double ghz_after) {
  std::printf("\nRelief (D=%d, I=%d) vs GLPK exact LP, median ns per solve, one thread\n",
              kReplicasPerRank, kPasses);
  std::printf("effective clock (median of 10k dependent adds): %.2f GHz before, %.2f GHz after\n",
              ghz_before, ghz_after);
  std::printf("%4s %4s %6s %10s %10s %10s %12s %14s\n", "G", "E", "rounds", "avx512", "avx2",
              "scalar", "glpk", "glpk/fastest");
  for (const auto& [key, rounds] : g_rounds) {
    const auto [g, e] = key;
    auto get = [&](const char* k) {
      auto it = g_median_ns.find({k, g, e});
      return it == g_median_ns.end() ? -1.0 : it->second;
    };
    const double avx512 = get("avx512"), avx2 = get("avx2"), scalar = get("scalar"),
                 glpk = get("glpk");
    double fastest = scalar;
    if (avx2 > 0) fastest = std::min(fastest, avx2);
    if (avx512 > 0) fastest = std::min(fastest, avx512);
    auto cell = [](double v) { return v < 0 ? std::string("-") : std::to_string(std::llround(v)); };
    std::printf("%4d %4d %6d %10s %10s %10s %12s %14s\n", g, e, rounds, cell(avx512).c_str(),
                cell(avx2).c_str(), cell(scalar).c_str(), cell(glpk).c_str(),
                glpk > 0 && fastest > 0 ? (std::to_string(std::llround(glpk / fastest)) + "x").c_str()
                                        : "-");
  }
}

}  // namespace
}  // namespace gcmoe::balancer

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  gcmoe::balancer::Register();
  const double ghz_before = gcmoe::balancer::EffectiveGhz();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  gcmoe::balancer::PrintSummary(ghz_before, gcmoe::balancer::EffectiveGhz());
  return 0;
}
