#include "server/engine_config.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "balancer/placement.h"
#include "balancer/relief.h"
#include "balancer/topology.h"

namespace gcmoe::server {

engine::ModelSpec ModelSpecFromConfig(const config::Config& config) {
  engine::ModelSpec spec;
  spec.hidden = config.model.hidden;
  spec.intermediate = config.model.intermediate;
  spec.num_experts = config.model.experts;
  spec.top_k = config.model.top_k;
  spec.num_layers = config.model.layers;
  spec.shared_intermediate = config.model.shared_intermediate;
  spec.activation_alpha = config.model.activation_alpha;
  spec.activation_clamp = config.model.activation_clamp;
  spec.activation_up_offset = config.model.activation_up_offset;
  spec.moe_layer_ids = config.model.moe_layer_ids;
  spec.weights = config.model.weights;
  return spec;
}

int DeviceOfRank(const config::Config& config, int rank) {
  return rank < static_cast<int>(config.parallel.devices.size()) ? config.parallel.devices[rank]
                                                                 : rank;
}

engine::EngineOptions EngineOptionsFromConfig(const config::Config& config, int rank,
                                              const std::string& instance) {
  engine::EngineOptions options;
  options.backend_kind = config.engine.backend;
  engine::BackendOptions& b = options.backend;
  b.model = ModelSpecFromConfig(config);
  b.rank = rank;
  b.world_size = config.parallel.ranks;
  b.max_tokens_per_rank = config.engine.max_tokens_per_rank;
  b.threads = config.engine.threads;
  b.exchange_timeout_ms = config.engine.exchange_timeout_ms;
  b.instance = instance;
  b.device = DeviceOfRank(config, rank);
  b.dispatch_sms = config.engine.dispatch_sms;
  b.exchange = config.engine.exchange;
  const config::CudaEngineConfig& cuda = config.engine.cuda;
  b.cuda.ring_blocks = cuda.ring_blocks;
  b.cuda.role1_grid = cuda.role1_grid;
  b.cuda.overlap_roles = cuda.overlap_roles;
  b.cuda.wait_timeout_ms = cuda.wait_timeout_ms;
  b.cuda.wait_sleep_cap_ns = cuda.wait_sleep_cap_ns;
  b.cuda.trace_role2 = cuda.trace_role2;
  return options;
}

namespace {

// balancer.placement_file: JSON mean loads, [experts] or [layers][experts].
Result<std::vector<double>> ReadMeanLoads(const std::string& path, int experts) {
  std::ifstream in(path);
  if (!in) return NotFound("balancer.placement_file: cannot open \"" + path + "\"");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("balancer.placement_file: " + path + " is not JSON: " + e.what());
  }
  std::vector<double> mean(experts, 0.0);
  auto add_row = [&](const nlohmann::json& row, const std::string& where) -> Status {
    if (!row.is_array() || static_cast<int>(row.size()) != experts) {
      return InvalidArgument("balancer.placement_file: " + where + " must be an array of " +
                             std::to_string(experts) + " mean loads (model.experts)");
    }
    for (int e = 0; e < experts; ++e) {
      if (!row[e].is_number() || row[e].get<double>() < 0) {
        return InvalidArgument("balancer.placement_file: " + where + "[" + std::to_string(e) +
                               "] must be a non-negative number");
      }
      mean[e] += row[e].get<double>();
    }
    return Status::Ok();
  };
  if (j.is_array() && !j.empty() && j[0].is_array()) {
    for (size_t l = 0; l < j.size(); ++l) {
      GCMOE_RETURN_IF_ERROR(add_row(j[l], "row " + std::to_string(l)));
    }
  } else {
    GCMOE_RETURN_IF_ERROR(add_row(j, "the array"));
  }
  return mean;
}

}  // namespace

Result<balancer::Placement> FitObservedPlacement(const config::Config& config,
                                                 std::span<const double> mean_load) {
  GCMOE_ASSIGN_OR_RETURN(balancer::Topology topology,
                         balancer::ParseTopology(config.balancer.topology, config.parallel.ranks));
  return balancer::FitPlacement(mean_load, topology, config.balancer.replicas_per_rank);
}

Result<balancer::Placement> InitialPlacement(const config::Config& config) {
  if (!config.balancer.enabled) {
    return balancer::ContiguousPlacement(config.parallel.ranks, config.model.experts);
  }
  std::vector<double> mean(config.model.experts, 1.0);
  if (config.balancer.placement == "file") {
    GCMOE_ASSIGN_OR_RETURN(mean,
                           ReadMeanLoads(config.balancer.placement_file, config.model.experts));
  }
  return FitObservedPlacement(config, mean);
}

Result<BalancerSetup> BalancerFromConfig(const config::Config& config) {
  BalancerSetup setup;
  GCMOE_ASSIGN_OR_RETURN(setup.placement, InitialPlacement(config));
  if (!config.balancer.enabled) {
    setup.balancer = balancer::CreateNoReplicationBalancer();
    return setup;
  }
  balancer::ReliefOptions options;
  options.fraction_bits = config.balancer.fractional_bits;
  // "auto": the coordinator calibrates I* and sends it with every step; until then it sends
  // its own choice too, so this is only the fallback for a step that names none.
  options.passes = config.balancer.passes.value_or(kDefaultReliefPasses);
  options.auto_passes = false;
  GCMOE_ASSIGN_OR_RETURN(setup.balancer, balancer::CreateReliefBalancer(options));
  return setup;
}

}  // namespace gcmoe::server
