#include "engine/nccl_comm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>
#include <nccl.h>

namespace gcmoe::engine {
namespace {

// The NCCL entry points the backend uses, resolved once.
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  std::string error;  // non-empty: NCCL is unusable, and why
};

template <typename F>
bool Resolve(void* library, const char* name, F* out, std::string* error) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  if (*out == nullptr && error->empty()) *error = std::string("libnccl has no ") + name;
  return *out != nullptr;
}

const NcclApi& Api() {
  static const NcclApi api = [] {
    NcclApi a;
    // The loader's search path first (LD_LIBRARY_PATH, the system), then the CUDA toolkit's.
    void* library = nullptr;
    for (const char* name : {"libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                             "/usr/local/cuda/lib64/libnccl.so.2"}) {
      library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
    }
    if (library == nullptr) {
      a.error = std::string("cannot load libnccl.so.2 (") + dlerror() + ")";
      return a;
    }
    Resolve(library, "ncclGetVersion", &a.get_version, &a.error);
    Resolve(library, "ncclGetUniqueId", &a.get_unique_id, &a.error);
    Resolve(library, "ncclCommInitRank", &a.comm_init_rank, &a.error);
    Resolve(library, "ncclCommDestroy", &a.comm_destroy, &a.error);
    Resolve(library, "ncclCommAbort", &a.comm_abort, &a.error);
    Resolve(library, "ncclCommGetAsyncError", &a.comm_get_async_error, &a.error);
    Resolve(library, "ncclGetErrorString", &a.get_error_string, &a.error);
    Resolve(library, "ncclGroupStart", &a.group_start, &a.error);
    Resolve(library, "ncclGroupEnd", &a.group_end, &a.error);
    Resolve(library, "ncclSend", &a.send, &a.error);
    Resolve(library, "ncclRecv", &a.recv, &a.error);
    return a;
  }();
  return api;
}

Status NcclError(const std::string& what, ncclResult_t result) {
  return Internal("nccl: " + what + ": " + Api().get_error_string(result));
}

}  // namespace

std::string NcclVersionText() {
  const NcclApi& api = Api();
  if (!api.error.empty()) return api.error;
  int version = 0;
  if (api.get_version(&version) != ncclSuccess) return "NCCL (version unknown)";
  // 2.x: major * 10000 + minor * 100 + patch.
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) +
         "." + std::to_string(version % 100);
}

Result<std::string> NewNcclUniqueId() {
  const NcclApi& api = Api();
  if (!api.error.empty()) return Unavailable("nccl: " + api.error);
  static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);
  ncclUniqueId id;
  if (const ncclResult_t r = api.get_unique_id(&id); r != ncclSuccess) {
    return NcclError("ncclGetUniqueId", r);
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

Result<std::unique_ptr<NcclComm>> NcclComm::Init(const std::string& unique_id, int world,
                                                 int rank, int device) {
  const NcclApi& api = Api();
  if (!api.error.empty()) return Unavailable("nccl: " + api.error);
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return FailedPrecondition("nccl: no unique id for this epoch (got " +
                              std::to_string(unique_id.size()) + " bytes, expected " +
                              std::to_string(sizeof(ncclUniqueId)) +
                              "); the coordinator makes one when engine.exchange is \"nccl\"");
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    return Internal("nccl: cannot select device " + std::to_string(device));
  }
  // NVLink multicast (NVLS) stays off: the baseline needs none of it, and on these machines it
  // must not be used (an operator who sets NCCL_NVLS_ENABLE explicitly is left alone).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  std::unique_ptr<NcclComm> comm(new NcclComm());
  ncclComm_t handle = nullptr;
  if (const ncclResult_t r = api.comm_init_rank(&handle, world, id, rank); r != ncclSuccess) {
    return NcclError("ncclCommInitRank (rank " + std::to_string(rank) + " of " +
                         std::to_string(world) + ")",
                     r);
  }
  comm->comm_ = handle;
  return comm;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  if (aborted_.load()) return;  // ncclCommAbort freed it
  Api().comm_destroy(static_cast<ncclComm_t>(comm_));
}

void NcclComm::Abort() {
  if (comm_ == nullptr || aborted_.exchange(true)) return;
  Api().comm_abort(static_cast<ncclComm_t>(comm_));
}

bool NcclComm::aborted() const { return aborted_.load(); }

Status NcclComm::AsyncError() {
  if (aborted_.load()) return Aborted("nccl: the communicator was aborted");
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = Api().comm_get_async_error(static_cast<ncclComm_t>(comm_), &async);
  if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r);
  return async == ncclSuccess ? Status::Ok() : NcclError("asynchronous error", async);
}

Status NcclComm::AllToAllV(const uint8_t* send, uint8_t* recv, const AllToAllLayout& layout,
                           void* stream) {
  if (aborted_.load()) return Aborted("nccl: the communicator was aborted");
  const NcclApi& api = Api();
  ncclComm_t comm = static_cast<ncclComm_t>(comm_);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ncclResult_t r = api.group_start();
  for (size_t q = 0; q < layout.send_bytes.size() && r == ncclSuccess; ++q) {
    if (layout.send_bytes[q] > 0) {
      r = api.send(send + layout.send_offset[q], static_cast<size_t>(layout.send_bytes[q]),
                   ncclUint8, static_cast<int>(q), comm, s);
    }
    if (r == ncclSuccess && layout.recv_bytes[q] > 0) {
      r = api.recv(recv + layout.recv_offset[q], static_cast<size_t>(layout.recv_bytes[q]),
                   ncclUint8, static_cast<int>(q), comm, s);
    }
  }
  const ncclResult_t end = api.group_end();
  if (r != ncclSuccess) return NcclError("ncclSend/ncclRecv", r);
  if (end != ncclSuccess) return NcclError("ncclGroupEnd", end);
  return Status::Ok();
}

}  // namespace gcmoe::engine
