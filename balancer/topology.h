// The fixed neighbour relation that decides where a rank's replicated experts get their second
// copy (DESIGN.md §5 Placement). Neighbour d of rank r hosts the copy of r's d-th heaviest expert.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace gcmoe::balancer {

enum class TopologyKind {
  kTorus,  // C_rows x C_cols: rank i*cols+j -> ((i+1) mod rows)*cols+j, then i*cols+(j+1) mod cols
  kCube,   // hypercube on 2^k ranks (the 8-rank cube is k = 3): neighbour d is rank ^ (1 << d)
  kRing,   // neighbour 0 is rank+1, neighbour 1 is rank-1 (mod G)
};

struct Topology {
  TopologyKind kind = TopologyKind::kTorus;
  int num_ranks = 0;
  int rows = 0;  // torus only
  int cols = 0;  // torus only

  // How many distinct neighbour slots a rank has: the largest usable replicas-per-rank D.
  int degree() const;
  // Rank that hosts the copy of `rank`'s d-th heaviest expert, 0 <= d < degree(). Never `rank`.
  int Neighbour(int rank, int d) const;
  // "torus 8x8", "cube 8", "ring 16".
  std::string ToString() const;
};

// C_rows x C_cols torus; both sides at least 2 so that no rank is its own neighbour.
Result<Topology> MakeTorus(int rows, int cols);
// Hypercube on num_ranks = 2^k ranks, k >= 1.
Result<Topology> MakeCube(int num_ranks);
// Ring on num_ranks >= 2 ranks.
Result<Topology> MakeRing(int num_ranks);

// The near-square torus the paper uses (rows <= cols, rows the largest divisor <= sqrt(G)):
// 2x2 at G=4, 2x4 at 8, 4x4 at 16, 4x8 at 32, 8x8 at 64. A G with no factorisation into two
// sides >= 2 (a prime, or 2) gets a ring.
Result<Topology> DefaultTopology(int num_ranks);

// "torus" (the default factorisation), "torus:AxB", "cube", "ring".
Result<Topology> ParseTopology(std::string_view spec, int num_ranks);

}  // namespace gcmoe::balancer
