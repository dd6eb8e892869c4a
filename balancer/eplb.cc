// EPLB's algorithm, written from its published description and source semantics:
//   balanced packing: items heaviest first, each to the lightest pack that still has room;
//   replication: each extra slot goes to the expert with the largest weight per replica;
//   hierarchical: pack expert groups onto nodes, replicate within a node, pack onto its GPUs.
// Weights are float32 and accumulate in float32, as EPLB's torch code does, so near-ties
// resolve the same way.
#include "balancer/eplb.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace gcmoe::balancer {
namespace {

// items: [n] weights; n % num_packs == 0. pack[i], slot[i]: where item i went.
void BalancedPacking(std::span<const float> items, int num_packs, std::span<int> pack,
                     std::span<int> slot) {
  const int n = static_cast<int>(items.size());
  const int per_pack = n / num_packs;
  if (per_pack == 1) {  // EPLB keeps the identity here, without sorting
    for (int i = 0; i < n; ++i) {
      pack[i] = i;
      slot[i] = 0;
    }
    return;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return items[a] > items[b]; });
  std::vector<float> pack_weight(num_packs, 0.0f);
  std::vector<int> pack_items(num_packs, 0);
  for (int i : order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_items[p] < per_pack && (best < 0 || pack_weight[p] < pack_weight[best])) best = p;
    }
    pack[i] = best;
    slot[i] = pack_items[best]++;
    pack_weight[best] += items[i];
  }
}

// weight: [num_log]. phy2log: [num_phy], the first num_log slots hold experts 0..num_log-1.
void ReplicateExperts(std::span<const float> weight, int num_phy, std::span<int> phy2log,
                      std::span<int> replica_rank, std::span<int> count) {
  const int num_log = static_cast<int>(weight.size());
  for (int i = 0; i < num_log; ++i) {
    phy2log[i] = i;
    replica_rank[i] = 0;
    count[i] = 1;
  }
  for (int i = num_log; i < num_phy; ++i) {
    int best = 0;
    float best_value = weight[0] / static_cast<float>(count[0]);
    for (int e = 1; e < num_log; ++e) {
      const float value = weight[e] / static_cast<float>(count[e]);
      if (value > best_value) {
        best_value = value;
        best = e;
      }
    }
    phy2log[i] = best;
    replica_rank[i] = count[best]++;
  }
}

std::vector<int> Inverse(std::span<const int> perm) {
  std::vector<int> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int>(i);
  return inv;
}

// One layer of EPLB's hierarchical policy. Outputs: phy2log, replica rank per physical slot
// ([num_phy]) and count per logical expert ([num_log]).
void HierarchicalLayer(std::span<const float> weight, int num_phy, int num_groups, int num_nodes,
                       int num_gpus, std::span<int> phy2log, std::span<int> phy_rank,
                       std::span<int> logcnt) {
  const int num_log = static_cast<int>(weight.size());
  const int group_size = num_log / num_groups;
  const int groups_per_node = num_groups / num_nodes;
  const int log_per_node = num_log / num_nodes;
  const int phy_per_node = num_phy / num_nodes;
  const int phy_per_gpu = num_phy / num_gpus;

  // Step 1: groups onto nodes. "mlog" numbers experts node by node.
  std::vector<float> group_weight(num_groups, 0.0f);
  for (int g = 0; g < num_groups; ++g) {
    for (int k = 0; k < group_size; ++k) group_weight[g] += weight[g * group_size + k];
  }
  std::vector<int> group_pack(num_groups), group_slot(num_groups);
  BalancedPacking(group_weight, num_nodes, group_pack, group_slot);
  std::vector<int> log2mlog(num_log);
  for (int g = 0; g < num_groups; ++g) {
    for (int k = 0; k < group_size; ++k) {
      log2mlog[g * group_size + k] =
          (group_pack[g] * groups_per_node + group_slot[g]) * group_size + k;
    }
  }
  const std::vector<int> mlog2log = Inverse(log2mlog);

  std::vector<int> mlogcnt(num_log);
  for (int n = 0; n < num_nodes; ++n) {
    // Step 2: replicas within the node.
    std::vector<float> node_weight(log_per_node);
    for (int j = 0; j < log_per_node; ++j) node_weight[j] = weight[mlog2log[n * log_per_node + j]];
    std::vector<int> phy2mlog(phy_per_node), rank(phy_per_node);
    std::span<int> count(mlogcnt.data() + n * log_per_node, log_per_node);
    ReplicateExperts(node_weight, phy_per_node, phy2mlog, rank, count);

    // Step 3: the node's replicas onto its GPUs, each weighing its expert's share.
    std::vector<float> phy_weight(phy_per_node);
    for (int i = 0; i < phy_per_node; ++i) {
      phy_weight[i] = node_weight[phy2mlog[i]] / static_cast<float>(count[phy2mlog[i]]);
    }
    std::vector<int> pack(phy_per_node), slot(phy_per_node);
    BalancedPacking(phy_weight, num_gpus / num_nodes, pack, slot);
    std::vector<int> phy2pphy(phy_per_node);
    for (int i = 0; i < phy_per_node; ++i) phy2pphy[i] = pack[i] * phy_per_gpu + slot[i];
    const std::vector<int> pphy2phy = Inverse(phy2pphy);
    for (int q = 0; q < phy_per_node; ++q) {
      const int phy = pphy2phy[q];
      phy2log[n * phy_per_node + q] = mlog2log[phy2mlog[phy] + n * log_per_node];
      phy_rank[n * phy_per_node + q] = rank[phy];
    }
  }
  for (int e = 0; e < num_log; ++e) logcnt[e] = mlogcnt[log2mlog[e]];
}

}  // namespace

Result<EplbPlacement> RebalanceExperts(std::span<const double> weight, int num_layers,
                                       int num_replicas, int num_groups, int num_nodes,
                                       int num_gpus) {
  if (num_layers <= 0) return InvalidArgument("eplb: num_layers must be >= 1");
  if (weight.empty() || weight.size() % num_layers != 0) {
    return InvalidArgument("eplb: weight has " + std::to_string(weight.size()) +
                           " entries, expected num_layers x num_experts with num_experts >= 1");
  }
  const int num_log = static_cast<int>(weight.size() / num_layers);
  for (size_t i = 0; i < weight.size(); ++i) {
    if (!std::isfinite(weight[i]) || weight[i] < 0) {
      return InvalidArgument("eplb: weight[" + std::to_string(i / num_log) + "][" +
                             std::to_string(i % num_log) + "] must be finite and >= 0");
    }
  }
  if (num_gpus <= 0 || num_nodes <= 0 || num_groups <= 0) {
    return InvalidArgument("eplb: num_gpus, num_nodes and num_groups must be >= 1");
  }
  if (num_replicas < num_log) {
    return InvalidArgument("eplb: num_replicas is " + std::to_string(num_replicas) +
                           ", expected >= the " + std::to_string(num_log) + " logical experts");
  }
  if (num_replicas % num_gpus != 0) {
    return InvalidArgument("eplb: num_replicas (" + std::to_string(num_replicas) +
                           ") must be a multiple of num_gpus (" + std::to_string(num_gpus) + ")");
  }
  if (num_gpus % num_nodes != 0) {
    return InvalidArgument("eplb: num_gpus (" + std::to_string(num_gpus) +
                           ") must be a multiple of num_nodes (" + std::to_string(num_nodes) + ")");
  }
  const bool hierarchical = num_groups % num_nodes == 0;
  if (hierarchical && num_log % num_groups != 0) {
    return InvalidArgument("eplb: " + std::to_string(num_log) +
                           " experts do not divide into num_groups (" +
                           std::to_string(num_groups) + ")");
  }
  const int groups = hierarchical ? num_groups : 1;
  const int nodes = hierarchical ? num_nodes : 1;

  EplbPlacement out;
  out.num_layers = num_layers;
  out.num_logical = num_log;
  out.num_replicas = num_replicas;
  out.num_gpus = num_gpus;
  out.phy2log.resize(static_cast<size_t>(num_layers) * num_replicas);
  out.logcnt.resize(static_cast<size_t>(num_layers) * num_log);
  std::vector<int> phy_rank(out.phy2log.size());
  std::vector<float> layer_weight(num_log);
  for (int l = 0; l < num_layers; ++l) {
    for (int e = 0; e < num_log; ++e) {
      layer_weight[e] = static_cast<float>(weight[static_cast<size_t>(l) * num_log + e]);
    }
    HierarchicalLayer(layer_weight, num_replicas, groups, nodes, num_gpus,
                      std::span<int>(out.phy2log).subspan(l * num_replicas, num_replicas),
                      std::span<int>(phy_rank).subspan(l * num_replicas, num_replicas),
                      std::span<int>(out.logcnt).subspan(l * num_log, num_log));
  }
  out.max_replicas = *std::max_element(out.logcnt.begin(), out.logcnt.end());
  out.log2phy.assign(static_cast<size_t>(num_layers) * num_log * out.max_replicas, -1);
  for (int l = 0; l < num_layers; ++l) {
    for (int p = 0; p < num_replicas; ++p) {
      const int e = out.phy2log[l * num_replicas + p];
      out.log2phy[(static_cast<size_t>(l) * num_log + e) * out.max_replicas +
                  phy_rank[l * num_replicas + p]] = p;
    }
  }
  return out;
}

Status EplbStepLoads(const EplbPlacement& placement, int layer,
                     std::span<const int64_t> expert_tokens, std::span<int64_t> gpu_loads) {
  if (layer < 0 || layer >= placement.num_layers) {
    return InvalidArgument("eplb: layer " + std::to_string(layer) + " out of range");
  }
  if (static_cast<int>(expert_tokens.size()) != placement.num_logical ||
      static_cast<int>(gpu_loads.size()) != placement.num_gpus) {
    return InvalidArgument("eplb: expected " + std::to_string(placement.num_logical) +
                           " expert counts and " + std::to_string(placement.num_gpus) +
                           " GPU loads");
  }
  const int per_gpu = placement.num_replicas / placement.num_gpus;
  std::fill(gpu_loads.begin(), gpu_loads.end(), 0);
  for (int e = 0; e < placement.num_logical; ++e) {
    const int64_t n = expert_tokens[e];
    if (n < 0) return InvalidArgument("eplb: expert_tokens[" + std::to_string(e) + "] < 0");
    const int c = placement.logcnt_at(layer, e);
    for (int r = 0; r < c; ++r) {
      const int64_t share = n / c + (r < n % c ? 1 : 0);
      gpu_loads[placement.log2phy_at(layer, e, r) / per_gpu] += share;
    }
  }
  return Status::Ok();
}

}  // namespace gcmoe::balancer
