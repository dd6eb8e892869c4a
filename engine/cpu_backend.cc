// The CPU backend: one rank's share of a layer step over the shared-memory exchange, with the
// same shape as the GPU engine (stage -> tag-1 barrier -> pull and compute -> scatter partials
// into the source's combine buffer -> arrivals -> reduce in slot order).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/backend.h"
#include "engine/expert_ffn.h"
#include "engine/numerics.h"
#include "engine/shm_exchange.h"
#include "engine/thread_pool.h"

namespace gcmoe::engine {
namespace {

// Rows per compute task: large enough to reuse each decoded weight tile across rows, small
// enough that a hot expert still spreads over every worker.
constexpr int kRowsPerTask = 16;

struct Assignment {
  int32_t src;
  int32_t token;
  int32_t slot;
  float weight;
};

struct Task {
  int expert;  // -1: shared expert over this rank's own tokens [begin, end)
  int begin;
  int end;
};

struct WorkerScratch {
  FfnScratch ffn;
  std::vector<const uint8_t*> x_rows;
  std::vector<const uint8_t*> scale_rows;
  std::vector<uint16_t*> out_rows;
  std::vector<float> route_weights;
  std::vector<float> staging;  // one token's activations as floats
};

void ToFloats(DType dtype, const uint8_t* row, int n, float* out) {
  switch (dtype) {
    case DType::kFP32:
      std::memcpy(out, row, sizeof(float) * n);
      return;
    case DType::kBF16:
      for (int i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, 2);
        out[i] = numerics::BF16ToFloat(bits);
      }
      return;
    case DType::kFP16:
      for (int i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * i, 2);
        out[i] = numerics::FP16ToFloat(bits);
      }
      return;
    case DType::kFP8E4M3:
      break;  // staged without conversion
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const BackendOptions& options, std::unique_ptr<ShmExchange> exchange, int threads)
      : options_(options), exchange_(std::move(exchange)), pool_(threads), scratch_(pool_.size()) {
    for (WorkerScratch& s : scratch_) {
      s.x_rows.resize(kRowsPerTask);
      s.scale_rows.resize(kRowsPerTask);
      s.out_rows.resize(kRowsPerTask);
      s.route_weights.resize(kRowsPerTask);
      s.staging.resize(options.model.hidden);
    }
  }

  std::string name() const override { return "cpu"; }

  Status LoadExperts(const WeightSource& source, std::span<const int> experts) override {
    const ModelSpec& m = options_.model;
    routed_.clear();
    routed_.resize(m.num_layers);
    shared_.clear();
    shared_.resize(m.num_layers);
    for (auto& layer : routed_) layer.resize(m.num_experts);
    for (int l = 0; l < m.num_layers; ++l) {
      for (int e : experts) {
        if (e < 0 || e >= m.num_experts) {
          return InvalidArgument("cpu backend: expert " + std::to_string(e) + " out of range");
        }
        GCMOE_ASSIGN_OR_RETURN(ExpertWeights w, source.LoadExpert(l, e));
        routed_[l][e] = std::make_unique<ExpertWeights>(std::move(w));
      }
      if (m.has_shared()) {
        GCMOE_ASSIGN_OR_RETURN(SharedExpertWeights w, source.LoadShared(l));
        shared_[l] = std::make_unique<SharedExpertWeights>(std::move(w));
      }
    }
    return Status::Ok();
  }

  std::string transport_name() const override { return exchange_->name(); }

  Status ConnectPeers(const PeerSetup& setup) override {
    return exchange_->Connect(setup.peer_names);
  }

  void Abort(uint64_t generation) override {
    uint64_t prev = abort_generation_.load(std::memory_order_relaxed);
    while (prev < generation &&
           !abort_generation_.compare_exchange_weak(prev, generation, std::memory_order_release)) {
    }
  }

  Status Step(const StepContext& ctx, StepOutput* out) override;

 private:
  bool aborted(uint64_t generation) const {
    return abort_generation_.load(std::memory_order_acquire) >= generation;
  }
  Status CheckStep(const StepContext& ctx) const;
  void StageInputs(const StepContext& ctx);
  Status CollectWork(const StepContext& ctx);
  Status Compute(const StepContext& ctx);
  void Reduce(const StepContext& ctx, StepOutput* out);

  BackendOptions options_;
  std::unique_ptr<ShmExchange> exchange_;
  ThreadPool pool_;
  std::vector<WorkerScratch> scratch_;
  std::vector<std::vector<std::unique_ptr<ExpertWeights>>> routed_;  // [layer][expert] or null
  std::vector<std::unique_ptr<SharedExpertWeights>> shared_;         // [layer]
  std::atomic<uint64_t> abort_generation_{0};

  // Per-step work, storage reused across steps.
  std::vector<std::vector<Assignment>> work_;  // [expert] assignments this rank computes
  std::vector<int64_t> seen_;                  // [expert] running position while scanning
  std::vector<Task> tasks_;
};

Status CpuBackend::CheckStep(const StepContext& ctx) const {
  const ModelSpec& m = options_.model;
  if (!exchange_->connected()) {
    return FailedPrecondition("cpu backend: rank " + std::to_string(options_.rank) +
                              " is not connected to its peers");
  }
  if (ctx.layer < 0 || ctx.layer >= m.num_layers || routed_.empty()) {
    return NotFound("cpu backend: layer " + std::to_string(ctx.layer) + " is not loaded");
  }
  if (ctx.num_tokens < 0 || ctx.num_tokens > options_.max_tokens_per_rank) {
    return ResourceExhausted("cpu backend: " + std::to_string(ctx.num_tokens) +
                             " tokens exceed the per-rank capacity of " +
                             std::to_string(options_.max_tokens_per_rank));
  }
  const StepPlan* plan = ctx.plan;
  if (plan == nullptr || plan->world_size != options_.world_size ||
      plan->num_experts != m.num_experts ||
      plan->tokens_per_rank[options_.rank] != ctx.num_tokens) {
    return Internal("cpu backend: the step plan does not match this rank's shard");
  }
  for (int t : plan->tokens_per_rank) {
    if (t > options_.max_tokens_per_rank) {
      return ResourceExhausted("cpu backend: a shard of " + std::to_string(t) +
                               " tokens exceeds the per-rank capacity");
    }
  }
  if (ctx.hidden.dtype == DType::kFP8E4M3 && ctx.hidden.scales == nullptr) {
    return InvalidArgument("cpu backend: FP8 hidden without scales");
  }
  return Status::Ok();
}

void CpuBackend::StageInputs(const StepContext& ctx) {
  const int H = options_.model.hidden;
  const int k = options_.model.top_k;
  const int T = ctx.num_tokens;
  const SegmentView self = exchange_->self();
  if (ctx.hidden.dtype == DType::kFP8E4M3) {
    std::memcpy(self.x(), ctx.hidden.data, static_cast<size_t>(T) * H);
    std::memcpy(self.scales(), ctx.hidden.scales, static_cast<size_t>(T) * (H / 32));
  } else {
    const auto* src = static_cast<const uint8_t*>(ctx.hidden.data);
    const size_t row_bytes = static_cast<size_t>(H) * DTypeBytes(ctx.hidden.dtype);
    pool_.ParallelFor(T, [&](int64_t t, int worker) {
      float* row = scratch_[worker].staging.data();
      ToFloats(ctx.hidden.dtype, src + t * row_bytes, H, row);
      numerics::QuantizeE4M3K32(row, H, self.x() + t * H, self.scales() + t * (H / 32));
    });
  }
  std::memcpy(self.ids(), ctx.topk_ids, sizeof(int32_t) * T * k);
  std::memcpy(self.weights(), ctx.topk_weights, sizeof(float) * T * k);
}

// Walks every source's routing in (source, token, slot) order, numbering each expert's
// assignments exactly as the plan does, and keeps those this rank computes.
Status CpuBackend::CollectWork(const StepContext& ctx) {
  const ModelSpec& m = options_.model;
  const StepPlan& plan = *ctx.plan;
  const int E = m.num_experts;
  const int k = m.top_k;
  const int me = options_.rank;
  work_.resize(E);
  for (auto& w : work_) w.clear();
  seen_.resize(E);
  for (int s = 0; s < plan.world_size; ++s) {
    const SegmentView src = exchange_->peer(s);
    const int T_s = src.num_tokens();
    if (T_s != plan.tokens_per_rank[s]) {
      return Internal("cpu backend: rank " + std::to_string(s) + " published " +
                      std::to_string(T_s) + " tokens, the plan expects " +
                      std::to_string(plan.tokens_per_rank[s]));
    }
    std::copy_n(plan.src_offset.begin() + static_cast<size_t>(s) * E, E, seen_.begin());
    const int32_t* ids = src.ids();
    const float* weights = src.weights();
    for (int t = 0; t < T_s; ++t) {
      for (int j = 0; j < k; ++j) {
        const int32_t e = ids[t * k + j];
        if (e < 0) continue;
        if (e >= E) {
          return Internal("cpu backend: rank " + std::to_string(s) + " token " + std::to_string(t) +
                          " routes to expert " + std::to_string(e));
        }
        const int64_t position = seen_[e]++;
        if (plan.ComputeRank(e, position) == me) {
          work_[e].push_back({s, t, j, weights[t * k + j]});
        }
      }
    }
    for (int e = 0; e < E; ++e) {
      const int64_t end = s + 1 < plan.world_size
                              ? plan.src_offset[static_cast<size_t>(s + 1) * E + e]
                              : plan.expert_tokens[e];
      if (seen_[e] != end) {
        return Internal("cpu backend: rank " + std::to_string(s) + "'s routing to expert " +
                        std::to_string(e) + " disagrees with the step's count matrix");
      }
    }
  }
  tasks_.clear();
  for (int e = 0; e < E; ++e) {
    const int n = static_cast<int>(work_[e].size());
    if (n > 0 && routed_[ctx.layer][e] == nullptr) {
      return Internal("cpu backend: rank " + std::to_string(me) + " must compute expert " +
                      std::to_string(e) + " but holds no copy of it");
    }
    for (int b = 0; b < n; b += kRowsPerTask)
      tasks_.push_back({e, b, std::min(n, b + kRowsPerTask)});
  }
  if (m.has_shared()) {
    for (int b = 0; b < ctx.num_tokens; b += kRowsPerTask) {
      tasks_.push_back({-1, b, std::min(ctx.num_tokens, b + kRowsPerTask)});
    }
  }
  return Status::Ok();
}

Status CpuBackend::Compute(const StepContext& ctx) {
  const ModelSpec& m = options_.model;
  const int H = m.hidden;
  const int k = m.top_k;
  const size_t combine_row = static_cast<size_t>(k + 1) * H;
  pool_.ParallelFor(static_cast<int64_t>(tasks_.size()), [&](int64_t index, int worker) {
    if (aborted(ctx.generation)) return;
    const Task& task = tasks_[index];
    WorkerScratch& s = scratch_[worker];
    const int rows = task.end - task.begin;
    if (task.expert < 0) {
      const SegmentView self = exchange_->self();
      for (int r = 0; r < rows; ++r) {
        const int t = task.begin + r;
        s.x_rows[r] = self.x() + static_cast<size_t>(t) * H;
        s.scale_rows[r] = self.scales() + static_cast<size_t>(t) * (H / 32);
        s.out_rows[r] = self.combine() + t * combine_row + static_cast<size_t>(k) * H;
      }
      SharedExpertFfn(m, *shared_[ctx.layer], rows, s.x_rows.data(), s.scale_rows.data(),
                      s.out_rows.data(), &s.ffn);
      return;
    }
    const std::vector<Assignment>& list = work_[task.expert];
    for (int r = 0; r < rows; ++r) {
      const Assignment& a = list[task.begin + r];
      const SegmentView src = exchange_->peer(a.src);
      s.x_rows[r] = src.x() + static_cast<size_t>(a.token) * H;
      s.scale_rows[r] = src.scales() + static_cast<size_t>(a.token) * (H / 32);
      s.out_rows[r] = src.combine() + a.token * combine_row + static_cast<size_t>(a.slot) * H;
      s.route_weights[r] = a.weight;
    }
    RoutedExpertFfn(m, *routed_[ctx.layer][task.expert], rows, s.x_rows.data(), s.scale_rows.data(),
                    s.route_weights.data(), s.out_rows.data(), &s.ffn);
  });
  if (aborted(ctx.generation)) {
    return Aborted("step " + std::to_string(ctx.generation) + " aborted during compute");
  }
  return Status::Ok();
}

void CpuBackend::Reduce(const StepContext& ctx, StepOutput* out) {
  const ModelSpec& m = options_.model;
  const int H = m.hidden;
  const int k = m.top_k;
  const int T = ctx.num_tokens;
  const SegmentView self = exchange_->self();
  const size_t combine_row = static_cast<size_t>(k + 1) * H;
  const size_t out_bytes = ctx.output_fp32 ? 4 : 2;
  uint8_t* const output = out->Prepare(static_cast<size_t>(T) * H * out_bytes);
  pool_.ParallelFor(T, [&](int64_t t, int worker) {
    float* acc = scratch_[worker].staging.data();
    std::fill_n(acc, H, 0.0f);
    const uint16_t* partials = self.combine() + t * combine_row;
    // Slot order, then the shared expert: the summation order of DESIGN.md §4 step 5.
    for (int j = 0; j <= k; ++j) {
      if (j < k && self.ids()[t * k + j] < 0) continue;
      if (j == k && !m.has_shared()) continue;
      const uint16_t* p = partials + static_cast<size_t>(j) * H;
      for (int i = 0; i < H; ++i) acc[i] += numerics::BF16ToFloat(p[i]);
    }
    uint8_t* dst = output + t * H * out_bytes;
    if (ctx.output_fp32) {
      std::memcpy(dst, acc, sizeof(float) * H);
    } else {
      for (int i = 0; i < H; ++i) {
        const uint16_t bits = numerics::FloatToBF16(acc[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
    }
  });
}

Status CpuBackend::Step(const StepContext& ctx, StepOutput* out) {
  if (!ctx.device_rows.empty()) {
    return FailedPrecondition(
        "cpu backend: a step's tensors in GPU memory need engine.backend cuda");
  }
  GCMOE_RETURN_IF_ERROR(CheckStep(ctx));
  const auto start = std::chrono::steady_clock::now();
  const WaitLimits limits{options_.exchange_timeout_ms, &abort_generation_};
  StageInputs(ctx);
  exchange_->PublishInputs(ctx.generation, ctx.num_tokens);
  GCMOE_RETURN_IF_ERROR(exchange_->WaitAllInputs(ctx.generation, limits));
  GCMOE_RETURN_IF_ERROR(CollectWork(ctx));
  GCMOE_RETURN_IF_ERROR(Compute(ctx));
  // Every rank arrives at every source, also when it owed that source nothing, so a source
  // always waits for exactly P arrivals.
  for (int s = 0; s < options_.world_size; ++s) exchange_->ArriveCombine(s, ctx.generation);
  GCMOE_RETURN_IF_ERROR(exchange_->WaitCombineAndReset(ctx.generation, limits));
  Reduce(ctx, out);
  int64_t computed = 0;
  for (const auto& w : work_) computed += static_cast<int64_t>(w.size());
  out->assignments_computed = computed;
  out->h2d_ns = 0;
  out->d2h_ns = 0;
  out->device_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  return Status::Ok();
}

}  // namespace

int DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
  }
  return 0;
}

Result<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  GCMOE_RETURN_IF_ERROR(options.model.Validate());
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("cpu backend: rank " + std::to_string(options.rank) +
                           " is outside a world of " + std::to_string(options.world_size));
  }
  if (options.max_tokens_per_rank <= 0) {
    return InvalidArgument("cpu backend: max_tokens_per_rank must be positive");
  }
  const ExchangeShape shape{options.model.hidden, options.model.top_k, options.max_tokens_per_rank,
                            options.world_size};
  GCMOE_ASSIGN_OR_RETURN(auto exchange, ShmExchange::Create(options.instance, options.rank, shape));
  int threads = options.threads;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / options.world_size);
  }
  return std::unique_ptr<Backend>(new CpuBackend(options, std::move(exchange), threads));
}

}  // namespace gcmoe::engine
