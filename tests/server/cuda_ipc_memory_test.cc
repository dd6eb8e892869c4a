// Registered GPU memory (RegisterMemory's cuda_ipc) against a real `gcmoe serve` on the CUDA
// backend: this test process allocates device memory, exports it with cudaIpcGetMemHandle as a
// co-located frontend would, and the service's rank process opens it. The same requests with
// hidden and output in that memory give the bytes the inline calls give; every bad registration
// and reference gets its code and a message naming the field, values the service refuses are
// found on the GPU, and the service keeps serving; a registration dropped while calls use it
// lets them finish; calls with GPU memory merged into one step with others get their own bytes
// and errors. Skips without a GPU.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

using gcmoe::v1::ForwardRequest;
using gcmoe::v1::ForwardResponse;

bool HasGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}
constexpr char kNoGpu[] = "no CUDA device on this machine (GPU test skipped)";

// A device allocation of this process, exported for the service.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0, bytes), cudaSuccess);
    cudaIpcMemHandle_t handle;
    EXPECT_EQ(cudaIpcGetMemHandle(&handle, data_), cudaSuccess);
    handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  ~DeviceBuffer() { cudaFree(data_); }

  const std::string& handle() const { return handle_; }
  size_t bytes() const { return bytes_; }
  void Write(size_t offset, const std::string& data) {
    ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(data_) + offset, data.data(), data.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::string Read(size_t offset, size_t size) const {
    std::string data(size, '\0');
    EXPECT_EQ(cudaMemcpy(data.data(), static_cast<const uint8_t*>(data_) + offset, size,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return data;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
  std::string handle_;
};

grpc::Status RegisterGpu(const std::string& address, const std::string& name,
                         const std::string& handle, int device, uint64_t offset, uint64_t bytes) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  gcmoe::v1::RegisterMemoryRequest request;
  request.set_name(name);
  request.mutable_cuda_ipc()->set_ipc_handle(handle);
  request.mutable_cuda_ipc()->set_device_id(device);
  request.mutable_cuda_ipc()->set_offset(offset);
  request.mutable_cuda_ipc()->set_byte_size(bytes);
  gcmoe::v1::RegisterMemoryResponse response;
  return stub->RegisterMemory(&context, request, &response);
}

grpc::Status Forward(const std::string& address, const ForwardRequest& request,
                     ForwardResponse* response) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return stub->Forward(&context, request, response);
}

size_t OutputBytes(const ForwardRequest& request) {
  return static_cast<size_t>(request.hidden().shape(0)) * request.hidden().shape(1) *
         (request.output_dtype() == gcmoe::v1::FP32 ? 4 : 2);
}

// `request` with hidden at `hidden_at` and the output at `output_at` of registration `name`
// (either skipped when negative), after writing hidden there.
ForwardRequest OnDevice(ForwardRequest request, DeviceBuffer* buffer, uint64_t registered_at,
                        const std::string& name, int64_t hidden_at, int64_t output_at) {
  if (hidden_at >= 0) {
    buffer->Write(registered_at + hidden_at, request.hidden().data());
    const size_t size = request.hidden().data().size();
    request.mutable_hidden()->clear_data();
    gcmoe::v1::TensorRegion* region = request.mutable_hidden()->mutable_region();
    region->set_region(name);
    region->set_offset(static_cast<uint64_t>(hidden_at));
    region->set_byte_size(size);
  }
  if (output_at >= 0) {
    gcmoe::v1::TensorRegion* region = request.mutable_output_region();
    region->set_region(name);
    region->set_offset(static_cast<uint64_t>(output_at));
    region->set_byte_size(OutputBytes(request));
  }
  return request;
}

std::vector<std::string> CudaService() {
  return {"--set", "engine.backend=cuda",
          "--set", "parallel.ranks=1",
          "--set", "server.allow_registered_memory=true"};
}

constexpr uint64_t kRegisteredAt = 512;  // the registration starts inside the allocation
constexpr int64_t kOutputAt = 2 << 20;   // outputs from 2 MiB into the registration

TEST(CudaIpcMemoryTest, DeviceAndInlineOutputsAreByteIdentical) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  auto service = StartServe(CudaService(), "ipc_same", milliseconds(120000));
  ASSERT_TRUE(service);
  const std::string& address = service->address;
  DeviceBuffer buffer(4 << 20);
  ASSERT_TRUE(
      RegisterGpu(address, "gpu", buffer.handle(), 0, kRegisteredAt, buffer.bytes() - kRegisteredAt)
          .ok())
      << service->process->Log();
  {
    auto stub = Connect(address);
    grpc::ClientContext context;
    gcmoe::v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&context, gcmoe::v1::GetModelInfoRequest(), &info).ok());
    EXPECT_NE(std::find(info.memory_kinds().begin(), info.memory_kinds().end(), "cuda_ipc"),
              info.memory_kinds().end());
  }
  const engine::ModelSpec spec = DefaultModel();
  int n = 0;
  for (const int tokens : {1, 7, 33, 64}) {
    for (const auto dtype : {gcmoe::v1::BF16, gcmoe::v1::FP32}) {
      for (const auto output_dtype : {gcmoe::v1::BF16, gcmoe::v1::FP32}) {
        RequestSpec rs;
        rs.num_tokens = tokens;
        rs.dtype = dtype;
        rs.output_dtype = output_dtype;
        rs.layer = n % spec.num_layers;
        rs.unused_every = n % 3 == 0 ? 3 : 0;
        rs.seed = 40 + n++;
        const ForwardRequest request = MakeForwardRequest(spec, rs);
        ForwardResponse inline_response;
        ASSERT_TRUE(Forward(address, request, &inline_response).ok());
        const std::string& reference = inline_response.output().data();
        ASSERT_EQ(reference.size(), OutputBytes(request));
        SCOPED_TRACE("T " + std::to_string(tokens) + " seed " + std::to_string(rs.seed));
        // Hidden and output on the GPU; each alone.
        const int64_t hidden_at = 4096 * (n % 5);
        for (const auto& [hidden_on_gpu, output_on_gpu] :
             {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
          ForwardResponse response;
          const ForwardRequest device_request =
              OnDevice(request, &buffer, kRegisteredAt, "gpu", hidden_on_gpu ? hidden_at : -1,
                       output_on_gpu ? kOutputAt : -1);
          const grpc::Status status = Forward(address, device_request, &response);
          ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << service->process->Log();
          EXPECT_EQ(response.output().dtype(), output_dtype);
          ASSERT_EQ(response.output().shape_size(), 2);
          EXPECT_EQ(response.output().shape(0), tokens);
          const std::string got = output_on_gpu
                                      ? buffer.Read(kRegisteredAt + kOutputAt, reference.size())
                                      : response.output().data();
          if (output_on_gpu) {
            EXPECT_TRUE(response.output().data().empty());
          }
          EXPECT_TRUE(got == reference)
              << "hidden on GPU " << hidden_on_gpu << ", output on GPU " << output_on_gpu;
          buffer.Write(kRegisteredAt + kOutputAt, std::string(reference.size(), '\x7f'));
        }
      }
    }
  }
  EXPECT_TRUE(Unregister(address, "gpu").ok());
}

TEST(CudaIpcMemoryTest, BadRegistrationsAndReferencesGetTheirCodesAndTheServiceKeepsServing) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  auto service = StartServe(CudaService(), "ipc_bad", milliseconds(120000));
  ASSERT_TRUE(service);
  const std::string& address = service->address;
  DeviceBuffer buffer(4 << 20);
  const uint64_t size = buffer.bytes() - kRegisteredAt;

  // Registrations the ranks cannot open, or that do not fit what they open.
  EXPECT_STATUS(RegisterGpu(address, "short", buffer.handle().substr(0, 10), 0, 0, 4096),
                grpc::StatusCode::INVALID_ARGUMENT, "cuda_ipc.ipc_handle: 10 bytes");
  EXPECT_STATUS(
      RegisterGpu(address, "garbage", std::string(buffer.handle().size(), '\x5a'), 0, 0, 4096),
      grpc::StatusCode::INVALID_ARGUMENT, "cuda_ipc.ipc_handle: does not open");
  EXPECT_STATUS(RegisterGpu(address, "device", buffer.handle(), 7, 0, 4096),
                grpc::StatusCode::INVALID_ARGUMENT, "cuda_ipc.device_id: 7");
  EXPECT_STATUS(RegisterGpu(address, "big", buffer.handle(), 0, kRegisteredAt, size + 1),
                grpc::StatusCode::INVALID_ARGUMENT, "outside the exported allocation");
  EXPECT_STATUS(RegisterGpu(address, "zero", buffer.handle(), 0, 0, 0),
                grpc::StatusCode::INVALID_ARGUMENT, "cuda_ipc.byte_size: 0");
  ASSERT_TRUE(RegisterGpu(address, "gpu", buffer.handle(), 0, kRegisteredAt, size).ok());
  EXPECT_STATUS(RegisterGpu(address, "gpu", buffer.handle(), 0, kRegisteredAt, size),
                grpc::StatusCode::ALREADY_EXISTS, "name: \"gpu\" is already registered");

  const engine::ModelSpec spec = DefaultModel();
  RequestSpec rs;
  rs.num_tokens = 9;
  rs.dtype = gcmoe::v1::BF16;
  rs.output_dtype = gcmoe::v1::BF16;
  const ForwardRequest request = MakeForwardRequest(spec, rs);
  ForwardResponse reference;
  ASSERT_TRUE(Forward(address, request, &reference).ok());
  // After every refusal the same call on the GPU still gives the inline bytes.
  auto still_serving = [&](const std::string& after) {
    ForwardResponse response;
    const grpc::Status status =
        Forward(address, OnDevice(request, &buffer, kRegisteredAt, "gpu", 0, kOutputAt), &response);
    ASSERT_TRUE(status.ok()) << after << ": " << status.error_message();
    EXPECT_TRUE(buffer.Read(kRegisteredAt + kOutputAt, reference.output().data().size()) ==
                reference.output().data())
        << after;
  };
  still_serving("registration errors");

  const size_t hidden_bytes = request.hidden().data().size();
  struct Case {
    const char* what;
    ForwardRequest request;
    grpc::StatusCode code;
    std::string text;
  };
  std::vector<Case> cases;
  {
    ForwardRequest r = OnDevice(request, &buffer, kRegisteredAt, "gpu", 0, -1);
    r.mutable_hidden()->mutable_region()->set_offset(size - hidden_bytes + 2);
    cases.push_back({"hidden beyond the registration", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "hidden.region: bytes ["});
  }
  {
    ForwardRequest r = OnDevice(request, &buffer, kRegisteredAt, "gpu", 0, -1);
    r.mutable_hidden()->mutable_region()->set_byte_size(hidden_bytes - 2);
    cases.push_back({"hidden of the wrong size", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "hidden.region.byte_size"});
  }
  {
    ForwardRequest r = OnDevice(request, &buffer, kRegisteredAt, "gpu", -1, kOutputAt);
    r.mutable_output_region()->set_byte_size(OutputBytes(request) + 2);
    cases.push_back({"output of the wrong size", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "output_region.byte_size"});
  }
  {
    ForwardRequest r = request;
    r.mutable_topk_ids()->clear_data();
    r.mutable_topk_ids()->mutable_region()->set_region("gpu");
    r.mutable_topk_ids()->mutable_region()->set_byte_size(request.topk_ids().data().size());
    cases.push_back({"routing on the GPU", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "topk_ids.region: \"gpu\" is GPU memory"});
  }
  {
    RequestSpec fp8 = rs;
    fp8.dtype = gcmoe::v1::FP8_E4M3;
    ForwardRequest r =
        OnDevice(MakeForwardRequest(spec, fp8), &buffer, kRegisteredAt, "gpu", 0, -1);
    cases.push_back({"FP8 activations on the GPU", r, grpc::StatusCode::INVALID_ARGUMENT,
                     "hidden.dtype: FP8_E4M3 in GPU memory"});
  }
  {
    ForwardRequest r = OnDevice(request, &buffer, kRegisteredAt, "nope", -1, kOutputAt);
    cases.push_back({"an unknown name", r, grpc::StatusCode::NOT_FOUND,
                     "output_region: \"nope\" is not a registered region"});
  }
  for (const Case& c : cases) {
    ForwardResponse response;
    EXPECT_STATUS(Forward(address, c.request, &response), c.code, c.text);
    still_serving(c.what);
  }

  // Values the service refuses, found on the GPU: the rows and columns are the call's.
  const int H = spec.hidden;
  for (const auto& [value, text] :
       {std::pair{std::numeric_limits<float>::quiet_NaN(), std::string("is NaN")},
        std::pair{std::numeric_limits<float>::infinity(), std::string("is Inf")},
        std::pair{8589934592.0f, std::string("is 8.58993e+09, expected a magnitude of at most "
                                             "2^32")}}) {
    ForwardRequest bad = request;
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint16_t bf16 = static_cast<uint16_t>(bits >> 16);
    std::memcpy(bad.mutable_hidden()->mutable_data()->data() + 2 * (5 * H + 17), &bf16, 2);
    ForwardResponse response;
    EXPECT_STATUS(
        Forward(address, OnDevice(bad, &buffer, kRegisteredAt, "gpu", 0, kOutputAt), &response),
        grpc::StatusCode::INVALID_ARGUMENT, "hidden: element [5, 17] " + text);
    still_serving("a bad activation on the GPU: " + text);
  }

  // Unregistered: NOT_FOUND, and the name can be registered again.
  ASSERT_TRUE(Unregister(address, "gpu").ok());
  {
    ForwardResponse response;
    EXPECT_STATUS(
        Forward(address, OnDevice(request, &buffer, kRegisteredAt, "gpu", 0, kOutputAt), &response),
        grpc::StatusCode::NOT_FOUND, "hidden.region: \"gpu\" is not a registered region");
  }
  ASSERT_TRUE(RegisterGpu(address, "gpu", buffer.handle(), 0, kRegisteredAt, size).ok());
  still_serving("registering again");

  // Dropped while calls use it: each call finishes (OK with the right bytes) or finds the name
  // gone (NOT_FOUND); nothing else, and the service serves on.
  std::atomic<int> ok{0};
  std::atomic<int> not_found{0};
  std::atomic<int> other{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      const int64_t hidden_at = (c + 1) << 16;
      const int64_t output_at = kOutputAt + (c << 16);
      const ForwardRequest r =
          OnDevice(request, &buffer, kRegisteredAt, "gpu", hidden_at, output_at);
      for (int i = 0; i < 40; ++i) {
        ForwardResponse response;
        const grpc::Status status = Forward(address, r, &response);
        if (status.ok() &&
            buffer.Read(kRegisteredAt + output_at, reference.output().data().size()) ==
                reference.output().data()) {
          ++ok;
        } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
          ++not_found;
        } else {
          ++other;
        }
      }
    });
  }
  // Some calls have completed from it: the others are in flight or yet to come.
  while (ok.load() + other.load() < 8) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(Unregister(address, "gpu").ok());
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(not_found.load(), 0);
  EXPECT_EQ(ok.load() + not_found.load(), 160);
  ASSERT_TRUE(RegisterGpu(address, "gpu", buffer.handle(), 0, kRegisteredAt, size).ok());
  still_serving("unregistering while calls used it");
  EXPECT_NE(service->process->Log().find("closed on the ranks"), std::string::npos);
}

TEST(CudaIpcMemoryTest, ARestartedRankOpensTheRegistrationsAgain) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  auto service = StartServe(CudaService(), "ipc_restart", milliseconds(120000));
  ASSERT_TRUE(service);
  const std::string& address = service->address;
  DeviceBuffer buffer(1 << 20);
  ASSERT_TRUE(RegisterGpu(address, "gpu", buffer.handle(), 0, 0, buffer.bytes()).ok());
  RequestSpec rs;
  rs.num_tokens = 5;
  rs.dtype = gcmoe::v1::FP32;
  const ForwardRequest request = MakeForwardRequest(DefaultModel(), rs);
  ForwardResponse reference;
  ASSERT_TRUE(Forward(address, request, &reference).ok());
  const ForwardRequest on_gpu = OnDevice(request, &buffer, 0, "gpu", 0, 1 << 19);

  // The serve supervisor restarts a killed rank; its Setup lists the registration.
  const std::optional<long> pid = NumberAfter(service->process->Log(), "started rank 0 (pid ");
  ASSERT_TRUE(pid.has_value()) << service->process->Log();
  ASSERT_EQ(kill(static_cast<pid_t>(*pid), SIGKILL), 0);
  ASSERT_TRUE(WaitForHealth(address, "NOT_SERVING", milliseconds(5000)));
  ASSERT_TRUE(WaitForHealth(address, "SERVING", milliseconds(60000))) << service->process->Log();
  ForwardResponse response;
  const grpc::Status status = Forward(address, on_gpu, &response);
  ASSERT_TRUE(status.ok()) << status.error_message() << "\n" << service->process->Log();
  EXPECT_TRUE(buffer.Read(1 << 19, reference.output().data().size()) == reference.output().data());
  // Opened by the first rank and again by its successor.
  const std::string log = service->process->Log();
  int opened = 0;
  for (size_t at = log.find("opened registered GPU memory 1 "); at != std::string::npos;
       at = log.find("opened registered GPU memory 1 ", at + 1)) {
    ++opened;
  }
  EXPECT_EQ(opened, 2) << log;
}

// Calls with GPU memory share steps with each other and with inline calls: each caller gets the
// bytes its call gets alone, and a bad value on the GPU fails only its own call.
TEST(CudaIpcMemoryTest, MergedCallsGetTheirOwnBytesAndFailAlone) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  std::vector<std::string> flags = CudaService();
  // A step waits (up to 1 s) until four calls are pending: the four calls below share one.
  for (const char* set : {"server.batch_window_us=1000000", "server.max_batch_calls=4"}) {
    flags.push_back("--set");
    flags.push_back(set);
  }
  auto service = StartServe(flags, "ipc_merged", milliseconds(120000));
  ASSERT_TRUE(service);
  const std::string& address = service->address;
  DeviceBuffer buffer(4 << 20);
  ASSERT_TRUE(RegisterGpu(address, "gpu", buffer.handle(), 0, 0, buffer.bytes()).ok());
  const engine::ModelSpec spec = DefaultModel();
  const int H = spec.hidden;
  // Hidden and output on the GPU; inline; hidden on the GPU only; output on the GPU only.
  constexpr int kCalls = 4;
  const int tokens[kCalls] = {7, 5, 33, 3};
  const int64_t hidden_at[kCalls] = {0, -1, 1 << 18, -1};
  const int64_t output_at[kCalls] = {1 << 20, -1, -1, (1 << 20) + (1 << 18)};
  std::vector<ForwardRequest> requests;
  std::vector<std::string> references;
  for (int i = 0; i < kCalls; ++i) {
    RequestSpec rs;
    rs.num_tokens = tokens[i];
    rs.dtype = gcmoe::v1::BF16;
    rs.output_dtype = gcmoe::v1::BF16;
    rs.unused_every = i == 2 ? 3 : 0;
    rs.seed = 70 + i;
    requests.push_back(MakeForwardRequest(spec, rs));
    ForwardResponse alone;  // (waits out the window: no other call comes)
    ASSERT_TRUE(Forward(address, requests.back(), &alone).ok());
    EXPECT_EQ(alone.stats().batched_calls(), 1u);
    references.push_back(alone.output().data());
  }
  // Round 0 clean; in round 1 call 2's activations hold a NaN at [2, 5].
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<ForwardRequest> sent;
    for (int i = 0; i < kCalls; ++i) {
      ForwardRequest r = requests[i];
      if (round == 1 && i == 2) {
        const uint16_t nan_bf16 = 0x7fc0;
        std::memcpy(r.mutable_hidden()->mutable_data()->data() + 2 * (2 * H + 5), &nan_bf16, 2);
      }
      sent.push_back(OnDevice(r, &buffer, 0, "gpu", hidden_at[i], output_at[i]));
      if (output_at[i] >= 0) {
        buffer.Write(output_at[i], std::string(references[i].size(), '\x7f'));
      }
    }
    ForwardResponse responses[kCalls];
    grpc::Status statuses[kCalls];
    ForwardInOrder(address, kCalls, sent.data(), responses, statuses, milliseconds(50));
    for (int i = 0; i < kCalls; ++i) {
      SCOPED_TRACE("call " + std::to_string(i));
      if (round == 1 && i == 2) {
        EXPECT_STATUS(statuses[i], grpc::StatusCode::INVALID_ARGUMENT,
                      "hidden: element [2, 5] is NaN");
        continue;
      }
      ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message() << "\n"
                                    << service->process->Log();
      EXPECT_EQ(responses[i].stats().batched_calls(), static_cast<uint32_t>(kCalls));
      const std::string got = output_at[i] >= 0 ? buffer.Read(output_at[i], references[i].size())
                                                : responses[i].output().data();
      EXPECT_TRUE(got == references[i]);
    }
  }
  EXPECT_TRUE(Unregister(address, "gpu").ok());
}

}  // namespace
}  // namespace gcmoe::server::testing
