// A check of the green-context pair: the handshake the layer graph relies on. One captured
// graph with two roots: a kernel on the compute partition spins until a kernel on the dispatch
// partition releases a flag. Each CTA records its SM, so a caller can check the partitions are
// disjoint and sized as the driver said.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/green_context.h"

namespace gcmoe::kernels {

struct PartitionProbeResult {
  bool handshake_completed = false;  // the spinning kernel saw the flag within the timeout
  std::vector<int> compute_sm_ids;   // SM of each compute CTA
  std::vector<int> dispatch_sm_ids;  // SM of each dispatch CTA
};

// Needs a green pair (pair.green). Runs the graph `replays` times.
cudaError_t RunPartitionProbe(const GreenContextPair& pair, int replays, uint64_t timeout_ns,
                              PartitionProbeResult* result);

}  // namespace gcmoe::kernels
