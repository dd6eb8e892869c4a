// The balancer seam: where each expert's copies live, and how each step splits a replicated
// expert's tokens between its two copies. The rank engine calls only this header.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::balancer {

// Where every expert's copies live. A replicated expert has exactly two copies: its home copy
// on home[e] and one extra copy on host[e] (DESIGN.md §5: one "transfer", edge home-host).
struct Placement {
  int num_ranks = 0;
  int num_experts = 0;
  std::vector<int> home;  // [E] rank of the home copy
  std::vector<int> host;  // [E] rank of the second copy; -1 when the expert is not replicated

  bool replicated(int expert) const { return host[expert] >= 0; }
  // Experts with a copy (home or host) on `rank`, ascending by expert id.
  std::vector<int> ExpertsOnRank(int rank) const;
  // Every expert has a home in range, hosts differ from homes, sizes agree.
  Status Validate() const;
};

// Expert e goes to rank floor(e * G / E): the layout with no balancing at all.
Placement ContiguousPlacement(int num_ranks, int num_experts);

// One step's decision. Vectors are sized once and reused, so solving allocates nothing.
struct Split {
  // [E] how many of expert e's assignments (ordered by source rank, token, slot) its home copy
  // serves; the rest go to the host copy. Equals the expert's total when not replicated.
  std::vector<int64_t> home_tokens;
  std::vector<int64_t> load_before;  // [G] assignments per rank with every token at home
  std::vector<int64_t> load_after;   // [G] assignments per rank under this split
  int passes = 0;                    // relaxation passes run (0: no balancing)
  int64_t solve_ns = 0;              // wall time of Solve
};

class Balancer {
 public:
  virtual ~Balancer() = default;
  virtual std::string name() const = 0;

  // Installs a placement; compiles whatever the policy derives from it (e.g. a transfer list).
  virtual Status SetPlacement(const Placement& placement) = 0;
  virtual const Placement& placement() const = 0;

  // Sets the pass count of the solves that follow: the service's coordinator chooses it (fixed,
  // or calibrated once) and sends it with every step, so that all ranks run the same number.
  // Policies without passes accept and ignore it.
  virtual Status SetPasses(int passes) {
    (void)passes;
    return Status::Ok();
  }

  // expert_tokens: [E] this step's assignments per expert, summed over source ranks.
  // Deterministic: equal inputs give bit-identical splits on every rank, process and run.
  virtual Status Solve(std::span<const int64_t> expert_tokens, Split* split) = 0;
};

// Every token stays at its expert's home copy: the policy before Relief, and "balancing off".
std::unique_ptr<Balancer> CreateNoReplicationBalancer();

}  // namespace gcmoe::balancer
