// The reference pass: DESIGN.md §5 "One pass" line by line, one transfer at a time in list order.
#include <cstdlib>

#include "balancer/relief_kernels.h"

namespace gcmoe::balancer::relief_internal {

void RunPassesScalar(const TransferList& list, int passes, int32_t* load, int32_t* mass,
                     const int32_t* tok) {
  constexpr int32_t kEpsilon = 1;  // one LSB
  const int num_transfers = static_cast<int>(list.transfers.size());
  const Transfer* transfers = list.transfers.data();
  for (int p = 0; p < passes; ++p) {
    for (int t = 0; t < num_transfers; ++t) {
      const int u = transfers[t].home;
      const int v = transfers[t].host;
      // Loads are never negative and fit 31 bits (the caller sizes F so), so neither the
      // difference nor its magnitude overflows.
      const int32_t gap = load[u] - load[v];
      int32_t delta = std::abs(gap) >> 1;
      const int32_t limit = gap > 0 ? mass[t] : tok[t] - mass[t];
      if (limit < delta) delta = limit;
      if (delta > kEpsilon) {
        const int32_t moved = gap > 0 ? delta : -delta;
        load[u] -= moved;
        load[v] += moved;
        mass[t] -= moved;
      }
    }
  }
}

}  // namespace gcmoe::balancer::relief_internal
