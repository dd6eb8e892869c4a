#include "balancer/topology.h"

#include <bit>
#include <charconv>

namespace gcmoe::balancer {

int Topology::degree() const {
  switch (kind) {
    case TopologyKind::kTorus: return 2;
    case TopologyKind::kCube: return std::countr_zero(static_cast<unsigned>(num_ranks));
    case TopologyKind::kRing: return 2;
  }
  return 0;
}

int Topology::Neighbour(int rank, int d) const {
  switch (kind) {
    case TopologyKind::kTorus: {
      const int i = rank / cols;
      const int j = rank % cols;
      return d == 0 ? ((i + 1) % rows) * cols + j : i * cols + (j + 1) % cols;
    }
    case TopologyKind::kCube: return rank ^ (1 << d);
    case TopologyKind::kRing:
      return d == 0 ? (rank + 1) % num_ranks : (rank + num_ranks - 1) % num_ranks;
  }
  return -1;
}

std::string Topology::ToString() const {
  switch (kind) {
    case TopologyKind::kTorus: return "torus " + std::to_string(rows) + "x" + std::to_string(cols);
    case TopologyKind::kCube: return "cube " + std::to_string(num_ranks);
    case TopologyKind::kRing: return "ring " + std::to_string(num_ranks);
  }
  return "?";
}

Result<Topology> MakeTorus(int rows, int cols) {
  if (rows < 2 || cols < 2) {
    return InvalidArgument("topology: torus sides must both be >= 2, got " + std::to_string(rows) +
                           "x" + std::to_string(cols));
  }
  Topology t;
  t.kind = TopologyKind::kTorus;
  t.num_ranks = rows * cols;
  t.rows = rows;
  t.cols = cols;
  return t;
}

Result<Topology> MakeCube(int num_ranks) {
  if (num_ranks < 2 || !std::has_single_bit(static_cast<unsigned>(num_ranks))) {
    return InvalidArgument("topology: cube needs a power-of-two rank count >= 2, got " +
                           std::to_string(num_ranks));
  }
  Topology t;
  t.kind = TopologyKind::kCube;
  t.num_ranks = num_ranks;
  return t;
}

Result<Topology> MakeRing(int num_ranks) {
  if (num_ranks < 2) {
    return InvalidArgument("topology: ring needs >= 2 ranks, got " + std::to_string(num_ranks));
  }
  Topology t;
  t.kind = TopologyKind::kRing;
  t.num_ranks = num_ranks;
  return t;
}

Result<Topology> DefaultTopology(int num_ranks) {
  int rows = 1;
  for (int a = 2; a * a <= num_ranks; ++a) {
    if (num_ranks % a == 0) rows = a;
  }
  if (rows >= 2) return MakeTorus(rows, num_ranks / rows);
  return MakeRing(num_ranks);
}

Result<Topology> ParseTopology(std::string_view spec, int num_ranks) {
  if (spec == "torus") return DefaultTopology(num_ranks);
  if (spec == "cube") return MakeCube(num_ranks);
  if (spec == "ring") return MakeRing(num_ranks);
  if (spec.starts_with("torus:")) {
    const std::string_view dims = spec.substr(6);
    const size_t x = dims.find('x');
    int rows = 0;
    int cols = 0;
    const bool parsed =
        x != std::string_view::npos &&
        std::from_chars(dims.data(), dims.data() + x, rows).ec == std::errc() &&
        std::from_chars(dims.data() + x + 1, dims.data() + dims.size(), cols).ec == std::errc();
    if (!parsed) {
      return InvalidArgument("topology: expected torus:AxB, got \"" + std::string(spec) + "\"");
    }
    if (rows * cols != num_ranks) {
      return InvalidArgument("topology: torus " + std::to_string(rows) + "x" +
                             std::to_string(cols) + " has " + std::to_string(rows * cols) +
                             " ranks, expected " + std::to_string(num_ranks));
    }
    return MakeTorus(rows, cols);
  }
  return InvalidArgument("topology: expected torus, torus:AxB, cube or ring, got \"" +
                         std::string(spec) + "\"");
}

}  // namespace gcmoe::balancer
