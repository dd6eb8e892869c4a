// An EPLB-compatible placement: the semantics of DeepSeek EPLB's
// rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus), re-implemented, for
// static comparisons with Relief (DESIGN.md §5). Unlike a Relief placement, an expert may have
// any number of replicas, so the result has EPLB's own shape rather than balancer::Placement.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace gcmoe::balancer {

struct EplbPlacement {
  int num_layers = 0;
  int num_logical = 0;   // experts
  int num_replicas = 0;  // physical expert slots; slot p lives on GPU p / (num_replicas / num_gpus)
  int num_gpus = 0;
  int max_replicas = 0;  // max over layers and experts of logcnt: log2phy's last dimension
  std::vector<int> phy2log;  // [layers][num_replicas] logical expert held by each physical slot
  std::vector<int> log2phy;  // [layers][num_logical][max_replicas] slots per expert, by replica
                             // rank; -1 past the expert's count
  std::vector<int> logcnt;   // [layers][num_logical] replicas per logical expert, >= 1

  int phy2log_at(int layer, int phy) const { return phy2log[layer * num_replicas + phy]; }
  int log2phy_at(int layer, int expert, int replica) const {
    return log2phy[(layer * num_logical + expert) * max_replicas + replica];
  }
  int logcnt_at(int layer, int expert) const { return logcnt[layer * num_logical + expert]; }
};

// weight: [num_layers][num_logical] load statistics, finite and >= 0. Arithmetic is float32 as
// in EPLB (weight.float()); sorts are stable (equal weights keep index order), and packing and
// replication pick the first candidate on ties, which is what EPLB's min()/max() do.
// Policy as in EPLB: hierarchical when num_groups % num_nodes == 0 (groups packed onto nodes,
// experts replicated within each node, replicas packed onto the node's GPUs), otherwise global
// (the same with one group and one node).
// Requirements (EPLB's asserts, returned as INVALID_ARGUMENT): num_replicas >= num_logical,
// num_replicas % num_gpus == 0, num_gpus % num_nodes == 0, and for the hierarchical policy
// num_logical % num_groups == 0.
Result<EplbPlacement> RebalanceExperts(std::span<const double> weight, int num_layers,
                                       int num_replicas, int num_groups, int num_nodes,
                                       int num_gpus);

// Per-GPU assignments of one layer on one step under EPLB's static split: the replicas of an
// expert share its n tokens evenly, floor(n / c) each, and the first n mod c replicas in
// replica-rank order take one more. gpu_loads: [num_gpus].
Status EplbStepLoads(const EplbPlacement& placement, int layer,
                     std::span<const int64_t> expert_tokens, std::span<int64_t> gpu_loads);

}  // namespace gcmoe::balancer
