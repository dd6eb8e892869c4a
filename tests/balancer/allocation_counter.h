// Counts allocations through every form of operator new in the balancer test binary, so a test
// can assert that a stretch of code allocates nothing. The replacement operators live in
// allocation_counter.cc (their own file, so no test code inlines them).
#pragma once

namespace gcmoe::balancer::testing {

long AllocationCount();

}  // namespace gcmoe::balancer::testing
