// Compiles a transfer list into the lane program the SIMD kernels walk (relief_kernels.h),
// including the choice of lane layout. Runs once per placement; nothing here is per step.
#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "balancer/relief_kernels.h"

namespace gcmoe::balancer::relief_internal {
namespace {

using Partners = std::vector<std::vector<int>>;  // [rounds][ranks] partner rank, self if idle

Partners RoundPartners(const TransferList& list) {
  Partners partner(list.num_rounds(), std::vector<int>(list.num_ranks));
  for (int r = 0; r < list.num_rounds(); ++r) {
    std::iota(partner[r].begin(), partner[r].end(), 0);
    for (int t = list.round_begin[r]; t < list.round_begin[r + 1]; ++t) {
      partner[r][list.transfers[t].home] = list.transfers[t].host;
      partner[r][list.transfers[t].host] = list.transfers[t].home;
    }
  }
  return partner;
}

class UnionFind {
 public:
  explicit UnionFind(int n) : parent_(n), size_(n, 1) { std::iota(parent_.begin(), parent_.end(), 0); }
  int Find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  bool Union(int a, int b) {
    a = Find(a);
    b = Find(b);
    if (a == b) return false;
    if (size_[a] < size_[b]) std::swap(a, b);
    parent_[b] = a;
    size_[a] += size_[b];
    return true;
  }
  int SizeOf(int x) { return size_[Find(x)]; }

 private:
  std::vector<int> parent_;
  std::vector<int> size_;
};

// Adds x ~ y and closes the relation under every round's matching: the finest partition that
// contains the pair and that every matching maps block to block (a block system).
void Close(UnionFind& uf, const Partners& partner, int x, int y) {
  std::vector<std::pair<int, int>> queue = {{x, y}};
  while (!queue.empty()) {
    const auto [a, b] = queue.back();
    queue.pop_back();
    if (!uf.Union(a, b)) continue;
    for (const std::vector<int>& p : partner) queue.emplace_back(p[a], p[b]);
  }
}

// Lanes of a block system whose blocks all hold `width` ranks: blocks in order of their lowest
// rank; the first block's lanes ascend, and each further block reached through a round's
// matching takes the order of its image, so that pairing is lane-aligned where it can be.
std::vector<int> LayoutFromBlocks(UnionFind& uf, const Partners& partner, int g, int width) {
  std::vector<int> block_of(g, -1);
  std::vector<std::vector<int>> blocks;
  for (int x = 0; x < g; ++x) {
    const int root = uf.Find(x);
    int b = -1;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (uf.Find(blocks[i][0]) == root) b = static_cast<int>(i);
    }
    if (b < 0) {
      b = static_cast<int>(blocks.size());
      blocks.emplace_back();
    }
    blocks[b].push_back(x);
    block_of[x] = b;
  }
  std::vector<char> ordered(blocks.size(), 0);
  for (size_t start = 0; start < blocks.size(); ++start) {
    if (ordered[start]) continue;
    ordered[start] = 1;
    std::vector<int> queue = {static_cast<int>(start)};
    while (!queue.empty()) {
      const int b = queue.back();
      queue.pop_back();
      for (const std::vector<int>& p : partner) {
        const int image = block_of[p[blocks[b][0]]];
        if (ordered[image]) continue;
        for (int j = 0; j < width; ++j) blocks[image][j] = p[blocks[b][j]];
        ordered[image] = 1;
        queue.push_back(image);
      }
    }
  }
  std::vector<int> rank_of_lane;
  for (const auto& block : blocks) rank_of_lane.insert(rank_of_lane.end(), block.begin(), block.end());
  return rank_of_lane;
}

int32_t AddIndexVector(LaneProgram& prog, const std::vector<int>& lanes) {
  const int32_t number = static_cast<int32_t>(prog.src_index.size() / prog.width);
  for (int j : lanes) prog.src_index.push_back(j);
  return number;
}

// Block operations for one round (lane partners given), or false when some block pairs into
// several blocks. Marks computing lanes.
bool BuildBlockOps(LaneProgram& prog, const std::vector<int>& partner, std::vector<LaneOp>* ops,
                   std::vector<int>* computes) {
  const int w = prog.width;
  std::vector<int> source(prog.num_blocks, -1);
  for (int k = 0; k < prog.num_blocks; ++k) {
    for (int j = 0; j < w; ++j) {
      const int src = partner[k * w + j] / w;
      if (source[k] >= 0 && source[k] != src) return false;
      source[k] = src;
    }
  }
  for (int k = 0; k < prog.num_blocks; ++k) {
    if (source[source[k]] != k) return false;
  }
  computes->assign(prog.num_lanes, 0);
  for (int k = 0; k < prog.num_blocks; ++k) {
    const int b = source[k];
    if (b < k) continue;  // emitted from the pair's lower block
    LaneOp op;
    op.block_a = k;
    op.block_b = b;
    std::vector<int> ab(w), ba(w);
    bool aligned = true;
    for (int j = 0; j < w; ++j) {
      ab[j] = partner[k * w + j] % w;
      ba[j] = partner[b * w + j] % w;
      aligned = aligned && ab[j] == j;
      (*computes)[k * w + j] = 1;
    }
    if (b == k) {
      op.kind = kSelf;
      op.index = AddIndexVector(prog, ab);
    } else {
      op.kind = kPair;
      if (!aligned) {
        op.index = AddIndexVector(prog, ab);
        AddIndexVector(prog, ba);
      }
    }
    ops->push_back(op);
  }
  return true;
}

// Appends round `ops` to the register fast path; returns false when the round does not fit it.
bool RecordXorRound(LaneProgram& prog, const std::vector<LaneOp>& ops) {
  int mask = -1;
  std::vector<int32_t> index(prog.num_blocks, -1);
  for (const LaneOp& op : ops) {
    const int m = op.kind == kSelf ? 0 : op.kind == kPair ? (op.block_a ^ op.block_b) : -1;
    if (m < 0 || (mask >= 0 && m != mask)) return false;
    mask = m;
    index[op.block_a] = op.index;
  }
  // Every block covered: by its own kSelf op, or as one of the two blocks of a kPair op.
  if (ops.empty() || static_cast<int>(ops.size()) != (mask == 0 ? prog.num_blocks : prog.num_blocks / 2)) {
    return false;
  }
  prog.xor_mask.push_back(mask);
  prog.xor_index.insert(prog.xor_index.end(), index.begin(), index.end());
  return true;
}

LaneProgram BuildWithLayout(const TransferList& list, int width,
                            const std::vector<int>& rank_of_lane) {
  LaneProgram prog;
  prog.width = width;
  prog.num_ranks = list.num_ranks;
  prog.num_lanes = static_cast<int>(rank_of_lane.size());
  prog.num_blocks = prog.num_lanes / width;
  prog.num_rounds = list.num_rounds();
  prog.rank_of_lane.assign(rank_of_lane.begin(), rank_of_lane.end());
  prog.lane_of_rank.assign(list.num_ranks, -1);
  for (int l = 0; l < prog.num_lanes; ++l) {
    if (rank_of_lane[l] >= 0) prog.lane_of_rank[rank_of_lane[l]] = l;
  }
  const int lanes = prog.num_lanes;
  const int w = width;
  const std::vector<int>& lane_of = prog.lane_of_rank;

  prog.transfer_slot.assign(list.transfers.size(), 0);
  prog.transfer_slot_is_home.assign(list.transfers.size(), 0);
  prog.transfer_other_slot.assign(list.transfers.size(), -1);
  prog.lane_home.assign(static_cast<size_t>(prog.num_rounds) * lanes, 0);
  std::vector<int> partner(lanes);
  std::vector<int> computes(lanes);
  prog.op_begin.push_back(0);
  prog.src_begin.push_back(0);
  bool xor_ok = prog.num_rounds > 0;
  for (int r = 0; r < prog.num_rounds; ++r) {
    std::iota(partner.begin(), partner.end(), 0);
    for (int t = list.round_begin[r]; t < list.round_begin[r + 1]; ++t) {
      const int u = lane_of[list.transfers[t].home];
      const int v = lane_of[list.transfers[t].host];
      partner[u] = v;
      partner[v] = u;
    }
    std::vector<LaneOp> ops;
    if (BuildBlockOps(prog, partner, &ops, &computes)) {
      for (const LaneOp& op : ops) {
        if (op.kind == kSelf) std::fill_n(computes.begin() + op.block_a * w, w, 1);
      }
      for (int k = 0; k < prog.num_blocks; ++k) prog.src_begin.push_back(prog.src_begin.back());
    } else {
      ops.assign(1, LaneOp{kGeneral, 0, 0, -1});
      std::fill(computes.begin(), computes.end(), 1);
      // Output block k: partner loads of its lanes, from each block they live in, in order of
      // first use; the first source fills every lane and later ones overwrite their own lanes.
      for (int k = 0; k < prog.num_blocks; ++k) {
        std::vector<int> sources;
        for (int j = 0; j < w; ++j) {
          const int src = partner[k * w + j] / w;
          if (std::find(sources.begin(), sources.end(), src) == sources.end()) {
            sources.push_back(src);
          }
        }
        for (int src : sources) {
          prog.src_block.push_back(src);
          uint32_t bits = 0;
          for (int j = 0; j < w; ++j) {
            const int p = partner[k * w + j];
            const bool mine = p / w == src;
            prog.src_general_index.push_back(mine ? p % w : j);
            prog.src_mask.push_back(mine ? -1 : 0);
            if (mine) bits |= 1u << j;
          }
          prog.src_bits.push_back(bits);
        }
        prog.src_begin.push_back(static_cast<int32_t>(prog.src_block.size()));
      }
    }
    prog.ops.insert(prog.ops.end(), ops.begin(), ops.end());
    prog.op_begin.push_back(static_cast<int32_t>(prog.ops.size()));
    xor_ok = xor_ok && RecordXorRound(prog, ops);

    const int base = r * lanes;
    for (int t = list.round_begin[r]; t < list.round_begin[r + 1]; ++t) {
      const int u = lane_of[list.transfers[t].home];
      const int v = lane_of[list.transfers[t].host];
      const bool home_computes = computes[u] != 0;
      prog.transfer_slot[t] = base + (home_computes ? u : v);
      prog.transfer_slot_is_home[t] = home_computes ? 1 : 0;
      if (computes[u]) prog.lane_home[base + u] = -1;
      if (computes[u] && computes[v]) prog.transfer_other_slot[t] = base + v;
    }
  }
  if (!xor_ok) {
    prog.xor_mask.clear();
    prog.xor_index.clear();
  }
  return prog;
}

}  // namespace

double PassCost(const LaneProgram& prog) {
  double cost = 0.0;
  for (int r = 0; r < prog.num_rounds; ++r) {
    for (int o = prog.op_begin[r]; o < prog.op_begin[r + 1]; ++o) {
      const LaneOp& op = prog.ops[o];
      if (op.kind == kGeneral) {
        // Phase 1 per source (permute, blend) and a store per block, then phase 2 per block.
        const int sources = prog.src_begin[(r + 1) * prog.num_blocks] -
                            prog.src_begin[r * prog.num_blocks];
        cost += 0.3 * sources + 1.2 * prog.num_blocks;
      } else {
        cost += op.kind == kPair && op.index >= 0 ? 1.2 : 1.0;
      }
    }
  }
  // Loads held in registers save a store and a forwarded load per block and round.
  const int max_register_blocks = prog.width == 8 ? 8 : 4;  // what the kernels instantiate
  const bool register_path = !prog.xor_mask.empty() &&
                             (prog.num_blocks & (prog.num_blocks - 1)) == 0 &&
                             prog.num_blocks <= max_register_blocks;
  return register_path ? 0.6 * cost : cost;
}

LaneProgram BuildLaneProgram(const TransferList& list, int width) {
  const int g = list.num_ranks;
  const int lanes = (g + width - 1) / width * width;
  std::vector<int> identity(lanes, -1);
  std::iota(identity.begin(), identity.begin() + g, 0);
  LaneProgram best = BuildWithLayout(list, width, identity);
  double best_cost = PassCost(best);

  // Block-system layouts need whole blocks of ranks; beyond a few hundred ranks the search
  // (cubic in G) is not worth its time and the identity layout stays.
  constexpr int kMaxSearchRanks = 512;
  if (g % width != 0 || g == width || g > kMaxSearchRanks || list.num_rounds() == 0) return best;
  const Partners partner = RoundPartners(list);
  std::set<std::vector<int>> seen;
  for (int y = 1; y < g; ++y) {
    UnionFind uf(g);
    Close(uf, partner, 0, y);
    if (uf.SizeOf(0) > width) continue;
    // Grow the block of rank 0 up to `width` ranks with further seeds, keeping every step a
    // block system (the closure guarantees that).
    for (int z = 1; z < g && uf.SizeOf(0) < width; ++z) {
      if (uf.Find(z) == uf.Find(0)) continue;
      UnionFind trial = uf;
      Close(trial, partner, 0, z);
      if (trial.SizeOf(0) <= width) uf = trial;
    }
    bool uniform = true;
    std::vector<int> signature(g);
    for (int x = 0; x < g; ++x) {
      uniform = uniform && uf.SizeOf(x) == width;
      signature[x] = uf.Find(x);
    }
    if (!uniform) continue;
    // Canonical form: the lowest rank of each block.
    std::vector<int> lowest(g, g);
    for (int x = 0; x < g; ++x) lowest[signature[x]] = std::min(lowest[signature[x]], x);
    for (int x = 0; x < g; ++x) signature[x] = lowest[signature[x]];
    if (!seen.insert(signature).second) continue;
    LaneProgram candidate = BuildWithLayout(list, width, LayoutFromBlocks(uf, partner, g, width));
    const double cost = PassCost(candidate);
    if (cost < best_cost) {
      best_cost = cost;
      best = std::move(candidate);
    }
  }
  return best;
}

}  // namespace gcmoe::balancer::relief_internal
