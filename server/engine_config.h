// Maps the JSON config onto the engine's and balancer's own option types (the engine never
// sees config/), and names a service's exchange segments.
#pragma once

#include <memory>
#include <string>

#include "balancer/balancer.h"
#include "common/status.h"
#include "config/config.h"
#include "engine/engine.h"

namespace gcmoe::server {

engine::ModelSpec ModelSpecFromConfig(const config::Config& config);

engine::EngineOptions EngineOptionsFromConfig(const config::Config& config, int rank,
                                              const std::string& instance);

// The balancer the config asks for, with the placement every rank starts from.
struct BalancerSetup {
  std::unique_ptr<balancer::Balancer> balancer;
  balancer::Placement placement;
};
Result<BalancerSetup> BalancerFromConfig(const config::Config& config);

// Short name shared by every rank of one service on one host: its exchange segments are
// "/gcmoe-<instance>-r<rank>". Derived from the config digest and the coordinator's address,
// so two services on one host never collide.
std::string DefaultInstanceName(const config::Config& config,
                                const std::string& coordinator_address);

}  // namespace gcmoe::server
