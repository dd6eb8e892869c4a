#include "engine/gpu_step_tables.h"

#include <algorithm>

namespace gcmoe::engine {
namespace {

// Source q's assignments of expert e computed by its home copy and by its host copy.
void Shares(const StepPlan& plan, int q, int e, int64_t* home, int64_t* host) {
  const int E = plan.num_experts;
  const int64_t begin = plan.src_offset[static_cast<size_t>(q) * E + e];
  const int64_t end = q + 1 < plan.world_size ? plan.src_offset[static_cast<size_t>(q + 1) * E + e]
                                              : plan.expert_tokens[e];
  *home = std::clamp<int64_t>(plan.home_tokens[e] - begin, 0, end - begin);
  *host = (end - begin) - *home;
}

}  // namespace

bool GpuStepTables::merged_tails() const {
  return std::any_of(blocks.begin(), blocks.end(),
                     [](const kernels::RingBlock& b) { return b.tail_rows > 0; });
}

int64_t RowsComputedBy(const StepPlan& plan, int rank) {
  int64_t rows = 0;
  for (int e = 0; e < plan.num_experts; ++e) {
    if (plan.home[e] == rank) rows += plan.home_tokens[e];
    if (plan.host[e] == rank) rows += plan.expert_tokens[e] - plan.home_tokens[e];
  }
  return rows;
}

void BuildGpuStepTables(const StepPlan& plan, int rank, std::span<const int> slot_of, int bm,
                        int max_tail_rows, GpuStepTables* tables, bool heaviest_first) {
  const int E = plan.num_experts;
  const int P = plan.world_size;
  std::vector<kernels::ExpertRoute>& routes = tables->routes;
  std::vector<kernels::RingBlock>& blocks = tables->blocks;
  routes.assign(E, kernels::ExpertRoute{});
  blocks.clear();

  // Receive-index bases of every rank: a running cursor per rank over the experts. Then this
  // rank's blocks, expert by expert in id order or (heaviest_first) most rows first.
  std::vector<int64_t> cursor(P, 0);
  std::vector<int64_t> mine_of(E, 0), base_of(E, 0);
  for (int e = 0; e < E; ++e) {
    const int64_t total = plan.expert_tokens[e];
    const int64_t at_home = plan.home_tokens[e];
    kernels::ExpertRoute& r = routes[e];
    r.home_rank = plan.home[e];
    r.host_rank = plan.host[e];
    r.home_tokens = static_cast<int32_t>(at_home);
    r.src_offset = static_cast<int32_t>(plan.src_offset[static_cast<size_t>(rank) * E + e]);
    r.home_base = static_cast<int32_t>(cursor[plan.home[e]]);
    cursor[plan.home[e]] += at_home;
    if (plan.host[e] >= 0) {
      r.host_base = static_cast<int32_t>(cursor[plan.host[e]]);
      cursor[plan.host[e]] += total - at_home;
    }
    base_of[e] = plan.home[e] == rank ? r.home_base : r.host_base;
    mine_of[e] = plan.home[e] == rank ? at_home : plan.host[e] == rank ? total - at_home : 0;
  }
  std::vector<int> order(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  if (heaviest_first) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return mine_of[a] > mine_of[b]; });
  }
  for (int e : order) {
    const int64_t base = base_of[e];
    const int64_t mine = mine_of[e];
    routes[e].first_block = static_cast<int32_t>(blocks.size());
    for (int64_t b = 0; b < mine; b += bm) {
      blocks.push_back(kernels::RingBlock{slot_of[e], static_cast<int32_t>(base + b),
                                          static_cast<int32_t>(std::min<int64_t>(bm, mine - b)),
                                          0});
    }
    const int64_t tail = mine % bm;
    if (mine > bm && tail > 0 && tail <= max_tail_rows) {
      blocks[blocks.size() - 2].tail_rows = static_cast<int32_t>(tail);
      blocks.back().tail_rows = -1;
    }
  }
  tables->rows = cursor[rank];

  // The baseline's records.
  tables->send_count.assign(P, 0);
  tables->recv_count.assign(P, 0);
  for (int q = 0; q < P; ++q) {
    for (int e = 0; e < E; ++e) {
      int64_t home = 0, host = 0;
      Shares(plan, q, e, &home, &host);
      if (q == rank) {
        tables->send_count[plan.home[e]] += home;
        if (host > 0) tables->send_count[plan.host[e]] += host;
      }
      if (plan.home[e] == rank) tables->recv_count[q] += home;
      if (plan.host[e] == rank) tables->recv_count[q] += host;
    }
  }
  tables->send_start.assign(P, 0);
  tables->recv_start.assign(P, 0);
  for (int q = 1; q < P; ++q) {
    tables->send_start[q] = tables->send_start[q - 1] + tables->send_count[q - 1];
    tables->recv_start[q] = tables->recv_start[q - 1] + tables->recv_count[q - 1];
  }
  std::vector<int64_t> send_cursor = tables->send_start;
  for (int e = 0; e < E; ++e) {
    int64_t home = 0, host = 0;
    Shares(plan, rank, e, &home, &host);
    routes[e].send_home = static_cast<int32_t>(send_cursor[plan.home[e]]);
    send_cursor[plan.home[e]] += home;
    if (plan.host[e] >= 0) {
      routes[e].send_host = static_cast<int32_t>(send_cursor[plan.host[e]]);
      send_cursor[plan.host[e]] += host;
    }
  }
}

bool BuildDirectRows(const StepPlan& plan, const GpuStepTables& tables,
                     std::span<const int32_t> topk_ids, int bm, std::vector<int32_t>* rows) {
  if (plan.world_size != 1) return false;
  // An expert's blocks are adjacent and all full but its last, so its position i lies at ring
  // row first_block * bm + i (as the NCCL baseline unpacks it).
  std::vector<int32_t> next(static_cast<size_t>(plan.num_experts), 0);
  rows->assign(topk_ids.size(), -1);
  for (size_t a = 0; a < topk_ids.size(); ++a) {
    const int e = topk_ids[a];
    if (e >= 0) (*rows)[a] = tables.routes[static_cast<size_t>(e)].first_block * bm + next[e]++;
  }
  return true;
}

}  // namespace gcmoe::engine
