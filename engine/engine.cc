#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "engine/weights.h"

namespace gcmoe::engine {

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                               std::unique_ptr<balancer::Balancer> balancer,
                                               const balancer::Placement& placement) {
  const ModelSpec& model = options.backend.model;
  GCMOE_RETURN_IF_ERROR(model.Validate());
  if (placement.num_ranks != options.backend.world_size ||
      placement.num_experts != model.num_experts) {
    return InvalidArgument(
        "engine: placement is for " + std::to_string(placement.num_ranks) + " ranks and " +
        std::to_string(placement.num_experts) + " experts; the service has " +
        std::to_string(options.backend.world_size) + " and " + std::to_string(model.num_experts));
  }
  std::unique_ptr<Engine> engine(new Engine());
  engine->options_ = options;
  engine->balancer_ = std::move(balancer);
  GCMOE_RETURN_IF_ERROR(engine->balancer_->SetPlacement(placement));
  engine->held_experts_ = placement.ExpertsOnRank(options.backend.rank);

  if (options.backend_kind == "cpu") {
    GCMOE_ASSIGN_OR_RETURN(engine->backend_, CreateCpuBackend(options.backend));
  } else if (options.backend_kind == "cuda") {
    GCMOE_ASSIGN_OR_RETURN(engine->backend_, CreateCudaBackend(options.backend));
  } else {
    return InvalidArgument("engine: unknown backend \"" + options.backend_kind +
                           "\", expected cpu or cuda");
  }
  engine->backend_name_ = engine->backend_->name();

  GCMOE_ASSIGN_OR_RETURN(engine->weights_, WeightSource::Open(model));
  GCMOE_RETURN_IF_ERROR(engine->LoadHeldExperts());
  return engine;
}

Status Engine::LoadHeldExperts() {
  const ModelSpec& model = options_.backend.model;
  std::vector<int> layers(model.num_layers);
  for (int l = 0; l < model.num_layers; ++l) layers[l] = l;
  spdlog::info("rank {}: loading {} layer(s) x {} expert(s) from {}", options_.backend.rank,
               model.num_layers, held_experts_.size(), weights_->Describe());
  const auto start = std::chrono::steady_clock::now();
  GCMOE_RETURN_IF_ERROR(weights_->CheckExperts(layers, held_experts_));
  GCMOE_RETURN_IF_ERROR(backend_->LoadExperts(*weights_, held_experts_));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("rank {}: weights loaded in {:.2f} s ({} backend)", options_.backend.rank, seconds,
               backend_name_);
  return Status::Ok();
}

Status Engine::SetPlacement(const balancer::Placement& placement) {
  const balancer::Placement& current = balancer_->placement();
  if (placement.home == current.home && placement.host == current.host) return Status::Ok();
  if (placement.num_ranks != options_.backend.world_size ||
      placement.num_experts != options_.backend.model.num_experts) {
    return InvalidArgument("engine: placement is for " + std::to_string(placement.num_ranks) +
                           " ranks and " + std::to_string(placement.num_experts) +
                           " experts, not this service's");
  }
  GCMOE_RETURN_IF_ERROR(balancer_->SetPlacement(placement));
  const std::vector<int> held = placement.ExpertsOnRank(options_.backend.rank);
  if (held != held_experts_) {
    held_experts_ = held;
    GCMOE_RETURN_IF_ERROR(LoadHeldExperts());
  }
  return Status::Ok();
}

Status Engine::Connect(const PeerSetup& setup) { return backend_->ConnectPeers(setup); }

Status Engine::Step(const StepRequest& request, StepOutput* output, StepStats* stats) {
  GCMOE_RETURN_IF_ERROR(Launch(request, output, stats));
  return Finish(request.generation, output, stats);
}

Status Engine::Launch(const StepRequest& request, StepOutput* output, StepStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  const int world = options_.backend.world_size;
  const int experts = options_.backend.model.num_experts;
  const int me = options_.backend.rank;
  if (static_cast<int>(request.tokens_per_rank.size()) != world ||
      request.counts.size() != static_cast<size_t>(world) * experts) {
    return InvalidArgument("engine: step " + std::to_string(request.generation) +
                           " carries shard sizes or counts for another world size");
  }
  StepContext ctx;
  ctx.generation = request.generation;
  ctx.layer = request.layer;
  ctx.num_tokens = request.tokens_per_rank[me];
  ctx.hidden = request.hidden;
  ctx.topk_ids = request.topk_ids;
  ctx.topk_weights = request.topk_weights;
  ctx.output_fp32 = request.output_fp32;
  ctx.device_rows = request.device_rows;
  // The activations' upload needs no plan: it runs while the balancer and the plan are made.
  backend_->PrefetchInputs(ctx);
  expert_totals_.assign(experts, 0);
  for (int s = 0; s < world; ++s) {
    for (int e = 0; e < experts; ++e) {
      expert_totals_[e] += request.counts[static_cast<size_t>(s) * experts + e];
    }
  }
  if (request.relief_passes > 0) {
    GCMOE_RETURN_IF_ERROR(balancer_->SetPasses(request.relief_passes));
  }
  GCMOE_RETURN_IF_ERROR(balancer_->Solve(expert_totals_, &split_));
  GCMOE_RETURN_IF_ERROR(BuildStepPlan(request.tokens_per_rank, request.counts, experts,
                                      balancer_->placement(), split_, &plan_));
  const size_t output_bytes = static_cast<size_t>(request.tokens_per_rank[me]) *
                              options_.backend.model.hidden * (request.output_fp32 ? 4 : 2);
  if (!output->destination.empty() && output->destination.size() < output_bytes) {
    return InvalidArgument("engine: step " + std::to_string(request.generation) + " needs " +
                           std::to_string(output_bytes) + " output bytes, its destination holds " +
                           std::to_string(output->destination.size()));
  }
  ctx.plan = &plan_;
  GCMOE_RETURN_IF_ERROR(backend_->Launch(ctx, output));
  launched_.emplace_back(request.generation, start);
  stats->load_before = split_.load_before;
  stats->load_after = plan_.load;
  stats->passes = split_.passes;
  stats->solve_ns = split_.solve_ns;
  return Status::Ok();
}

Status Engine::Finish(uint64_t generation, StepOutput* output, StepStats* stats) {
  if (launched_.empty() || launched_.front().first != generation) {
    return FailedPrecondition("engine: step " + std::to_string(generation) +
                              " is not the oldest step launched");
  }
  // Time spent behind the step before is that step's, not this one's.
  const auto start = std::max(launched_.front().second, finished_);
  launched_.pop_front();
  const Status status = backend_->Finish(generation, output);
  finished_ = std::chrono::steady_clock::now();
  GCMOE_RETURN_IF_ERROR(status);
  stats->assignments_computed = output->assignments_computed;
  stats->engine_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(finished_ - start).count();
  stats->h2d_ns = output->h2d_ns;
  stats->device_ns = output->device_ns;
  stats->d2h_ns = output->d2h_ns;
  stats->host_ns =
      std::max<int64_t>(0, stats->engine_ns - stats->h2d_ns - stats->device_ns - stats->d2h_ns);
  return Status::Ok();
}

}  // namespace gcmoe::engine
