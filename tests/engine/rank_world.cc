#include "tests/engine/rank_world.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "balancer/balancer.h"
#include "balancer/placement.h"
#include "balancer/relief.h"
#include "balancer/topology.h"
#include "engine/nccl_comm.h"
#include "engine/numerics.h"

namespace gcmoe::engine::testing_util {
namespace {

std::string UniqueInstance() {
  static std::atomic<int> counter{0};
  return "test" + std::to_string(getpid()) + "w" + std::to_string(counter++);
}

std::vector<int> Shards(int num_tokens, int world) {
  std::vector<int> sizes(world, num_tokens / world);
  for (int r = 0; r < num_tokens % world; ++r) ++sizes[r];
  return sizes;
}

}  // namespace

GlobalRequest MakeRequest(const ModelSpec& spec, int num_tokens, Routing routing, uint64_t seed) {
  const int H = spec.hidden;
  const int k = spec.top_k;
  const int E = spec.num_experts;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  GlobalRequest r;
  r.num_tokens = num_tokens;
  r.hidden.resize(static_cast<size_t>(num_tokens) * H);
  for (float& v : r.hidden) v = normal(rng);
  r.ids.resize(static_cast<size_t>(num_tokens) * k);
  r.weights.resize(static_cast<size_t>(num_tokens) * k);
  const int hot = static_cast<int>(seed % E);
  std::vector<int> experts(E);
  for (int t = 0; t < num_tokens; ++t) {
    for (int e = 0; e < E; ++e) experts[e] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    if (routing == Routing::kOneHotExpert) {
      std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), hot));
    }
    const bool none_used = routing == Routing::kUnusedSlots && t % 7 == 3;
    for (int j = 0; j < k; ++j) {
      int32_t id = experts[j];
      if (none_used || (routing == Routing::kUnusedSlots && rng() % 5 == 0)) id = -1;
      r.ids[t * k + j] = id;
      r.weights[t * k + j] = uniform(rng);
    }
  }
  return r;
}

void SetDType(GlobalRequest* request, DType dtype) {
  request->dtype = dtype;
  if (dtype == DType::kFP8E4M3) {
    const size_t n = request->hidden.size();
    const int H = static_cast<int>(n / std::max(1, request->num_tokens));
    request->fp8.resize(n);
    request->scales.resize(n / 32);
    for (int t = 0; t < request->num_tokens; ++t) {
      numerics::QuantizeE4M3K32(&request->hidden[static_cast<size_t>(t) * H], H,
                                &request->fp8[static_cast<size_t>(t) * H],
                                &request->scales[static_cast<size_t>(t) * (H / 32)]);
    }
  }
}

Result<std::unique_ptr<RankWorld>> RankWorld::Create(const ModelSpec& spec,
                                                     const WorldOptions& options) {
  std::unique_ptr<RankWorld> world(new RankWorld());
  world->spec_ = spec;
  world->options_ = options;
  const std::string instance = UniqueInstance();
  balancer::Placement placement = balancer::ContiguousPlacement(options.world_size, spec.num_experts);
  if (options.relief) {
    GCMOE_ASSIGN_OR_RETURN(balancer::Topology ring, balancer::MakeRing(options.world_size));
    const std::vector<double> uniform(spec.num_experts, 1.0);
    GCMOE_ASSIGN_OR_RETURN(placement, balancer::FitPlacement(uniform, ring, 1));
  }
  for (int r = 0; r < options.world_size; ++r) {
    EngineOptions e;
    e.backend_kind = options.backend;
    e.backend.device = r;
    e.backend.exchange = options.exchange;
    e.backend.model = spec;
    e.backend.rank = r;
    e.backend.world_size = options.world_size;
    e.backend.max_tokens_per_rank = options.capacity;
    e.backend.threads = options.threads;
    e.backend.exchange_timeout_ms = options.exchange_timeout_ms;
    e.backend.instance = instance;
    std::unique_ptr<balancer::Balancer> balancer = balancer::CreateNoReplicationBalancer();
    if (options.relief) {
      GCMOE_ASSIGN_OR_RETURN(balancer, balancer::CreateReliefBalancer({.passes = 12}));
    }
    GCMOE_ASSIGN_OR_RETURN(auto engine, Engine::Create(e, std::move(balancer), placement));
    world->engines_.push_back(std::move(engine));
  }
  GCMOE_RETURN_IF_ERROR(world->Reconnect());
  return world;
}

Status RankWorld::Reconnect() {
  ++epoch_;
  std::vector<std::string> names;
  for (const auto& e : engines_) names.push_back(e->transport_name());
  engine::PeerSetup setup;
  setup.epoch = epoch_;
  setup.peer_names = names;
  if (engines_[0]->needs_nccl()) {
    GCMOE_ASSIGN_OR_RETURN(setup.nccl_unique_id, NewNcclUniqueId());
  }
  // Concurrently, as the rank processes do: joining an NCCL communicator is collective.
  std::vector<Status> statuses(engines_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < engines_.size(); ++r) {
    threads.emplace_back([&, r] { statuses[r] = engines_[r]->Connect(setup); });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : statuses) GCMOE_RETURN_IF_ERROR(s);
  return Status::Ok();
}

std::vector<Status> RankWorld::Step(const GlobalRequest& request, const std::vector<int>& ranks,
                                    std::vector<std::vector<uint8_t>>* outputs) {
  const int P = options_.world_size;
  const int H = spec_.hidden;
  const int k = spec_.top_k;
  const int E = spec_.num_experts;
  const std::vector<int> shards = Shards(request.num_tokens, P);
  std::vector<int64_t> counts(static_cast<size_t>(P) * E, 0);
  std::vector<int> first(P, 0);
  for (int s = 0, begin = 0; s < P; begin += shards[s], ++s) {
    first[s] = begin;
    for (int t = begin; t < begin + shards[s]; ++t) {
      for (int j = 0; j < k; ++j) {
        const int32_t e = request.ids[t * k + j];
        if (e >= 0) ++counts[static_cast<size_t>(s) * E + e];
      }
    }
  }
  // BF16 shards are converted here so every rank count sees the same bits.
  std::vector<uint16_t> bf16;
  if (request.dtype == DType::kBF16) {
    bf16.resize(request.hidden.size());
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = numerics::FloatToBF16(request.hidden[i]);
  }
  const uint64_t generation = ++generation_;
  std::vector<Status> statuses(ranks.size());
  outputs->assign(P, {});
  stats_.resize(P);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      const int r = ranks[i];
      StepRequest step;
      step.generation = generation;
      step.layer = request.layer;
      step.tokens_per_rank = shards;
      step.counts = counts;
      step.hidden.dtype = request.dtype;
      const size_t row0 = static_cast<size_t>(first[r]);
      switch (request.dtype) {
        case DType::kFP32: step.hidden.data = request.hidden.data() + row0 * H; break;
        case DType::kBF16: step.hidden.data = bf16.data() + row0 * H; break;
        case DType::kFP8E4M3:
          step.hidden.data = request.fp8.data() + row0 * H;
          step.hidden.scales = request.scales.data() + row0 * (H / 32);
          break;
        case DType::kFP16: break;
      }
      step.topk_ids = request.ids.data() + row0 * k;
      step.topk_weights = request.weights.data() + row0 * k;
      step.output_fp32 = request.output_fp32;
      StepOutput out;
      StepStats& stats = stats_[r];
      statuses[i] = engines_[r]->Step(step, &out, &stats);
      (*outputs)[r] = std::move(out.output);
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

Result<std::vector<uint8_t>> RankWorld::Forward(const GlobalRequest& request) {
  std::vector<int> all(options_.world_size);
  for (int r = 0; r < options_.world_size; ++r) all[r] = r;
  std::vector<std::vector<uint8_t>> outputs;
  const std::vector<Status> statuses = Step(request, all, &outputs);
  for (const Status& s : statuses) GCMOE_RETURN_IF_ERROR(s);
  std::vector<uint8_t> joined;
  for (const auto& o : outputs) joined.insert(joined.end(), o.begin(), o.end());
  return joined;
}

std::vector<Status> RankWorld::StepSome(const GlobalRequest& request,
                                        const std::vector<int>& ranks) {
  std::vector<std::vector<uint8_t>> outputs;
  return Step(request, ranks, &outputs);
}

}  // namespace gcmoe::engine::testing_util
