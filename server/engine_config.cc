#include "server/engine_config.h"

#include <cstdio>

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
  spec.weights = config.model.weights;
  return spec;
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
  b.device = rank < static_cast<int>(config.parallel.devices.size())
                 ? config.parallel.devices[rank]
                 : 0;
  b.dispatch_sms = config.engine.dispatch_sms;
  return options;
}

Result<BalancerSetup> BalancerFromConfig(const config::Config& config) {
  BalancerSetup setup;
  setup.placement = balancer::ContiguousPlacement(config.parallel.ranks, config.model.experts);
  if (config.balancer.enabled) {
    return Unimplemented("balancer.enabled: the Relief balancer is not built into this binary");
  }
  setup.balancer = balancer::CreateNoReplicationBalancer();
  return setup;
}

std::string DefaultInstanceName(const config::Config& config,
                                const std::string& coordinator_address) {
  // FNV-1a 64 over the digest and the address.
  uint64_t h = 1469598103934665603ull;
  for (char c : config.Digest() + "|" + coordinator_address) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%012llx",
                static_cast<unsigned long long>(h & 0xffffffffffffull));
  return buf;
}

}  // namespace gcmoe::server
