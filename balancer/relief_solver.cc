// The Relief balancer: per-step prologue (counts to fixed point), the passes (one of the
// kernels of relief_kernels.h), and emission of the integer split (DESIGN.md §5).
//
// Allocation: SetPlacement sizes every buffer. Solve then allocates nothing, provided the
// caller's Split already has its vectors sized (true from the second Solve with one Split on).
//
// State layout: loads live in "lanes" (for the scalar kernel lane = rank; for the SIMD kernels
// the lane program's layout). The scalar kernel keeps one mass per transfer in list order; the
// SIMD kernels keep per-round lane arrays (see LaneProgram).
#include <algorithm>
#include <bit>
#include <chrono>
#include <limits>

#include "balancer/relief.h"
#include "balancer/relief_kernels.h"

namespace gcmoe::balancer {
namespace {

using relief_internal::AlignedInts;
using relief_internal::LaneProgram;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* KernelName(ReliefKernel kernel) {
  switch (kernel) {
    case ReliefKernel::kAvx2: return "avx2";
    case ReliefKernel::kAvx512: return "avx512";
    default: return "scalar";
  }
}

double MedianInPlace(std::span<int64_t> values) {
  auto mid = values.begin() + values.size() / 2;
  std::nth_element(values.begin(), mid, values.end());
  return static_cast<double>(*mid);
}

// Largest pass count a balancer accepts (creation options and SetPasses alike).
constexpr int kMaxPassCount = 1 << 16;

// Per transfer, where emission finds its state, packed for one pass in list order.
struct TransferSlots {
  int32_t expert;
  int32_t slot;       // SIMD: round * lanes + lane of the computing side; scalar: the transfer
  int32_t host_mask;  // SIMD: -1 when `slot` is the host side, else 0
};

class ReliefBalancerImpl final : public ReliefBalancer {
 public:
  ReliefBalancerImpl(const ReliefOptions& options, ReliefKernel kernel)
      : options_(options), kernel_(kernel) {}

  std::string name() const override { return "relief"; }
  const char* kernel_name() const override { return KernelName(kernel_); }
  const TransferList& transfer_list() const override { return list_; }
  const Placement& placement() const override { return placement_; }
  int passes() const override { return passes_; }
  Status SetPasses(int passes) override {
    if (passes < 1 || passes > kMaxPassCount) {
      return InvalidArgument("relief: passes is " + std::to_string(passes) + ", expected 1.." +
                             std::to_string(kMaxPassCount));
    }
    passes_ = passes;
    return Status::Ok();
  }
  bool calibrating() const override {
    return options_.auto_passes && calibration_done_ < options_.calibration_steps;
  }
  int fraction_bits_used() const override { return fraction_bits_; }
  bool fell_back() const override { return fell_back_; }

  Status SetPlacement(const Placement& placement) override {
    GCMOE_ASSIGN_OR_RETURN(TransferList list, CompileTransferList(placement));
    placement_ = placement;
    list_ = std::move(list);
    const int g = placement_.num_ranks;
    const int num_experts = placement_.num_experts;
    const int num_transfers = static_cast<int>(list_.transfers.size());
    width_ = kernel_ == ReliefKernel::kAvx512 ? 16 : kernel_ == ReliefKernel::kAvx2 ? 8 : 0;

    lane_of_rank_.resize(g);
    size_t slots = 0;
    if (width_ > 0) {
      program_ = relief_internal::BuildLaneProgram(list_, width_);
      lanes_ = program_.num_lanes;
      lane_of_rank_.assign(program_.lane_of_rank.begin(), program_.lane_of_rank.end());
      slots = static_cast<size_t>(program_.num_rounds) * lanes_;
    } else {
      program_ = LaneProgram();
      lanes_ = g;
      for (int r = 0; r < g; ++r) lane_of_rank_[r] = r;
    }
    lane_mass_.assign(slots, 0);
    lane_tok_.assign(slots, 0);
    partner_.assign(lanes_, 0);
    load_.assign(lanes_, 0);
    load_init_.assign(lanes_, 0);
    load_after_lanes_.assign(lanes_, 0);
    mass_.assign(num_transfers, 0);
    tok_t_.assign(num_transfers, 0);

    // Experts by the lane of their home rank, as rows padded with index E (a zero entry of
    // tok_fx_): the all-home loads become fixed-length sums (gathers in the SIMD prologue),
    // with no branch on how many experts a rank holds.
    std::vector<std::vector<int>> homed(lanes_);
    for (int e = 0; e < num_experts; ++e) homed[lane_of_rank_[placement_.home[e]]].push_back(e);
    home_rows_ = 0;
    for (const auto& h : homed) home_rows_ = std::max<int>(home_rows_, h.size());
    home_index_.assign(static_cast<size_t>(home_rows_) * lanes_, num_experts);
    for (int l = 0; l < lanes_; ++l) {
      for (size_t i = 0; i < homed[l].size(); ++i) home_index_[i * lanes_ + l] = homed[l][i];
    }
    tok_fx_.assign(num_experts + 1, 0);
    scratch_tokens_.assign(num_experts, 0);
    home_lane_.assign(slots, 0);
    // The SIMD prologue gathers each computing lane's expert total; E marks the other lanes.
    lane_expert_.assign(slots, num_experts);
    fill_chunks_.clear();

    slots_.resize(num_transfers);
    expert_transfer_.assign(num_experts, -1);
    for (int t = 0; t < num_transfers; ++t) {
      const Transfer& tr = list_.transfers[t];
      TransferSlots& s = slots_[t];
      s.expert = tr.expert;
      if (width_ > 0) {
        const bool home_side = program_.transfer_slot_is_home[t] != 0;
        s.slot = program_.transfer_slot[t];
        s.host_mask = home_side ? 0 : -1;
        lane_expert_[s.slot] = tr.expert;
        const int32_t other = program_.transfer_other_slot[t];  // both sides compute
        if (other >= 0) lane_expert_[other] = tr.expert;
      } else {
        s.slot = t;
        s.host_mask = 0;
      }
      expert_transfer_[tr.expert] = t;
    }
    // Chunks of 8 lanes holding any transfer: the rest never change from zero (the block of a
    // kPair op that does not compute, idle lanes), so the prologue skips them.
    for (size_t chunk = 0; chunk < slots; chunk += 8) {
      bool used = false;
      for (size_t j = chunk; j < chunk + 8; ++j) used = used || lane_expert_[j] != num_experts;
      if (used) fill_chunks_.push_back(static_cast<int32_t>(chunk));
    }

    // Calibration restarts with every placement: s[p] belongs to a placement (Eq. 3).
    passes_ = options_.auto_passes ? options_.max_passes : options_.passes;
    calibration_done_ = 0;
    balance_sum_.assign(options_.max_passes + 1, 0.0);
    curve_.assign(options_.max_passes + 1, 0.0);
    cal_overhead_ns_.assign(std::max(options_.calibration_steps, 1), 0);
    cal_passes_ns_.assign(std::max(options_.calibration_steps, 1), 0);
    fraction_bits_ = options_.fraction_bits;
    fell_back_ = false;
    return Status::Ok();
  }

  Status Solve(std::span<const int64_t> expert_tokens, Split* split) override {
    const int64_t start_ns = NowNs();
    const bool calibrating_now = calibrating();
    if (calibrating_now) {
      // s[p] of this step, from an instrumented run before the timed one.
      GCMOE_RETURN_IF_ERROR(Prologue(expert_tokens, nullptr));
      Curve(curve_);
      for (size_t p = 0; p < curve_.size(); ++p) balance_sum_[p] += curve_[p];
    }
    const int64_t solve_start_ns = calibrating_now ? NowNs() : start_ns;
    SizeSplit(split);
    GCMOE_RETURN_IF_ERROR(Prologue(expert_tokens, split->home_tokens.data()));
    const int64_t passes_start_ns = calibrating_now ? NowNs() : 0;
    RunPasses(passes_);
    const int64_t passes_ns = calibrating_now ? NowNs() - passes_start_ns : 0;
    Emit(expert_tokens, split);
    split->passes = passes_;
    const int64_t end_ns = NowNs();
    split->solve_ns = end_ns - solve_start_ns;
    if (calibrating_now) FinishCalibrationStep(end_ns - solve_start_ns - passes_ns, passes_ns);
    return Status::Ok();
  }

  void FractionalLoads(std::span<double> loads) const override {
    const double scale = 1.0 / static_cast<double>(int64_t{1} << fraction_bits_);
    const size_t n = std::min<size_t>(loads.size(), placement_.num_ranks);
    for (size_t r = 0; r < n; ++r) loads[r] = load_[lane_of_rank_[r]] * scale;
  }

  void HomeMass(std::span<int64_t> mass) const override {
    const size_t n = std::min<size_t>(mass.size(), placement_.num_experts);
    for (size_t e = 0; e < n; ++e) {
      mass[e] = expert_transfer_[e] < 0 ? -1 : MassOf(expert_transfer_[e]);
    }
  }

  Status RecordBalanceCurve(std::span<const int64_t> expert_tokens,
                            std::span<double> spatial_by_pass) override {
    GCMOE_RETURN_IF_ERROR(Prologue(expert_tokens, nullptr));
    Curve(spatial_by_pass);
    return Status::Ok();
  }

 private:
  // Resizing keeps the capacity, so from the second Solve with one Split on this allocates
  // nothing.
  void SizeSplit(Split* split) const {
    split->home_tokens.resize(placement_.num_experts);
    split->load_before.resize(placement_.num_ranks);
    split->load_after.resize(placement_.num_ranks);
  }

  // Counts to fixed point: loads with everything at home, and the kernel's per-transfer state.
  // Also copies the counts to `home_tokens` when given (emission starts from that copy). On an
  // error return that copy may be partial.
  Status Prologue(std::span<const int64_t> expert_tokens, int64_t* home_tokens) {
    const int num_experts = placement_.num_experts;
    if (placement_.num_ranks == 0) {
      return FailedPrecondition("balancer: Solve before SetPlacement");
    }
    if (static_cast<int>(expert_tokens.size()) != num_experts) {
      return InvalidArgument("balancer: expected " + std::to_string(num_experts) +
                             " expert totals, got " + std::to_string(expert_tokens.size()));
    }
    constexpr int64_t kMaxTotal = std::numeric_limits<int32_t>::max();
    const int64_t* tokens = expert_tokens.data();
    // Branch-free scan: a count outside [0, 2^31) sets a bit at or above bit 31 of the OR, and
    // only then does the error path look for it.
    relief_internal::TokenScan scan{0, 0};
    int64_t* copy = home_tokens != nullptr ? home_tokens : scratch_tokens_.data();
    if (width_ > 0) {
      scan = relief_internal::ScanTokensAvx2(tokens, num_experts, copy);
    } else {
      for (int e = 0; e < num_experts; ++e) {
        copy[e] = tokens[e];
        scan.all_bits |= static_cast<uint64_t>(tokens[e]);
        scan.total += static_cast<uint64_t>(tokens[e]);
      }
    }
    if ((scan.all_bits >> 31) != 0) {
      for (int e = 0; e < num_experts; ++e) {
        if (tokens[e] < 0 || tokens[e] > kMaxTotal) {
          return InvalidArgument("balancer: expert_tokens[" + std::to_string(e) + "] is " +
                                 std::to_string(tokens[e]) + ", expected 0.." +
                                 std::to_string(kMaxTotal));
        }
      }
    }
    if (scan.total > static_cast<uint64_t>(kMaxTotal)) {
      return ResourceExhausted("balancer: the step has " + std::to_string(scan.total) +
                               " assignments, at most " + std::to_string(kMaxTotal) + " fit");
    }
    // Every load, mass and gap magnitude is at most total << F, which must stay below 2^31.
    const int total_bits = std::bit_width(scan.total);
    fraction_bits_ = std::min(options_.fraction_bits, 31 - total_bits);
    const int f = fraction_bits_;
    if (width_ > 0) {
      relief_internal::PrepareAvx2(tokens, num_experts, f, home_index_.data(), home_rows_,
                                   lane_expert_.data(), program_.lane_home.data(),
                                   fill_chunks_.data(), static_cast<int>(fill_chunks_.size()),
                                   program_, tok_fx_.data(), load_.data(), load_init_.data(),
                                   lane_mass_.data(), lane_tok_.data());
      return Status::Ok();
    }
    // The reference path: plain loops, in rank order.
    for (int e = 0; e < num_experts; ++e) tok_fx_[e] = static_cast<int32_t>(tokens[e] << f);
    for (int r = 0; r < lanes_; ++r) {
      int32_t sum = 0;
      for (int row = 0; row < home_rows_; ++row) sum += tok_fx_[home_index_[row * lanes_ + r]];
      load_[r] = load_init_[r] = sum;
    }
    const int num_transfers = static_cast<int>(slots_.size());
    for (int t = 0; t < num_transfers; ++t) mass_[t] = tok_t_[t] = tok_fx_[slots_[t].expert];
    return Status::Ok();
  }

  void RunPasses(int passes) {
    switch (kernel_) {
      case ReliefKernel::kAvx512:
        relief_internal::RunPassesAvx512(program_, passes, load_.data(), lane_mass_.data(),
                                         lane_tok_.data(), partner_.data());
        break;
      case ReliefKernel::kAvx2:
        relief_internal::RunPassesAvx2(program_, passes, load_.data(), lane_mass_.data(),
                                       lane_tok_.data(), partner_.data());
        break;
      default:
        relief_internal::RunPassesScalar(list_, passes, load_.data(), mass_.data(), tok_t_.data());
        break;
    }
  }

  // The home copy's fixed-point mass of transfer t. A SIMD slot on the host side holds the
  // host's amount, so the mass is the total minus it; branch-free, because which side computes
  // follows no pattern a predictor could learn.
  int32_t MassOf(int t) const {
    const TransferSlots& s = slots_[t];
    if (width_ == 0) return mass_[t];
    const int32_t a = lane_mass_[s.slot];
    return ((a ^ s.host_mask) - s.host_mask) + (lane_tok_[s.slot] & s.host_mask);
  }

  double Spatial() const {
    int64_t sum = 0;
    int32_t peak = 0;
    for (int r = 0; r < placement_.num_ranks; ++r) {
      const int32_t l = load_[lane_of_rank_[r]];
      sum += l;
      peak = std::max(peak, l);
    }
    if (peak == 0) return 1.0;
    return static_cast<double>(sum) / placement_.num_ranks / peak;
  }

  // Balance after 0, 1, ... passes, continuing from the state Prologue left.
  void Curve(std::span<double> out) {
    for (size_t p = 0; p < out.size(); ++p) {
      if (p > 0) RunPasses(1);
      out[p] = Spatial();
    }
  }

  // The home share of each replicated expert rounds half up from the fixed-point mass. Rounding
  // can add up to half a token per transfer to a rank, so should the rounded split's peak exceed
  // the all-home peak, the all-home split is emitted instead: Relief never makes a step worse
  // than no balancing on the same placement.
  void Emit(std::span<const int64_t> expert_tokens, Split* split) {
    const int g = placement_.num_ranks;
    const int f = fraction_bits_;
    int64_t* home_tokens = split->home_tokens.data();  // holds the counts (Prologue's copy)
    const int num_transfers = static_cast<int>(slots_.size());
    int64_t peak_before = 0;
    int64_t peak_after = 0;
    if (width_ > 0) {
      // The kernels round each computing lane's home share and sum the lanes' integer loads
      // round by round; the scalar reference below does it per transfer, and the tests hold
      // the two equal.
      if (kernel_ == ReliefKernel::kAvx512) {
        relief_internal::EmitLoadsAvx512(program_, f, load_init_.data(), lane_mass_.data(),
                                         lane_tok_.data(), load_after_lanes_.data(),
                                         home_lane_.data());
      } else {
        relief_internal::EmitLoadsAvx2(program_, f, load_init_.data(), lane_mass_.data(),
                                       lane_tok_.data(), load_after_lanes_.data(),
                                       home_lane_.data());
      }
      for (int t = 0; t < num_transfers; ++t) {
        home_tokens[slots_[t].expert] = home_lane_[slots_[t].slot];
      }
      const relief_internal::RankPeaks peaks = relief_internal::EmitRanksAvx2(
          lane_of_rank_.data(), g, f, load_init_.data(), load_after_lanes_.data(),
          split->load_before.data(), split->load_after.data());
      peak_before = peaks.before;
      peak_after = peaks.after;
    } else {
      const int64_t half = f > 0 ? int64_t{1} << (f - 1) : 0;
      for (int r = 0; r < g; ++r) {
        split->load_before[r] = split->load_after[r] = load_init_[r] >> f;
        peak_before = std::max(peak_before, split->load_before[r]);
      }
      for (int t = 0; t < num_transfers; ++t) {
        const int e = slots_[t].expert;
        home_tokens[e] = (static_cast<int64_t>(mass_[t]) + half) >> f;
        const int64_t moved = expert_tokens[e] - home_tokens[e];
        split->load_after[list_.transfers[t].home] -= moved;
        split->load_after[list_.transfers[t].host] += moved;
      }
      for (int r = 0; r < g; ++r) peak_after = std::max(peak_after, split->load_after[r]);
    }
    fell_back_ = peak_after > peak_before;
    if (fell_back_) {
      std::copy(expert_tokens.begin(), expert_tokens.end(), home_tokens);
      std::copy(split->load_before.begin(), split->load_before.end(), split->load_after.begin());
    }
  }

  void FinishCalibrationStep(int64_t overhead_ns, int64_t passes_ns) {
    cal_overhead_ns_[calibration_done_] = overhead_ns;
    cal_passes_ns_[calibration_done_] = passes_ns;
    ++calibration_done_;
    if (calibration_done_ < options_.calibration_steps) return;
    const int max_p = options_.max_passes;
    const double overhead = MedianInPlace(cal_overhead_ns_);
    const double per_pass = MedianInPlace(cal_passes_ns_) / max_p;
    for (int p = 0; p <= max_p; ++p) {
      balance_sum_[p] /= calibration_done_;
      curve_[p] = overhead + per_pass * p;  // reused as T_solve(p)
    }
    Result<int> best = ChoosePassCount(balance_sum_, curve_, options_.t_moe_us);
    passes_ = best.ok() ? *best : max_p;
  }

  ReliefOptions options_;
  ReliefKernel kernel_;
  Placement placement_;
  TransferList list_;
  LaneProgram program_;
  int width_ = 0;  // SIMD lanes per block; 0 for the scalar kernel
  int lanes_ = 0;
  int passes_ = 0;
  int fraction_bits_ = 0;
  bool fell_back_ = false;

  std::vector<int32_t> lane_of_rank_;   // [G]
  int home_rows_ = 0;
  AlignedInts home_index_;              // [home_rows][lanes] experts by home lane, E = none
  AlignedInts lane_expert_;             // [rounds * lanes] SIMD: computing lane's expert, E = none
  AlignedInts tok_fx_;                  // [E + 1] counts << F, then a zero
  std::vector<int64_t> scratch_tokens_;  // [E] the counts' copy when no Split takes it
  std::vector<int32_t> fill_chunks_;    // SIMD: 8-lane chunks of the lane arrays with transfers
  std::vector<TransferSlots> slots_;    // [T] list order
  std::vector<int> expert_transfer_;    // [E] transfer of a replicated expert, else -1
  AlignedInts load_;                    // [lanes] fixed point; padding lanes stay zero
  AlignedInts load_init_;               // [lanes] all-home loads << F
  AlignedInts load_after_lanes_;        // [lanes] SIMD emission
  AlignedInts home_lane_;               // [rounds * lanes] SIMD emission: home shares
  AlignedInts lane_mass_;               // [rounds * lanes] SIMD: amount on the lane's copy
  AlignedInts lane_tok_;                // [rounds * lanes] SIMD: the lane's expert total
  AlignedInts partner_;                 // [lanes] SIMD scratch
  AlignedInts mass_;                    // [T] scalar kernel: mass at home per transfer
  AlignedInts tok_t_;                   // [T] scalar kernel: tokens per transfer

  int calibration_done_ = 0;
  std::vector<double> balance_sum_;  // [max_passes + 1] sum of s[p] over calibration steps
  std::vector<double> curve_;        // [max_passes + 1] scratch
  std::vector<int64_t> cal_overhead_ns_, cal_passes_ns_;  // [calibration_steps]
};

}  // namespace

bool ReliefKernelAvailable(ReliefKernel kernel) {
  switch (kernel) {
    case ReliefKernel::kAvx2: return relief_internal::CpuHasAvx2();
    case ReliefKernel::kAvx512: return relief_internal::CpuHasAvx512();
    default: return true;
  }
}

Result<std::unique_ptr<ReliefBalancer>> CreateReliefBalancer(const ReliefOptions& options) {
  if (options.fraction_bits < 0 || options.fraction_bits > 30) {
    return InvalidArgument("relief: fraction_bits is " + std::to_string(options.fraction_bits) +
                           ", expected 0..30");
  }
  constexpr int kMaxPasses = kMaxPassCount;
  if (options.passes < 0 || options.passes > kMaxPasses) {
    return InvalidArgument("relief: passes is " + std::to_string(options.passes) +
                           ", expected 0.." + std::to_string(kMaxPasses));
  }
  if (options.auto_passes) {
    if (options.max_passes < 1 || options.max_passes > kMaxPasses) {
      return InvalidArgument("relief: max_passes is " + std::to_string(options.max_passes) +
                             ", expected 1.." + std::to_string(kMaxPasses));
    }
    if (!(options.t_moe_us > 0)) return InvalidArgument("relief: t_moe_us must be > 0");
    if (options.calibration_steps < 1) {
      return InvalidArgument("relief: calibration_steps must be >= 1");
    }
  }
  ReliefKernel kernel = options.kernel;
  if (kernel == ReliefKernel::kAuto) {
    kernel = relief_internal::CpuHasAvx512() ? ReliefKernel::kAvx512
             : relief_internal::CpuHasAvx2() ? ReliefKernel::kAvx2
                                             : ReliefKernel::kScalar;
  } else if (!ReliefKernelAvailable(kernel)) {
    return Unimplemented(std::string("relief: this CPU cannot run the ") + KernelName(kernel) +
                         " kernel");
  }
  return std::unique_ptr<ReliefBalancer>(new ReliefBalancerImpl(options, kernel));
}

Result<int> ChoosePassCount(std::span<const double> balance_by_pass,
                            std::span<const double> solve_ns_by_pass, double t_moe_us) {
  if (balance_by_pass.size() < 2 || balance_by_pass.size() != solve_ns_by_pass.size()) {
    return InvalidArgument("relief: pass-count scan needs equal-length curves of >= 2 points");
  }
  if (!(t_moe_us > 0)) return InvalidArgument("relief: t_moe_us must be > 0");
  const double t_moe_ns = t_moe_us * 1e3;
  int best = 0;
  double best_value = -1.0;
  for (size_t p = 0; p < balance_by_pass.size(); ++p) {
    const double value = balance_by_pass[p] / (1.0 + solve_ns_by_pass[p] / t_moe_ns);
    if (value > best_value) {
      best_value = value;
      best = static_cast<int>(p);
    }
  }
  return best;
}

}  // namespace gcmoe::balancer
