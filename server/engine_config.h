// Maps the JSON config onto the engine's and balancer's own option types (the engine never
// sees config/), and names a service's exchange segments.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "balancer/balancer.h"
#include "common/status.h"
#include "config/config.h"
#include "engine/engine.h"

namespace gcmoe::server {

// Relief's pass count when the config says "auto" and calibration has not finished (the
// paper's I = 12).
inline constexpr int kDefaultReliefPasses = 12;

engine::ModelSpec ModelSpecFromConfig(const config::Config& config);

// The GPU of `rank`: parallel.devices[rank] when listed, else device `rank` (one GPU per rank).
int DeviceOfRank(const config::Config& config, int rank);

engine::EngineOptions EngineOptionsFromConfig(const config::Config& config, int rank,
                                              const std::string& instance);

// The balancer the config asks for, with the placement every rank starts from (the coordinator
// sends the placement it owns at every epoch, so a rank's own starting point only decides which
// weights it loads before it attaches).
struct BalancerSetup {
  std::unique_ptr<balancer::Balancer> balancer;
  balancer::Placement placement;
};
Result<BalancerSetup> BalancerFromConfig(const config::Config& config);

// The placement a service starts from: contiguous with the balancer off; with it on, Relief's
// packing and replication (balancer.topology, replicas_per_rank) fitted to uniform loads or to
// the mean loads of balancer.placement_file (one placement for every layer: the file's
// [layers][experts] rows are summed).
Result<balancer::Placement> InitialPlacement(const config::Config& config);

// Relief's placement fitted to observed mean loads (for balancer.placement "observed").
Result<balancer::Placement> FitObservedPlacement(const config::Config& config,
                                                 std::span<const double> mean_load);

}  // namespace gcmoe::server
