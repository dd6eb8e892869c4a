// Fitting a Relief placement to a layer's mean load (DESIGN.md §5 Placement).
#pragma once

#include <span>

#include "balancer/balancer.h"
#include "balancer/topology.h"
#include "common/status.h"

namespace gcmoe::balancer {

// Balanced packing, then replication:
//  1. Experts, heaviest mean load first (ties: lower expert id), go to the lightest rank that
//     still has room (ties: lower rank id). A rank has room for ceil(E/G) experts; when G does
//     not divide E the missing experts are zero-load padding, i.e. some ranks hold one fewer.
//  2. On every rank, its min(D, experts on the rank) heaviest experts (ties: lower id) are
//     replicated: the d-th heaviest gets its second copy on topology.Neighbour(rank, d).
// Every replicated expert therefore has exactly two copies, and its edge home-host is an edge
// of the topology.
Result<Placement> FitPlacement(std::span<const double> mean_load, const Topology& topology,
                               int replicas_per_rank);

}  // namespace gcmoe::balancer
