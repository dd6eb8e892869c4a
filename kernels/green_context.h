// The compute/communication green-context pair of one device (DESIGN.md §6, paper §4.2),
// created once per (device, dispatch request) and cached for the life of the process.
//
// Driver-API functions are reached through cudaGetDriverEntryPointByVersion, so nothing links
// libcuda and a binary built with CUDA still starts on a machine without the driver.
#pragma once

#include <string>

#include <cuda_runtime.h>

namespace gcmoe::kernels {

struct GreenContextPair {
  int device = 0;
  // false: the documented single-context fallback (green contexts unavailable): both streams
  // are one ordinary stream and the layer graph runs its roles one after the other.
  bool green = false;
  std::string fallback_reason;
  int total_sms = 0;
  int min_partition_sms = 0;  // the driver's minimum partition
  int alignment_sms = 0;      // the driver's co-scheduling alignment
  int requested_dispatch_sms = 0;
  int compute_sms = 0;                     // driver-aligned result
  int dispatch_sms = 0;                    // the complement: total - compute
  cudaStream_t compute_stream = nullptr;   // green stream of the compute partition
  cudaStream_t dispatch_stream = nullptr;  // green stream of the communication partition
};

// The pair for `device` with `dispatch_sms_request` SMs asked for dispatch: the compute
// partition gets floor((total - request) / alignment) * alignment SMs, the dispatch partition
// the rest. Validated: at least 32 compute SMs, compute + dispatch == total, the read-back SM
// counts of both contexts equal the split. A request of 0 gives the single-context fallback
// (all SMs, roles in sequence). Errors (a request that leaves too few compute SMs,
// a driver failure) return non-success with `error` set; missing green-context support is not
// an error but the fallback, with `fallback_reason` set.
cudaError_t GetGreenContextPair(int device, int dispatch_sms_request, const GreenContextPair** pair,
                                std::string* error);

}  // namespace gcmoe::kernels
