#include "balancer/transfer_list.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>

namespace gcmoe::balancer {
namespace {

// First-fit: each edge, in `order`, takes the smallest colour unused at both of its ranks.
// Returns the colour of every edge; the number of colours is max + 1.
std::vector<int> GreedyColour(const std::vector<Transfer>& edges, const std::vector<int>& order,
                              int num_ranks) {
  std::vector<std::vector<char>> used(num_ranks);
  std::vector<int> colour(edges.size(), -1);
  for (int i : order) {
    const Transfer& t = edges[i];
    auto& a = used[t.home];
    auto& b = used[t.host];
    int c = 0;
    while ((c < static_cast<int>(a.size()) && a[c]) || (c < static_cast<int>(b.size()) && b[c])) {
      ++c;
    }
    if (static_cast<int>(a.size()) <= c) a.resize(c + 1, 0);
    if (static_cast<int>(b.size()) <= c) b.resize(c + 1, 0);
    a[c] = b[c] = 1;
    colour[i] = c;
  }
  return colour;
}

// Group id per edge: direction classes merged greedily (largest class first) into groups in
// which no rank has more than two edges.
std::vector<int> DimensionGroups(const std::vector<Transfer>& edges, int num_ranks) {
  std::map<int, std::vector<int>> by_direction;
  for (size_t i = 0; i < edges.size(); ++i) {
    by_direction[(edges[i].host - edges[i].home + num_ranks) % num_ranks].push_back(
        static_cast<int>(i));
  }
  std::vector<std::vector<int>> classes;
  for (auto& [direction, members] : by_direction) classes.push_back(std::move(members));
  std::stable_sort(classes.begin(), classes.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::vector<int> group(edges.size(), -1);
  std::vector<std::vector<int>> group_degree;  // [groups][ranks]
  for (const std::vector<int>& members : classes) {
    std::vector<int> degree(num_ranks, 0);
    for (int i : members) {
      ++degree[edges[i].home];
      ++degree[edges[i].host];
    }
    int chosen = -1;
    for (size_t gi = 0; gi < group_degree.size() && chosen < 0; ++gi) {
      bool fits = true;
      for (int r = 0; r < num_ranks && fits; ++r) fits = group_degree[gi][r] + degree[r] <= 2;
      if (fits) chosen = static_cast<int>(gi);
    }
    if (chosen < 0) {
      chosen = static_cast<int>(group_degree.size());
      group_degree.emplace_back(num_ranks, 0);
    }
    for (int r = 0; r < num_ranks; ++r) group_degree[chosen][r] += degree[r];
    for (int i : members) group[i] = chosen;
  }
  return group;
}

}  // namespace

Result<TransferList> CompileTransferList(const Placement& placement) {
  GCMOE_RETURN_IF_ERROR(placement.Validate());
  const int g = placement.num_ranks;
  std::vector<Transfer> edges;
  std::vector<int> degree(g, 0);
  for (int e = 0; e < placement.num_experts; ++e) {
    if (!placement.replicated(e)) continue;
    edges.push_back({e, placement.home[e], placement.host[e]});
    ++degree[placement.home[e]];
    ++degree[placement.host[e]];
  }
  TransferList list;
  list.num_ranks = g;
  list.max_degree = edges.empty() ? 0 : *std::max_element(degree.begin(), degree.end());

  // Greedy colouring quality depends on the edge order. The first order reaches 2D on the
  // topology placements: edges are grouped into "dimensions" (direction classes
  // (host - home) mod G, merged while every rank keeps at most two edges of the group, so a
  // torus row's wrap-around joins its row), and within a group follow home rank, which walks
  // each ring of the group in order, so first-fit alternates two colours along it. Rounds then
  // stay inside one dimension, which also keeps each round's rank pairs regular for the SIMD
  // kernels. The other orders are cheap insurance for placements from elsewhere.
  const std::vector<int> group = DimensionGroups(edges, g);
  using Less = std::function<bool(int, int)>;
  const Less orders[] = {
      [&](int a, int b) {
        return std::tuple(group[a], edges[a].home, edges[a].expert) <
               std::tuple(group[b], edges[b].home, edges[b].expert);
      },
      [&](int a, int b) {
        return std::tuple(edges[a].home, edges[a].expert) <
               std::tuple(edges[b].home, edges[b].expert);
      },
      [&](int a, int b) {
        const Transfer& x = edges[a];
        const Transfer& y = edges[b];
        return std::tuple(std::min(x.home, x.host), std::max(x.home, x.host), x.expert) <
               std::tuple(std::min(y.home, y.host), std::max(y.home, y.host), y.expert);
      },
  };
  std::vector<int> best_colour;
  int best_count = -1;
  for (const Less& less : orders) {
    std::vector<int> order(edges.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), less);
    std::vector<int> colour = GreedyColour(edges, order, g);
    const int count = colour.empty() ? 0 : *std::max_element(colour.begin(), colour.end()) + 1;
    if (best_count < 0 || count < best_count) {
      best_count = count;
      best_colour = std::move(colour);
    }
    if (best_count == list.max_degree) break;
  }

  std::vector<int> index(edges.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int>(i);
  std::stable_sort(index.begin(), index.end(), [&](int a, int b) {
    return std::tuple(best_colour[a], edges[a].home, edges[a].expert) <
           std::tuple(best_colour[b], edges[b].home, edges[b].expert);
  });
  list.round_begin.push_back(0);
  for (size_t i = 0; i < index.size(); ++i) {
    list.transfers.push_back(edges[index[i]]);
    const bool last = i + 1 == index.size() || best_colour[index[i + 1]] != best_colour[index[i]];
    if (last) list.round_begin.push_back(static_cast<int>(i + 1));
  }
  return list;
}

}  // namespace gcmoe::balancer
