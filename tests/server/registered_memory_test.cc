// Registered memory (RegisterMemory, Tensor.region, ForwardRequest.output_region) against real
// `gcmoe serve` processes: the same requests with their tensors inline and in registered POSIX
// shared memory give byte-identical outputs, alone, on a ForwardStream and merged with concurrent
// calls, with ranks on shared memory and inline; every bad reference gets its code and a message
// naming the field, and the service keeps serving correct outputs after each; a registration
// dropped while a call uses it lets that call complete from the still-mapped memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

using gcmoe::v1::ForwardRequest;
using gcmoe::v1::ForwardResponse;

// A POSIX shared-memory object the test creates, maps and removes, as a frontend would.
class TestShm {
 public:
  TestShm(const std::string& name, size_t bytes)
      : key_("/gcmoe_test-" + name + "-" + std::to_string(getpid())), bytes_(bytes) {
    shm_unlink(key_.c_str());
    const int fd = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << key_ << ": " << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(base, MAP_FAILED);
    data_ = static_cast<uint8_t*>(base);
    fd_ = fd;
  }
  ~TestShm() {
    munmap(data_, bytes_);
    close(fd_);
    shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int fd() const { return fd_; }

 private:
  std::string key_;
  size_t bytes_;
  uint8_t* data_ = nullptr;
  int fd_ = -1;
};

// Hands out 64-byte-aligned ranges of the registration `name`, which starts `base` bytes into
// a TestShm.
class RegionWriter {
 public:
  RegionWriter(TestShm* shm, std::string name, size_t base = 0)
      : shm_(shm), name_(std::move(name)), base_(base) {}

  // Moves `tensor`'s bytes into the region and names them there instead.
  void Move(gcmoe::v1::Tensor* tensor) {
    const size_t offset = Take(tensor->data().size());
    std::memcpy(shm_->data() + base_ + offset, tensor->data().data(), tensor->data().size());
    Name(tensor->mutable_region(), offset, tensor->data().size());
    tensor->clear_data();
  }
  // Room for `bytes` of output; returns its offset in the object.
  size_t Output(ForwardRequest* request, size_t bytes) {
    const size_t offset = Take(bytes);
    std::memset(shm_->data() + base_ + offset, 0xAB, bytes);  // nothing left from before
    Name(request->mutable_output_region(), offset, bytes);
    return base_ + offset;
  }
  void Name(gcmoe::v1::TensorRegion* region, size_t offset, size_t bytes) const {
    region->set_region(name_);
    region->set_offset(offset);
    region->set_byte_size(bytes);
  }

 private:
  size_t Take(size_t bytes) {
    const size_t offset = (next_ + 63) / 64 * 64;
    next_ = offset + bytes;
    EXPECT_LE(base_ + next_, shm_->bytes()) << "the test's region is too small";
    return offset;
  }
  TestShm* shm_;
  std::string name_;
  size_t base_;
  size_t next_ = 0;
};

size_t OutputBytes(const ForwardRequest& request) {
  const size_t elem = request.output_dtype() == gcmoe::v1::FP32 ? 4 : 2;
  return static_cast<size_t>(request.hidden().shape(0)) * DefaultModel().hidden * elem;
}

// Where a region request's output is: in its output region, or in the response.
struct RegionRequest {
  ForwardRequest request;
  bool output_in_region = false;
  size_t output_offset = 0;
};

// `request` with its tensors moved into the region: every input and the output for i % 3 == 0,
// the inputs only for 1, the output only for 2.
RegionRequest ToRegions(const ForwardRequest& request, int i, RegionWriter* writer) {
  RegionRequest r;
  r.request = request;
  if (i % 3 != 2) {
    writer->Move(r.request.mutable_hidden());
    if (r.request.has_hidden_scales()) writer->Move(r.request.mutable_hidden_scales());
    writer->Move(r.request.mutable_topk_ids());
    writer->Move(r.request.mutable_topk_weights());
  }
  if (i % 3 != 1) {
    r.output_in_region = true;
    r.output_offset = writer->Output(&r.request, OutputBytes(request));
  }
  return r;
}

std::string OutputOf(const RegionRequest& r, const ForwardResponse& response, const TestShm& shm) {
  if (!r.output_in_region) return response.output().data();
  EXPECT_TRUE(response.output().data().empty());
  EXPECT_EQ(response.output().shape_size(), 2);
  return std::string(reinterpret_cast<const char*>(shm.data() + r.output_offset),
                     OutputBytes(r.request));
}

grpc::Status Call(const std::string& address, const ForwardRequest& request,
                  ForwardResponse* response, const std::string& token = "") {
  auto stub = Connect(address);
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return stub->Forward(&context, request, response);
}

// What GetModelInfo says the service accepts for RegisterMemory.
std::vector<std::string> MemoryKinds(const std::string& address) {
  auto stub = Connect(address);
  grpc::ClientContext context;
  gcmoe::v1::ModelInfo info;
  const grpc::Status status = stub->GetModelInfo(&context, gcmoe::v1::GetModelInfoRequest(), &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return {info.memory_kinds().begin(), info.memory_kinds().end()};
}

grpc::Status Register(const std::string& address, const std::string& name, const std::string& key,
                      uint64_t offset, uint64_t bytes, const std::string& token = "") {
  auto stub = Connect(address);
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  gcmoe::v1::RegisterMemoryRequest request;
  request.set_name(name);
  request.mutable_posix_shm()->set_key(key);
  request.mutable_posix_shm()->set_offset(offset);
  request.mutable_posix_shm()->set_byte_size(bytes);
  gcmoe::v1::RegisterMemoryResponse response;
  return stub->RegisterMemory(&context, request, &response);
}

// Two ranks with registered memory on, then `more`.
std::vector<std::string> With(std::vector<std::string> more) {
  more.insert(more.begin(), {"--set", "server.allow_registered_memory=true"});
  return TwoRanksWith(more);
}

TEST(RegisteredMemoryTest, RegionAndInlineOutputsAreByteIdentical) {
  auto inline_ranks =
      StartServe(With({"--set", "server.rank_io=inline"}), "rm_inline", milliseconds(60000));
  // Every step waits 50 ms for more calls: concurrent callers share steps.
  auto shm_ranks =
      StartServe(With({"--set", "server.batch_window_us=50000"}), "rm_shm", milliseconds(60000));
  ASSERT_TRUE(inline_ranks && shm_ranks);
  EXPECT_EQ(MemoryKinds(shm_ranks->address), std::vector<std::string>{"posix_shm"});
  const std::vector<ForwardRequest> requests = DataPathRequests(300, "reg-");

  // The reference: each request alone, tensors inline, ranks inline.
  std::vector<std::string> reference;
  for (const auto& request : requests) {
    ForwardResponse response;
    ASSERT_TRUE(Call(inline_ranks->address, request, &response).ok());
    reference.push_back(response.output().data());
  }

  // One object holds every request's tensors and output, registered once with each service;
  // the region starts 4 KiB into the object, so offsets are the registration's, not the
  // object's.
  TestShm shm("identical", 8 << 20);
  ASSERT_TRUE(Register(inline_ranks->address, "buffers", shm.key(), 4096, shm.bytes() - 4096).ok());
  ASSERT_TRUE(Register(shm_ranks->address, "buffers", shm.key(), 4096, shm.bytes() - 4096).ok());
  RegionWriter writer(&shm, "buffers", 4096);
  std::vector<RegionRequest> region_requests;
  for (size_t i = 0; i < requests.size(); ++i) {
    region_requests.push_back(ToRegions(requests[i], static_cast<int>(i), &writer));
  }

  for (const auto* service : {&*inline_ranks, &*shm_ranks}) {
    SCOPED_TRACE(service->address);
    for (size_t i = 0; i < requests.size(); ++i) {
      ForwardResponse response;
      const grpc::Status status = Call(service->address, region_requests[i].request, &response);
      ASSERT_TRUE(status.ok()) << requests[i].request_id() << ": " << status.error_message();
      EXPECT_EQ(response.stats().shared_memory_io(), service == &*shm_ranks);
      EXPECT_EQ(OutputOf(region_requests[i], response, shm), reference[i])
          << requests[i].request_id() << " (alone)";
    }
  }

  // On one stream, in order.
  {
    auto stub = Connect(shm_ranks->address);
    grpc::ClientContext context;
    auto stream = stub->ForwardStream(&context);
    for (const RegionRequest& r : region_requests) ASSERT_TRUE(stream->Write(r.request));
    stream->WritesDone();
    size_t next = 0;
    gcmoe::v1::ForwardStreamResponse reply;
    while (stream->Read(&reply)) {
      ASSERT_LT(next, region_requests.size());
      EXPECT_EQ(reply.code(), 0) << reply.message();
      EXPECT_EQ(OutputOf(region_requests[next], reply.response(), shm), reference[next])
          << requests[next].request_id() << " (stream)";
      ++next;
    }
    EXPECT_EQ(next, region_requests.size());
    EXPECT_TRUE(stream->Finish().ok());
  }

  // Concurrently: merged steps read each call's rows from its region and write each output to
  // its own.
  std::vector<std::future<std::pair<grpc::Status, ForwardResponse>>> calls;
  for (const RegionRequest& r : region_requests) {
    calls.push_back(std::async(std::launch::async, [&] {
      ForwardResponse response;
      grpc::Status status = Call(shm_ranks->address, r.request, &response);
      return std::make_pair(status, response);
    }));
  }
  uint32_t most_merged = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto [status, response] = calls[i].get();
    ASSERT_TRUE(status.ok()) << status.error_message();
    most_merged = std::max(most_merged, response.stats().batched_calls());
    EXPECT_EQ(OutputOf(region_requests[i], response, shm), reference[i])
        << requests[i].request_id() << " (merged)";
  }
  EXPECT_GT(most_merged, 1u) << "no two concurrent calls shared a step";
}

// A 4-token request with every input and its output in `name`, laid out by a fresh writer at
// the registration's start.
RegionRequest WholeRegionRequest(TestShm* shm, const std::string& name, uint64_t seed) {
  RequestSpec spec;
  spec.num_tokens = 4;
  spec.seed = seed;
  RegionWriter writer(shm, name);
  return ToRegions(MakeForwardRequest(DefaultModel(), spec), 0, &writer);
}

std::string TokensFile(const std::vector<std::string>& tokens) {
  const std::string path = TempPath("regmem_tokens");
  FILE* f = std::fopen(path.c_str(), "w");
  for (const std::string& t : tokens) std::fprintf(f, "%s\n", t.c_str());
  std::fclose(f);
  return path;
}

TEST(RegisteredMemoryTest, BadReferencesGetTheirCodesAndTheServiceKeepsServing) {
  const std::string alice = "alice-token-0123456789";
  const std::string bob = "bob-token-9876543210";
  auto service = StartServe(With({"--set", "server.auth.tokens_file=" + TokensFile({alice, bob})}),
                            "rm_bad", milliseconds(60000));
  ASSERT_TRUE(service);
  const std::string& address = service->address;
  TestShm shm("bad", 1 << 20);
  ASSERT_TRUE(Register(address, "mine", shm.key(), 0, shm.bytes(), alice).ok());
  const RegionRequest good = WholeRegionRequest(&shm, "mine", 5);
  // The expected output: the same request inline.
  ForwardRequest inline_request;
  {
    RequestSpec spec;
    spec.num_tokens = 4;
    spec.seed = 5;
    inline_request = MakeForwardRequest(DefaultModel(), spec);
  }
  ForwardResponse expected;
  ASSERT_TRUE(Call(address, inline_request, &expected, alice).ok());
  auto still_serving = [&](const std::string& after) {
    ForwardResponse response;
    const grpc::Status status = Call(address, good.request, &response, alice);
    EXPECT_TRUE(status.ok()) << "after " << after << ": " << status.error_message();
    EXPECT_EQ(OutputOf(good, response, shm), expected.output().data()) << "after " << after;
  };
  still_serving("registering");

  struct Case {
    std::string name;
    std::function<void(ForwardRequest*)> mutate;
    grpc::StatusCode code;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"unknown region", [](ForwardRequest* r) { r->mutable_hidden()->mutable_region()->set_region("nope"); },
       grpc::StatusCode::NOT_FOUND, "hidden.region: \"nope\" is not a registered region"},
      {"out of bounds",
       [&](ForwardRequest* r) { r->mutable_topk_ids()->mutable_region()->set_offset(shm.bytes() - 8); },
       grpc::StatusCode::INVALID_ARGUMENT, "topk_ids.region: bytes ["},
      {"offset overflow",
       [](ForwardRequest* r) { r->mutable_topk_weights()->mutable_region()->set_offset(~uint64_t{0}); },
       grpc::StatusCode::INVALID_ARGUMENT, "topk_weights.region: bytes ["},
      {"wrong size",
       [](ForwardRequest* r) { r->mutable_hidden()->mutable_region()->set_byte_size(100); },
       grpc::StatusCode::INVALID_ARGUMENT, "hidden.region.byte_size: 100 bytes, expected"},
      {"wrong output size",
       [](ForwardRequest* r) { r->mutable_output_region()->set_byte_size(64); },
       grpc::StatusCode::INVALID_ARGUMENT, "output_region.byte_size: 64 bytes, expected"},
      {"unknown output region",
       [](ForwardRequest* r) { r->mutable_output_region()->set_region("nope"); },
       grpc::StatusCode::NOT_FOUND, "output_region: \"nope\""},
      {"inline and region",
       [](ForwardRequest* r) { r->mutable_topk_ids()->set_data(std::string(64, '\0')); },
       grpc::StatusCode::INVALID_ARGUMENT, "topk_ids: both data and region are set"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ForwardRequest bad = good.request;
    c.mutate(&bad);
    ForwardResponse response;
    EXPECT_STATUS(Call(address, bad, &response, alice), c.code, c.text);
    still_serving(c.name);
  }

  // Region bytes are validated as inline bytes are: a NaN activation and an expert id out of
  // range are refused, naming the element.
  {
    const auto& h = good.request.hidden().region();
    float saved;
    std::memcpy(&saved, shm.data() + h.offset(), 4);
    const float nan = std::nanf("");
    std::memcpy(shm.data() + h.offset(), &nan, 4);
    ForwardResponse response;
    EXPECT_STATUS(Call(address, good.request, &response, alice),
                  grpc::StatusCode::INVALID_ARGUMENT, "hidden: element [0, 0] is NaN");
    std::memcpy(shm.data() + h.offset(), &saved, 4);
    const auto& ids = good.request.topk_ids().region();
    int32_t saved_id;
    std::memcpy(&saved_id, shm.data() + ids.offset(), 4);
    const int32_t bad_id = 1 << 20;
    std::memcpy(shm.data() + ids.offset(), &bad_id, 4);
    EXPECT_STATUS(Call(address, good.request, &response, alice),
                  grpc::StatusCode::INVALID_ARGUMENT, "topk_ids: element [0, 0] is 1048576");
    std::memcpy(shm.data() + ids.offset(), &saved_id, 4);
    still_serving("bad region bytes");
  }

  // Another token's registration does not exist for it: NOT_FOUND, to use or to unregister.
  {
    ForwardResponse response;
    EXPECT_STATUS(Call(address, good.request, &response, bob), grpc::StatusCode::NOT_FOUND,
                  "hidden.region: \"mine\" is not a registered region");
    EXPECT_STATUS(Unregister(address, "mine", bob), grpc::StatusCode::NOT_FOUND,
                  "name: \"mine\" is not registered");
    // Bob may use the same name for his own registration.
    EXPECT_TRUE(Register(address, "mine", shm.key(), 0, 4096, bob).ok());
    EXPECT_TRUE(Unregister(address, "mine", bob).ok());
    still_serving("another token's attempts");
  }

  // Registration errors.
  EXPECT_STATUS(Register(address, "mine", shm.key(), 0, 4096, alice),
                grpc::StatusCode::ALREADY_EXISTS, "name: \"mine\" is already registered");
  EXPECT_STATUS(Register(address, "gone", "/gcmoe_test-no-such-object", 0, 4096, alice),
                grpc::StatusCode::NOT_FOUND, "posix_shm.key: no shared-memory object");
  EXPECT_STATUS(Register(address, "big", shm.key(), 4096, shm.bytes(), alice),
                grpc::StatusCode::INVALID_ARGUMENT, "posix_shm.byte_size: offset + byte_size");
  EXPECT_STATUS(Register(address, "zero", shm.key(), 0, 0, alice),
                grpc::StatusCode::INVALID_ARGUMENT, "posix_shm.byte_size: 0");
  EXPECT_STATUS(Register(address, "relative", "no-slash", 0, 4096, alice),
                grpc::StatusCode::INVALID_ARGUMENT, "posix_shm.key: expected a POSIX");
  EXPECT_STATUS(Register(address, "", shm.key(), 0, 4096, alice),
                grpc::StatusCode::INVALID_ARGUMENT, "name: 0 bytes");
  // The service's own objects (here a rank I/O region's name) cannot be registered.
  EXPECT_STATUS(Register(address, "theirs", "/gcmoe-io-r0-0123456789abcdef", 0, 4096, alice),
                grpc::StatusCode::INVALID_ARGUMENT, "are the service's own objects");
  {
    // Not a regular shared-memory object: a FIFO where the object would be.
    const std::string fifo = "gcmoe_test-fifo-" + std::to_string(getpid());
    ASSERT_EQ(mkfifo(("/dev/shm/" + fifo).c_str(), 0600), 0);
    EXPECT_STATUS(Register(address, "fifo", "/" + fifo, 0, 4096, alice),
                  grpc::StatusCode::INVALID_ARGUMENT, "is not a regular shared-memory object");
    unlink(("/dev/shm/" + fifo).c_str());
  }
  {
    auto stub = Connect(address);
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + alice);
    gcmoe::v1::RegisterMemoryRequest request;
    request.set_name("device");
    request.mutable_cuda_ipc()->set_ipc_handle(std::string(64, '\0'));
    request.mutable_cuda_ipc()->set_byte_size(4096);
    gcmoe::v1::RegisterMemoryResponse response;
    // This service runs the cpu backend: GPU memory needs the cuda one (GpuMemoryTest, under
    // tests/kernels, registers real CUDA memory).
    EXPECT_STATUS(stub->RegisterMemory(&context, request, &response),
                  grpc::StatusCode::FAILED_PRECONDITION, "needs the cuda backend");
  }
  // The number of registrations is bounded (256, all owners together; "mine" is one).
  for (int i = 0; i < 255; ++i) {
    ASSERT_TRUE(Register(address, "many-" + std::to_string(i), shm.key(), 0, 4096, alice).ok());
  }
  EXPECT_STATUS(Register(address, "one-too-many", shm.key(), 0, 4096, alice),
                grpc::StatusCode::RESOURCE_EXHAUSTED, "registrations, its limit");
  for (int i = 0; i < 255; ++i) {
    ASSERT_TRUE(Unregister(address, "many-" + std::to_string(i), alice).ok());
  }
  still_serving("registration errors");

  // An object shrunk after it was registered is refused at the next use, not read past its end.
  {
    TestShm small("shrink", 1 << 20);
    ASSERT_TRUE(Register(address, "shrinking", small.key(), 0, small.bytes(), alice).ok());
    const RegionRequest r = WholeRegionRequest(&small, "shrinking", 5);
    ASSERT_EQ(ftruncate(small.fd(), 4096), 0);
    ForwardResponse response;
    EXPECT_STATUS(Call(address, r.request, &response, alice), grpc::StatusCode::INVALID_ARGUMENT,
                  "no longer holds the registered bytes");
    EXPECT_TRUE(Unregister(address, "shrinking", alice).ok());
    ASSERT_EQ(ftruncate(small.fd(), static_cast<off_t>(small.bytes())), 0);
  }
  still_serving("a shrunk object");
  EXPECT_TRUE(service->process->running());
}

TEST(RegisteredMemoryTest, OffByDefault) {
  auto service = StartServe({"--ranks", "2", "--set", "engine.threads=1"}, "rm_off",
                            milliseconds(60000));
  ASSERT_TRUE(service);
  EXPECT_TRUE(MemoryKinds(service->address).empty());
  TestShm shm("off", 1 << 20);
  EXPECT_STATUS(Register(service->address, "mine", shm.key(), 0, shm.bytes()),
                grpc::StatusCode::FAILED_PRECONDITION, "server.allow_registered_memory");
  EXPECT_STATUS(Unregister(service->address, "mine"), grpc::StatusCode::FAILED_PRECONDITION,
                "server.allow_registered_memory");
  const RegionRequest r = WholeRegionRequest(&shm, "mine", 9);
  ForwardResponse response;
  EXPECT_STATUS(Call(service->address, r.request, &response),
                grpc::StatusCode::FAILED_PRECONDITION, "server.allow_registered_memory");
  // Only the output in a region is a use too.
  RequestSpec spec;
  ForwardRequest request = MakeForwardRequest(DefaultModel(), spec);
  request.mutable_output_region()->set_region("mine");
  EXPECT_STATUS(Call(service->address, request, &response),
                grpc::StatusCode::FAILED_PRECONDITION, "server.allow_registered_memory");
  request.clear_output_region();
  EXPECT_TRUE(Call(service->address, request, &response).ok());
}

// Designed outcome: a call that resolved a region before it was unregistered (and its object
// removed) completes from the still-mapped memory with the right output; the next call naming it
// is NOT_FOUND.
TEST(RegisteredMemoryTest, UnregisteringDuringACallLetsItComplete) {
  // Every step waits 1 s for company, so the call is inside the service (its regions resolved)
  // while the region goes.
  auto service = StartServe(With({"--set", "server.batch_window_us=1000000"}), "rm_unregister",
                            milliseconds(60000));
  ASSERT_TRUE(service);
  RequestSpec spec;
  spec.num_tokens = 13;
  spec.seed = 77;
  const ForwardRequest inline_request = MakeForwardRequest(DefaultModel(), spec);
  ForwardResponse expected;
  ASSERT_TRUE(Call(service->address, inline_request, &expected).ok());

  auto shm = std::make_unique<TestShm>("unregister", 1 << 20);
  ASSERT_TRUE(Register(service->address, "brief", shm->key(), 0, shm->bytes()).ok());
  RegionWriter writer(shm.get(), "brief");
  const RegionRequest r = ToRegions(inline_request, 0, &writer);
  auto call = std::async(std::launch::async, [&] {
    ForwardResponse response;
    grpc::Status status = Call(service->address, r.request, &response);
    return std::make_pair(status, response);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(Unregister(service->address, "brief").ok());
  shm_unlink(shm->key().c_str());  // the object's name goes too; the mappings stay
  const auto [status, response] = call.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(OutputOf(r, response, *shm), expected.output().data());

  ForwardResponse after;
  EXPECT_STATUS(Call(service->address, r.request, &after), grpc::StatusCode::NOT_FOUND,
                "\"brief\" is not a registered region");
  EXPECT_TRUE(Call(service->address, inline_request, &after).ok());
  EXPECT_EQ(after.output().data(), expected.output().data());
}

}  // namespace
}  // namespace gcmoe::server::testing
