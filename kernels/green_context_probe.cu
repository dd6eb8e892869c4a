#include "kernels/green_context_probe.h"

#include "kernels/device_common.cuh"

namespace gcmoe::kernels {
namespace {

// Spins (bounded) until *flag reaches `target`; no trap, the host reports a missed handshake.
__global__ void ProbeSpinKernel(const uint32_t* flag, uint32_t* target_and_missed, int* sm_ids,
                                uint64_t timeout_ns) {
  if (threadIdx.x != 0) return;
  sm_ids[blockIdx.x] = static_cast<int>(SmId());
  const uint32_t target = LdAcquireGpu(&target_and_missed[0]) + 1;
  const uint64_t start = GlobalTimerNs();
  while (LdAcquireGpu(flag) < target) {
    if (GlobalTimerNs() - start > timeout_ns) {
      atomicAdd(&target_and_missed[1], 1u);
      return;
    }
    __nanosleep(256);
  }
}

// Waits ~50 us so the spinner really spins first, then releases the flag.
__global__ void ProbeReleaseKernel(uint32_t* flag, int* sm_ids) {
  if (threadIdx.x != 0) return;
  sm_ids[blockIdx.x] = static_cast<int>(SmId());
  if (blockIdx.x != 0) return;
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < 50000) __nanosleep(1000);
  RedAddReleaseGpu(flag, 1);
}

// After both: the spinner's next target is the flag's current value.
__global__ void ProbeAdvanceKernel(const uint32_t* flag, uint32_t* target_and_missed) {
  target_and_missed[0] = *flag;
}

}  // namespace

cudaError_t RunPartitionProbe(const GreenContextPair& pair, int replays, uint64_t timeout_ns,
                              PartitionProbeResult* result) {
  if (!pair.green) return cudaErrorNotSupported;
  cudaFuncAttributes attributes;
  cudaError_t err;
  // Load all three before anything spins (lazy loading would deadlock the handshake).
  if ((err = cudaFuncGetAttributes(&attributes, ProbeSpinKernel)) != cudaSuccess) return err;
  if ((err = cudaFuncGetAttributes(&attributes, ProbeReleaseKernel)) != cudaSuccess) return err;
  if ((err = cudaFuncGetAttributes(&attributes, ProbeAdvanceKernel)) != cudaSuccess) return err;
  const int compute_ctas = pair.compute_sms;
  const int dispatch_ctas = pair.dispatch_sms;
  uint32_t* words = nullptr;  // [flag, target, missed]
  int* sm_ids = nullptr;
  if ((err = cudaMalloc(&words, 3 * sizeof(uint32_t))) != cudaSuccess) return err;
  if ((err = cudaMalloc(&sm_ids, (compute_ctas + dispatch_ctas) * sizeof(int))) != cudaSuccess) {
    cudaFree(words);
    return err;
  }
  cudaStream_t compute = pair.compute_stream;
  cudaStream_t dispatch = pair.dispatch_stream;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  uint32_t host_words[3] = {0, 0, 0};
  err = cudaMemsetAsync(words, 0, 3 * sizeof(uint32_t), compute);
  if (err == cudaSuccess) err = cudaStreamSynchronize(compute);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal);
  if (err == cudaSuccess) {
    cudaEventRecord(fork, compute);
    cudaStreamWaitEvent(dispatch, fork, 0);
    ProbeSpinKernel<<<compute_ctas, 32, 0, compute>>>(words, words + 1, sm_ids, timeout_ns);
    ProbeReleaseKernel<<<dispatch_ctas, 32, 0, dispatch>>>(words, sm_ids + compute_ctas);
    cudaEventRecord(join, dispatch);
    cudaStreamWaitEvent(compute, join, 0);
    ProbeAdvanceKernel<<<1, 1, 0, compute>>>(words, words + 1);
    err = cudaStreamEndCapture(compute, &graph);
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  for (int i = 0; i < replays && err == cudaSuccess; ++i) err = cudaGraphLaunch(exec, compute);
  if (err == cudaSuccess) err = cudaStreamSynchronize(compute);
  if (err == cudaSuccess) {
    err = cudaMemcpy(host_words, words, sizeof(host_words), cudaMemcpyDeviceToHost);
  }
  if (err == cudaSuccess) {
    std::vector<int> ids(compute_ctas + dispatch_ctas);
    err = cudaMemcpy(ids.data(), sm_ids, ids.size() * sizeof(int), cudaMemcpyDeviceToHost);
    result->compute_sm_ids.assign(ids.begin(), ids.begin() + compute_ctas);
    result->dispatch_sm_ids.assign(ids.begin() + compute_ctas, ids.end());
    result->handshake_completed =
        host_words[2] == 0 && host_words[0] == static_cast<uint32_t>(replays);
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (fork != nullptr) cudaEventDestroy(fork);
  if (join != nullptr) cudaEventDestroy(join);
  cudaFree(sm_ids);
  cudaFree(words);
  return err;
}

}  // namespace gcmoe::kernels
