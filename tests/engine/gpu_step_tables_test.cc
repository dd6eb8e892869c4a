// The CUDA backend's step tables on random multi-rank steps, checked against an independent
// simulation of what the kernels do with them (no GPU needed):
//   - role1 numbers each source's assignments of an expert in the global order and writes each
//     into the receive index of the rank that computes it: every computing rank must receive
//     exactly the rows 0..rows-1, each once, and each row must lie in a ring block of that
//     rank holding the expert's weights;
//   - the NCCL baseline packs each assignment at its place in the send records and unpacks it
//     into the ring: the send places of a source must be a permutation inside the span of
//     their destination, what q sends r must equal what r expects from q, and the unpacked
//     ring row must be the row of the block that holds the receive row.
#include "engine/gpu_step_tables.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "balancer/balancer.h"
#include "balancer/placement.h"
#include "balancer/topology.h"

namespace gcmoe::engine {
namespace {

struct RandomStep {
  balancer::Placement placement;
  StepPlan plan;
  std::vector<int64_t> counts;  // [P, E]
};

RandomStep MakeStep(int P, int E, std::mt19937_64* rng) {
  RandomStep step;
  std::vector<double> load(E);
  for (double& l : load) l = std::uniform_real_distribution<double>(0.1, 3.0)(*rng);
  if (P == 1) {
    step.placement = balancer::ContiguousPlacement(1, E);
  } else {
    auto ring = balancer::MakeRing(P);
    EXPECT_TRUE(ring.ok());
    auto fitted = balancer::FitPlacement(load, *ring, static_cast<int>((*rng)() % 3));
    EXPECT_TRUE(fitted.ok()) << fitted.status().ToString();
    step.placement = *fitted;
  }
  std::vector<int> tokens(P);
  step.counts.assign(static_cast<size_t>(P) * E, 0);
  std::vector<int64_t> totals(E, 0);
  for (int q = 0; q < P; ++q) {
    tokens[q] = static_cast<int>((*rng)() % 40);  // some ranks without tokens
    for (int t = 0; t < tokens[q]; ++t) {
      std::set<int> chosen;  // up to 4 distinct experts per token, some slots unused
      for (int j = 0; j < 4; ++j) {
        if ((*rng)() % 5 != 0) chosen.insert(static_cast<int>((*rng)() % E));
      }
      for (int e : chosen) {
        ++step.counts[static_cast<size_t>(q) * E + e];
        ++totals[e];
      }
    }
  }
  // Any split in range: all home, all host, or anything between.
  balancer::Split split;
  split.home_tokens = totals;
  for (int e = 0; e < E; ++e) {
    if (step.placement.host[e] >= 0) {
      split.home_tokens[e] = static_cast<int64_t>((*rng)() % (totals[e] + 1));
    }
  }
  const Status s = BuildStepPlan(tokens, step.counts, E, step.placement, split, &step.plan);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return step;
}

TEST(GpuStepTables, RoutingAndPackingAgreeWithTheKernelsOnRandomSteps) {
  std::mt19937_64 rng(20261129);
  int steps = 0;
  for (int P : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 40; ++trial) {
      const int E = 8 + static_cast<int>(rng() % 25);
      const int bm = 8 << (rng() % 4);
      const RandomStep step = MakeStep(P, E, &rng);
      const StepPlan& plan = step.plan;
      // Local slots: the held experts in ascending order, as the engine loads them.
      std::vector<std::vector<int>> slot_of(P, std::vector<int>(E, -1));
      for (int r = 0; r < P; ++r) {
        const std::vector<int> held = step.placement.ExpertsOnRank(r);
        for (size_t i = 0; i < held.size(); ++i) slot_of[r][held[i]] = static_cast<int>(i);
      }
      // A third of the trials merge no tails; the rest up to a random number of rows.
      const int max_tail = trial % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % bm);
      // Every other trial lays the experts' blocks out heaviest first: the checks below hold
      // for either order.
      const bool heaviest_first = trial % 2 == 1;
      std::vector<GpuStepTables> tables(P);
      for (int r = 0; r < P; ++r) {
        BuildGpuStepTables(plan, r, slot_of[r], bm, max_tail, &tables[r], heaviest_first);
      }
      // The order itself: each expert's blocks in one run, the runs by their rows (most first
      // when heaviest_first, else by expert id, which ascends with the local slot).
      for (int r = 0; r < P; ++r) {
        std::vector<std::pair<int, int64_t>> runs;  // (local slot, rows)
        for (const kernels::RingBlock& block : tables[r].blocks) {
          if (runs.empty() || runs.back().first != block.local_slot) {
            runs.emplace_back(block.local_slot, 0);
          }
          runs.back().second += block.rows;
        }
        for (size_t i = 1; i < runs.size(); ++i) {
          if (heaviest_first) {
            ASSERT_GE(runs[i - 1].second, runs[i].second) << "trial " << trial << " rank " << r;
          } else {
            ASSERT_LT(runs[i - 1].first, runs[i].first) << "trial " << trial << " rank " << r;
          }
        }
      }

      // Role2 with merged tails: the blocks it computes (all but the tails) cover every receive
      // row once, each a run of one expert's rows; a merged tail is its expert's partial last
      // block of at most max_tail rows after a full one, and every such block is merged.
      for (int r = 0; r < P; ++r) {
        const std::vector<kernels::RingBlock>& blocks = tables[r].blocks;
        std::vector<int> computed(static_cast<size_t>(tables[r].rows), 0);
        bool any_mergeable = false;  // what merged_tails() must say (it picks role2's graph)
        for (size_t b = 0; b < blocks.size(); ++b) {
          const kernels::RingBlock& block = blocks[b];
          const bool last_of_expert =
              b + 1 == blocks.size() || blocks[b + 1].local_slot != block.local_slot;
          const bool after_full =
              b > 0 && blocks[b - 1].local_slot == block.local_slot && blocks[b - 1].rows == bm;
          const bool mergeable =
              last_of_expert && after_full && block.rows < bm && block.rows <= max_tail;
          ASSERT_EQ(block.tail_rows == -1, mergeable) << "block " << b << " rows " << block.rows;
          any_mergeable = any_mergeable || mergeable;
          if (block.tail_rows < 0) continue;
          int rows = block.rows;
          if (block.tail_rows > 0) {
            ASSERT_LT(b + 1, blocks.size());
            const kernels::RingBlock& tail = blocks[b + 1];
            ASSERT_EQ(tail.tail_rows, -1);
            ASSERT_EQ(block.rows, bm);
            ASSERT_EQ(tail.local_slot, block.local_slot);
            ASSERT_EQ(tail.rows, block.tail_rows);
            ASSERT_EQ(tail.row_begin, block.row_begin + bm);
            rows += tail.rows;
          }
          for (int i = 0; i < rows; ++i) ++computed[block.row_begin + i];
        }
        for (int64_t i = 0; i < tables[r].rows; ++i) {
          ASSERT_EQ(computed[i], 1) << "rank " << r << " row " << i << " max_tail " << max_tail;
        }
        ASSERT_EQ(tables[r].merged_tails(), any_mergeable) << "rank " << r;
      }

      // Role1: every source routes its assignments into the computing ranks' indexes.
      std::vector<std::vector<int>> received(P);   // receive rows written, per target
      std::vector<std::vector<int>> expert_of(P);  // which expert each row carries
      for (int r = 0; r < P; ++r) {
        received[r].assign(static_cast<size_t>(tables[r].rows), 0);
        expert_of[r].assign(static_cast<size_t>(tables[r].rows), -1);
      }
      for (int q = 0; q < P; ++q) {
        std::vector<int> sent_at(static_cast<size_t>(tables[q].sent()), 0);
        for (int e = 0; e < E; ++e) {
          const kernels::ExpertRoute& route = tables[q].routes[e];
          ASSERT_EQ(route.src_offset, plan.src_offset[static_cast<size_t>(q) * E + e]);
          for (int64_t i = 0; i < step.counts[static_cast<size_t>(q) * E + e]; ++i) {
            const int position = route.src_offset + static_cast<int>(i);
            const bool at_home = position < route.home_tokens;
            const int target = at_home ? route.home_rank : route.host_rank;
            ASSERT_GE(target, 0) << "P " << P << " expert " << e << " position " << position;
            ASSERT_EQ(target, plan.ComputeRank(e, position));
            const int index = at_home ? route.home_base + position
                                      : route.host_base + (position - route.home_tokens);
            ASSERT_GE(index, 0);
            ASSERT_LT(index, tables[target].rows) << "P " << P << " expert " << e;
            ++received[target][index];
            expert_of[target][index] = e;
            // The baseline's send place of the same assignment.
            const int send =
                at_home
                    ? route.send_home + (position - route.src_offset)
                    : route.send_host + (position - std::max(route.src_offset, route.home_tokens));
            ASSERT_GE(send, tables[q].send_start[target]);
            ASSERT_LT(send, tables[q].send_start[target] + tables[q].send_count[target]);
            ++sent_at[send];
            // Unpacked at the target: the ring row of the block holding `index`.
            const kernels::ExpertRoute& there = tables[target].routes[e];
            const int base = there.home_rank == target ? there.home_base : there.host_base;
            const int64_t ring_row = static_cast<int64_t>(there.first_block) * bm + (index - base);
            const kernels::RingBlock& block = tables[target].blocks[ring_row / bm];
            ASSERT_LT(ring_row % bm, block.rows);
            ASSERT_EQ(block.row_begin + ring_row % bm, index);
            ASSERT_EQ(block.local_slot, slot_of[target][e]) << "expert " << e << " not held there";
          }
        }
        for (int v : sent_at) ASSERT_EQ(v, 1) << "source " << q << ": a send place used " << v;
        for (int r = 0; r < P; ++r) {
          ASSERT_EQ(tables[q].send_count[r], tables[r].recv_count[q]) << q << " -> " << r;
        }
      }
      int64_t all_rows = 0;
      for (int r = 0; r < P; ++r) {
        ASSERT_EQ(tables[r].rows, RowsComputedBy(plan, r));
        all_rows += tables[r].rows;
        for (int v : received[r])
          ASSERT_EQ(v, 1) << "rank " << r << ": a receive row written " << v;
        // The blocks cut the receive index, one expert each, at most BM rows: in order, or
        // (heaviest first) in an order of whole experts, so in order once sorted.
        std::vector<kernels::RingBlock> cut = tables[r].blocks;
        std::sort(cut.begin(), cut.end(),
                  [](const kernels::RingBlock& a, const kernels::RingBlock& b) {
                    return a.row_begin < b.row_begin;
                  });
        if (!heaviest_first) {
          ASSERT_TRUE(std::equal(cut.begin(), cut.end(), tables[r].blocks.begin(),
                                 [](const kernels::RingBlock& a, const kernels::RingBlock& b) {
                                   return a.row_begin == b.row_begin;
                                 }));
        }
        int64_t next = 0;
        for (const kernels::RingBlock& b : cut) {
          ASSERT_EQ(b.row_begin, next);
          ASSERT_GE(b.rows, 1);
          ASSERT_LE(b.rows, bm);
          for (int i = 0; i < b.rows; ++i) {
            ASSERT_EQ(slot_of[r][expert_of[r][b.row_begin + i]], b.local_slot);
          }
          next += b.rows;
        }
        ASSERT_EQ(next, tables[r].rows);
      }
      ASSERT_EQ(all_rows, std::accumulate(step.counts.begin(), step.counts.end(), int64_t{0}));
      ++steps;
    }
  }
  EXPECT_EQ(steps, 200);
}

// One rank's direct rows (role1 writing each assignment's ring row itself) against a simulation
// of the pull they replace: role1 numbers an expert's assignments in order of token, then slot,
// puts position i at receive row home_base + i, and block b's ring row b * bm + r holds receive
// row row_begin + r.
TEST(GpuStepTables, DirectRowsAreWhereThePullPutsEachAssignment) {
  std::mt19937_64 rng(20261203);
  for (int trial = 0; trial < 60; ++trial) {
    const int E = 4 + static_cast<int>(rng() % 29);
    const int k = 1 + static_cast<int>(rng() % 8);
    const int T = static_cast<int>(rng() % 300);
    const int bm = 8 << (rng() % 4);
    std::vector<int32_t> ids(static_cast<size_t>(T) * k, -1);
    std::vector<int64_t> counts(E, 0);
    for (int t = 0; t < T; ++t) {
      std::set<int> chosen;  // distinct experts per token, some slots unused
      for (int j = 0; j < k; ++j) {
        const int e = static_cast<int>(rng() % E);
        if (rng() % 6 == 0 || !chosen.insert(e).second) continue;
        ids[static_cast<size_t>(t) * k + j] = e;
        ++counts[e];
      }
    }
    balancer::Split split;
    split.home_tokens = counts;
    StepPlan plan;
    const std::vector<int> tokens = {T};
    ASSERT_TRUE(
        BuildStepPlan(tokens, counts, E, balancer::ContiguousPlacement(1, E), split, &plan).ok());
    std::vector<int> slot_of(E);
    std::iota(slot_of.begin(), slot_of.end(), 0);
    const int max_tail = trial % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % bm);
    GpuStepTables tables;
    BuildGpuStepTables(plan, 0, slot_of, bm, max_tail, &tables, trial % 2 == 1);
    std::vector<int32_t> direct;
    ASSERT_TRUE(BuildDirectRows(plan, tables, ids, bm, &direct));
    ASSERT_EQ(direct.size(), ids.size());

    std::vector<int> seen(E, 0);
    std::set<int32_t> used;
    for (size_t a = 0; a < ids.size(); ++a) {
      const int e = ids[a];
      if (e < 0) {
        ASSERT_EQ(direct[a], -1) << "trial " << trial << " assignment " << a;
        continue;
      }
      const kernels::ExpertRoute& route = tables.routes[e];
      const int64_t receive_row = route.home_base + seen[e]++;
      int64_t ring_row = -1;  // the pull's ring row of that receive row
      for (size_t b = 0; b < tables.blocks.size(); ++b) {
        const kernels::RingBlock& block = tables.blocks[b];
        if (receive_row >= block.row_begin && receive_row < block.row_begin + block.rows) {
          ASSERT_EQ(block.local_slot, slot_of[e]);
          ring_row = static_cast<int64_t>(b) * bm + (receive_row - block.row_begin);
        }
      }
      ASSERT_EQ(direct[a], ring_row) << "trial " << trial << " assignment " << a;
      ASSERT_TRUE(used.insert(direct[a]).second) << "ring row " << direct[a] << " twice";
    }
    ASSERT_EQ(static_cast<int64_t>(used.size()), tables.rows);
  }
  // Peers pull their rows: no direct rows for a plan of two ranks.
  std::mt19937_64 rng2(7);
  const RandomStep two = MakeStep(2, 8, &rng2);
  GpuStepTables tables;
  std::vector<int32_t> direct;
  EXPECT_FALSE(BuildDirectRows(two.plan, tables, std::vector<int32_t>(4, 0), 8, &direct));
}

}  // namespace
}  // namespace gcmoe::engine
