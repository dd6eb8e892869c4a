// Non-x86 builds: no SIMD kernel is available, so CreateReliefBalancer always picks the scalar
// reference. The SIMD entry points exist only to satisfy the linker and are never reached.
#include <cstdlib>

#include "balancer/relief_kernels.h"

namespace gcmoe::balancer::relief_internal {

bool CpuHasAvx2() { return false; }
bool CpuHasAvx512() { return false; }

TokenScan ScanTokensAvx2(const int64_t*, int, int64_t*) { std::abort(); }
RankPeaks EmitRanksAvx2(const int32_t*, int, int, const int32_t*, const int32_t*, int64_t*,
                        int64_t*) {
  std::abort();
}
void PrepareAvx2(const int64_t*, int, int, const int32_t*, int, const int32_t*, const int32_t*,
                 const int32_t*, int, const LaneProgram&, int32_t*, int32_t*, int32_t*, int32_t*,
                 int32_t*) {
  std::abort();
}
void RunPassesAvx2(const LaneProgram&, int, int32_t*, int32_t*, const int32_t*, int32_t*) {
  std::abort();
}
void EmitLoadsAvx2(const LaneProgram&, int, const int32_t*, const int32_t*, const int32_t*,
                   int32_t*, int32_t*) {
  std::abort();
}
void RunPassesAvx512(const LaneProgram&, int, int32_t*, int32_t*, const int32_t*, int32_t*) {
  std::abort();
}
void EmitLoadsAvx512(const LaneProgram&, int, const int32_t*, const int32_t*, const int32_t*,
                     int32_t*, int32_t*) {
  std::abort();
}

}  // namespace gcmoe::balancer::relief_internal
