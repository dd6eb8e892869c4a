#include "kernels/green_context.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "kernels/driver_entry.h"

namespace gcmoe::kernels {
namespace {

struct DriverApi {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetDevResource_v12040 device_get_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create = nullptr;
  PFN_cuGreenCtxGetDevResource_v12040 green_ctx_get_resource = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 green_stream_create = nullptr;
};

// Empty string when every entry point resolved; else the first missing one.
std::string ResolveAll(DriverApi* api) {
  if (!ResolveDriverEntry("cuDeviceGet", 2000, &api->device_get)) return "cuDeviceGet";
  if (!ResolveDriverEntry("cuDeviceGetDevResource", 12040, &api->device_get_resource)) {
    return "cuDeviceGetDevResource";
  }
  if (!ResolveDriverEntry("cuDevSmResourceSplitByCount", 12040, &api->split_by_count)) {
    return "cuDevSmResourceSplitByCount";
  }
  if (!ResolveDriverEntry("cuDevResourceGenerateDesc", 12040, &api->generate_desc)) {
    return "cuDevResourceGenerateDesc";
  }
  if (!ResolveDriverEntry("cuGreenCtxCreate", 12040, &api->green_ctx_create)) {
    return "cuGreenCtxCreate";
  }
  if (!ResolveDriverEntry("cuGreenCtxGetDevResource", 12040, &api->green_ctx_get_resource)) {
    return "cuGreenCtxGetDevResource";
  }
  if (!ResolveDriverEntry("cuGreenCtxStreamCreate", 12050, &api->green_stream_create)) {
    return "cuGreenCtxStreamCreate";
  }
  return "";
}

std::string DriverError(const char* call, CUresult result) {
  return std::string(call) + " failed with CUresult " + std::to_string(static_cast<int>(result));
}

// A single ordinary stream for both roles (the fallback).
cudaError_t MakeFallback(GreenContextPair* pair, std::string reason) {
  pair->green = false;
  pair->fallback_reason = std::move(reason);
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, pair->device);
  if (err != cudaSuccess) return err;
  pair->total_sms = prop.multiProcessorCount;
  pair->compute_sms = prop.multiProcessorCount;
  pair->dispatch_sms = 0;
  err = cudaStreamCreateWithFlags(&pair->compute_stream, cudaStreamNonBlocking);
  pair->dispatch_stream = pair->compute_stream;
  return err;
}

cudaError_t Create(int device, int request, GreenContextPair* pair, std::string* error) {
  pair->device = device;
  pair->requested_dispatch_sms = request;
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaFree(nullptr);  // the primary context, before any green one
  if (err != cudaSuccess) {
    *error = std::string("initializing device ") + std::to_string(device) + ": " +
             cudaGetErrorString(err);
    return err;
  }
  // A request of 0 asks for no split: one ordinary context, roles in sequence (the "overlap
  // off" configuration the ablation measures against).
  if (request == 0) return MakeFallback(pair, "dispatch request 0: one context, no overlap");
  DriverApi api;
  const std::string missing = ResolveAll(&api);
  if (!missing.empty()) {
    return MakeFallback(pair, "the driver has no " + missing + " (green contexts need 12.4+)");
  }
  CUdevice dev;
  CUresult r = api.device_get(&dev, device);
  CUdevResource all{};
  if (r == CUDA_SUCCESS) r = api.device_get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
  if (r == CUDA_ERROR_NOT_SUPPORTED) return MakeFallback(pair, "SM resources not supported");
  if (r != CUDA_SUCCESS) {
    *error = DriverError("cuDeviceGetDevResource", r);
    return cudaErrorUnknown;
  }
  pair->total_sms = static_cast<int>(all.sm.smCount);
  pair->min_partition_sms = static_cast<int>(all.sm.minSmPartitionSize);
  pair->alignment_sms = static_cast<int>(all.sm.smCoscheduledAlignment);
  const int alignment = pair->alignment_sms > 0 ? pair->alignment_sms : 1;
  if (request < 1 || request >= pair->total_sms) {
    *error = "dispatch SM request " + std::to_string(request) + " is outside 1.." +
             std::to_string(pair->total_sms - 1);
    return cudaErrorInvalidValue;
  }
  const int compute_target = (pair->total_sms - request) / alignment * alignment;
  if (compute_target < 32 || compute_target < pair->min_partition_sms) {
    *error = "dispatch SM request " + std::to_string(request) + " leaves " +
             std::to_string(compute_target) + " compute SMs (at least 32 needed)";
    return cudaErrorInvalidValue;
  }
  CUdevResource compute{};
  CUdevResource rest{};
  unsigned int groups = 1;
  r = api.split_by_count(&compute, &groups, &all, &rest, 0, static_cast<unsigned>(compute_target));
  if (r != CUDA_SUCCESS || groups != 1) {
    *error = r != CUDA_SUCCESS ? DriverError("cuDevSmResourceSplitByCount", r)
                               : "cuDevSmResourceSplitByCount made no group";
    return cudaErrorUnknown;
  }
  pair->compute_sms = static_cast<int>(compute.sm.smCount);
  pair->dispatch_sms = static_cast<int>(rest.sm.smCount);
  if (pair->compute_sms + pair->dispatch_sms != pair->total_sms || pair->dispatch_sms < 1 ||
      pair->compute_sms < 32) {
    *error = "green-context split gave " + std::to_string(pair->compute_sms) + " compute + " +
             std::to_string(pair->dispatch_sms) + " dispatch SMs of " +
             std::to_string(pair->total_sms);
    return cudaErrorUnknown;
  }
  CUdevResource* parts[2] = {&compute, &rest};
  cudaStream_t* streams[2] = {&pair->compute_stream, &pair->dispatch_stream};
  const int expected[2] = {pair->compute_sms, pair->dispatch_sms};
  for (int i = 0; i < 2; ++i) {
    CUdevResourceDesc desc;
    CUgreenCtx ctx;
    CUstream stream;
    r = api.generate_desc(&desc, parts[i], 1);
    if (r == CUDA_SUCCESS) r = api.green_ctx_create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    if (r == CUDA_ERROR_NOT_SUPPORTED) return MakeFallback(pair, "cuGreenCtxCreate: not supported");
    if (r == CUDA_SUCCESS) r = api.green_stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, 0);
    CUdevResource readback{};
    if (r == CUDA_SUCCESS) r = api.green_ctx_get_resource(ctx, &readback, CU_DEV_RESOURCE_TYPE_SM);
    if (r != CUDA_SUCCESS) {
      *error = DriverError(
          i == 0 ? "creating the compute green context" : "creating the dispatch green context", r);
      return cudaErrorUnknown;
    }
    if (static_cast<int>(readback.sm.smCount) != expected[i]) {
      *error = "green context " + std::to_string(i) + " reads back " +
               std::to_string(readback.sm.smCount) + " SMs, expected " +
               std::to_string(expected[i]);
      return cudaErrorUnknown;
    }
    *streams[i] = reinterpret_cast<cudaStream_t>(stream);
  }
  pair->green = true;
  return cudaSuccess;
}

}  // namespace

cudaError_t GetGreenContextPair(int device, int dispatch_sms_request, const GreenContextPair** pair,
                                std::string* error) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::unique_ptr<GreenContextPair>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{device, dispatch_sms_request}];
  if (slot == nullptr) {
    auto created = std::make_unique<GreenContextPair>();
    const cudaError_t err = Create(device, dispatch_sms_request, created.get(), error);
    if (err != cudaSuccess) {
      cache.erase({device, dispatch_sms_request});
      return err;
    }
    slot = std::move(created);
  }
  *pair = slot.get();
  return cudaSuccess;
}

}  // namespace gcmoe::kernels
