#include "tools/bench_registered_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#if GCMOE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "client/channel.h"

namespace gcmoe::tools {
namespace {

size_t Aligned(size_t n) { return (n + 63) / 64 * 64; }

size_t InputBytes(const gcmoe::v1::ForwardRequest& r) {
  return Aligned(r.hidden().data().size()) + Aligned(r.hidden_scales().data().size()) +
         Aligned(r.topk_ids().data().size()) + Aligned(r.topk_weights().data().size());
}

// `t` names its bytes, just written at `offset` of `region`, instead of carrying them; returns
// where the next tensor goes.
size_t MoveToRegion(gcmoe::v1::Tensor* t, const std::string& region, size_t offset) {
  t->mutable_region()->set_region(region);
  t->mutable_region()->set_offset(offset);
  t->mutable_region()->set_byte_size(t->data().size());
  offset += Aligned(t->data().size());
  t->clear_data();
  return offset;
}

Status Registered(const grpc::Status& status) {
  if (status.ok()) return Status::Ok();
  return Unavailable("RegisterMemory: " + client::GrpcCodeName(status.error_code()) + ": " +
                     status.error_message());
}

}  // namespace

// GPU memory: the activations of every request, then one output area per caller, in one
// allocation of device 0 registered as cuda_ipc; the routing stays inline.
Result<std::unique_ptr<RegisteredBuffers>> CreateOnGpu(
    std::unique_ptr<RegisteredBuffers> b, const std::vector<gcmoe::v1::ForwardRequest>& requests,
    int callers, int64_t output_bytes) {
#if GCMOE_HAVE_CUDA
  size_t inputs = 0;
  for (const auto& r : requests) inputs += Aligned(r.hidden().data().size());
  b->bytes_ = inputs + static_cast<size_t>(callers) * Aligned(static_cast<size_t>(output_bytes));
  void* base = nullptr;
  cudaError_t err = cudaSetDevice(0);
  if (err == cudaSuccess) err = cudaMalloc(&base, b->bytes_);
  if (err != cudaSuccess) {
    return Unavailable(std::string("allocating GPU memory: ") + cudaGetErrorString(err));
  }
  b->data_ = static_cast<uint8_t*>(base);
  size_t offset = 0;
  std::vector<gcmoe::v1::ForwardRequest> in_region;
  for (const auto& r : requests) {
    if (r.hidden().dtype() != gcmoe::v1::BF16 && r.hidden().dtype() != gcmoe::v1::FP32) {
      return InvalidArgument("GPU memory takes BF16 or FP32 activations (--dtype bf16|fp32)");
    }
    gcmoe::v1::ForwardRequest moved = r;
    gcmoe::v1::Tensor* t = moved.mutable_hidden();
    err = cudaMemcpy(b->data_ + offset, t->data().data(), t->data().size(), cudaMemcpyHostToDevice);
    if (err != cudaSuccess) {
      return Unavailable(std::string("writing GPU memory: ") + cudaGetErrorString(err));
    }
    offset = MoveToRegion(t, b->name_, offset);
    in_region.push_back(std::move(moved));
  }
  b->AddCallers(in_region, callers, output_bytes, offset);
  cudaIpcMemHandle_t handle;
  err = cudaIpcGetMemHandle(&handle, base);
  if (err != cudaSuccess) {
    return Unavailable(std::string("exporting GPU memory: ") + cudaGetErrorString(err));
  }
  grpc::ClientContext context;
  context.set_deadline(client::DeadlineIn(b->timeout_ms_));
  gcmoe::v1::RegisterMemoryRequest request;
  request.set_name(b->name_);
  request.mutable_cuda_ipc()->set_ipc_handle(
      std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  request.mutable_cuda_ipc()->set_device_id(0);
  request.mutable_cuda_ipc()->set_byte_size(b->bytes_);
  gcmoe::v1::RegisterMemoryResponse response;
  GCMOE_RETURN_IF_ERROR(Registered(b->stub_->RegisterMemory(&context, request, &response)));
  b->registered_ = true;
  return b;
#else
  (void)b, (void)requests, (void)callers, (void)output_bytes;
  return Unimplemented("GPU memory: this gcmoe was built without CUDA");
#endif
}

Result<std::unique_ptr<RegisteredBuffers>> RegisteredBuffers::Create(
    gcmoe::v1::MoeService::Stub* stub, const std::vector<gcmoe::v1::ForwardRequest>& requests,
    int callers, int64_t output_bytes, int timeout_ms, Memory memory) {
  std::unique_ptr<RegisteredBuffers> b(new RegisteredBuffers());
  b->memory_ = memory;
  b->stub_ = stub;
  b->timeout_ms_ = timeout_ms;
  b->variants_ = requests.size();
  b->name_ = "bench-" + std::to_string(getpid());
  if (memory == Memory::kGpu) return CreateOnGpu(std::move(b), requests, callers, output_bytes);
  // Not "/gcmoe-...": the service refuses its own prefix.
  const std::string key = "/gcmoe_bench-" + std::to_string(getpid());
  size_t inputs = 0;
  for (const auto& r : requests) inputs += InputBytes(r);
  b->bytes_ = inputs + static_cast<size_t>(callers) * Aligned(static_cast<size_t>(output_bytes));
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Unavailable("creating " + key + ": " + std::strerror(errno));
  b->key_ = key;  // ours from here on: removed by the destructor
  if (ftruncate(fd, static_cast<off_t>(b->bytes_)) != 0) {
    close(fd);
    return Unavailable("sizing " + key + ": " + std::strerror(errno));
  }
  void* base = mmap(nullptr, b->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Unavailable("mapping " + key + ": " + std::strerror(errno));
  b->data_ = static_cast<uint8_t*>(base);

  // Inputs once per request, then one output area per caller.
  size_t offset = 0;
  std::vector<gcmoe::v1::ForwardRequest> in_region;
  for (const auto& r : requests) {
    gcmoe::v1::ForwardRequest moved = r;
    for (gcmoe::v1::Tensor* t : {moved.mutable_hidden(), moved.mutable_hidden_scales(),
                                 moved.mutable_topk_ids(), moved.mutable_topk_weights()}) {
      if (t->data().empty()) continue;
      std::memcpy(b->data_ + offset, t->data().data(), t->data().size());
      offset = MoveToRegion(t, b->name_, offset);
    }
    in_region.push_back(std::move(moved));
  }
  b->AddCallers(in_region, callers, output_bytes, offset);

  grpc::ClientContext context;
  context.set_deadline(client::DeadlineIn(timeout_ms));
  gcmoe::v1::RegisterMemoryRequest request;
  request.set_name(b->name_);
  request.mutable_posix_shm()->set_key(b->key_);
  request.mutable_posix_shm()->set_byte_size(b->bytes_);
  gcmoe::v1::RegisterMemoryResponse response;
  GCMOE_RETURN_IF_ERROR(Registered(stub->RegisterMemory(&context, request, &response)));
  b->registered_ = true;
  return b;
}

void RegisteredBuffers::AddCallers(const std::vector<gcmoe::v1::ForwardRequest>& in_region,
                                   int callers, int64_t output_bytes, size_t offset) {
  for (int c = 0; c < callers; ++c) {
    for (const auto& r : in_region) {
      gcmoe::v1::ForwardRequest with_output = r;
      with_output.mutable_output_region()->set_region(name_);
      with_output.mutable_output_region()->set_offset(offset);
      with_output.mutable_output_region()->set_byte_size(static_cast<uint64_t>(output_bytes));
      requests_.push_back(std::move(with_output));
    }
    offset += Aligned(static_cast<size_t>(output_bytes));
  }
}

RegisteredBuffers::~RegisteredBuffers() {
  if (registered_) {
    grpc::ClientContext context;
    context.set_deadline(client::DeadlineIn(timeout_ms_));
    gcmoe::v1::UnregisterMemoryRequest request;
    request.set_name(name_);
    gcmoe::v1::UnregisterMemoryResponse response;
    stub_->UnregisterMemory(&context, request, &response);
  }
#if GCMOE_HAVE_CUDA
  if (memory_ == Memory::kGpu) {
    if (data_ != nullptr) cudaFree(data_);
    return;
  }
#endif
  if (data_ != nullptr) munmap(data_, bytes_);
  if (!key_.empty()) shm_unlink(key_.c_str());
}

}  // namespace gcmoe::tools
