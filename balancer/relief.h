// Relief: the per-step split of every replicated expert's tokens between its two copies, by
// integer pairwise relaxation over the compiled transfer list (DESIGN.md §5, relief.txt Alg. 1).
//
//   GCMOE_ASSIGN_OR_RETURN(auto relief, balancer::CreateReliefBalancer({.passes = 12}));
//   GCMOE_RETURN_IF_ERROR(relief->SetPlacement(placement));   // compiles the transfer list
//   GCMOE_RETURN_IF_ERROR(relief->Solve(expert_tokens, &split));  // every step, no allocation
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "balancer/balancer.h"
#include "balancer/transfer_list.h"
#include "common/status.h"

namespace gcmoe::balancer {

// Which implementation runs the passes. All give bit-identical splits; kAuto takes the widest
// one this CPU supports (checked at run time, so the binary runs on CPUs without AVX-512).
enum class ReliefKernel { kAuto, kScalar, kAvx2, kAvx512 };

struct ReliefOptions {
  // F: loads and masses are 32-bit words with F fractional bits; epsilon is one LSB. When a
  // step's total tokens would not fit in 31 - F integer bits, that step runs with the largest
  // F that fits (deterministic: it depends on the counts alone).
  int fraction_bits = 20;
  // I: passes per Solve when auto_passes is false.
  int passes = 12;
  // Eq. 3: after SetPlacement the first `calibration_steps` solves run at max_passes, record
  // the balance s[p] after every pass and the solve time, and then fix
  // I* = argmax_p s[p] / (1 + T_solve(p) / T_moe) for the solves that follow.
  // I* depends on this process's measured time: ranks that must agree bit for bit should
  // calibrate once and distribute I* as a fixed `passes` (the paper writes it into each call).
  bool auto_passes = false;
  int max_passes = 32;
  double t_moe_us = 500.0;
  int calibration_steps = 8;
  ReliefKernel kernel = ReliefKernel::kAuto;
};

class ReliefBalancer : public Balancer {
 public:
  // "scalar", "avx2" or "avx512": the kernel SetPlacement chose.
  virtual const char* kernel_name() const = 0;
  virtual const TransferList& transfer_list() const = 0;
  // The pass count the next Solve runs (I, or I* once calibration has finished).
  virtual int passes() const = 0;
  virtual bool calibrating() const = 0;

  // About the last Solve:
  // F actually used (see ReliefOptions::fraction_bits).
  virtual int fraction_bits_used() const = 0;
  // [G] per-rank loads under the fixed-point split before emission rounds it, in tokens
  // (L / 2^F): the fractional split that the metrics compare with the LP optimum.
  virtual void FractionalLoads(std::span<double> loads) const = 0;
  // [E] for a replicated expert, its mass still at home in LSBs (tokens * 2^F), with
  // 0 <= mass[e] <= tokens[e] * 2^F; -1 for an expert that is not replicated.
  virtual void HomeMass(std::span<int64_t> mass) const = 0;
  // True when rounding the fixed-point split to tokens would have raised the peak load above
  // the all-home load, so the split emitted was all-home instead (see Solve's contract).
  virtual bool fell_back() const = 0;

  // Instrumented solve for Eq. 3: balance (mean/max of the fixed-point loads) after
  // p = 0 .. spatial_by_pass.size()-1 passes. Does not change the calibration state.
  virtual Status RecordBalanceCurve(std::span<const int64_t> expert_tokens,
                                    std::span<double> spatial_by_pass) = 0;
};

// Fails on options out of range, or on a kernel this CPU cannot run.
Result<std::unique_ptr<ReliefBalancer>> CreateReliefBalancer(const ReliefOptions& options);

// Whether this CPU can run `kernel` (kAuto and kScalar always).
bool ReliefKernelAvailable(ReliefKernel kernel);

// Eq. 3: argmax over p >= 1 of balance_by_pass[p] / (1 + solve_ns_by_pass[p] / (t_moe_us * 1e3)),
// the smallest p on ties. Both spans are indexed by pass count and have equal sizes >= 2.
Result<int> ChoosePassCount(std::span<const double> balance_by_pass,
                            std::span<const double> solve_ns_by_pass, double t_moe_us);

}  // namespace gcmoe::balancer
