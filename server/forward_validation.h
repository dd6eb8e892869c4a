// Validation of a ForwardRequest against the loaded model, at the coordinator, before anything
// reaches a rank. Every message names the field and the value expected (DESIGN.md §3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/thread_pool.h"
#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::server {

// The largest magnitudes the service computes with (DESIGN.md §4): an activation as decoded from
// hidden (and its scales), and a routing weight. Larger ones are refused with INVALID_ARGUMENT
// naming the element, before anything reaches a rank.
inline constexpr float kMaxActivationMagnitude = 4294967296.0f;  // 2^32
inline constexpr float kMaxRoutingWeightMagnitude = 65536.0f;    // 2^16

struct ForwardLimits {
  int hidden = 0;
  int experts = 0;
  int top_k = 0;
  int layers = 0;
  int max_tokens = 0;  // parallel.ranks x engine.max_tokens_per_rank
  int world_size = 1;
};

// The bytes of one tensor of a ForwardRequest: its `data`, or a registered region's bytes
// (server/forward_regions.h). Validation is the same for both; only the field an error about
// their size names differs.
struct TensorBytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  bool in_region = false;  // size errors name "<field>.region.byte_size", else "<field>.data"
  // GPU memory (a cuda_ipc registration; data is null): the size is checked here, the values
  // by the ranks on the GPU (StepResult.value_errors).
  bool on_device = false;
};

// A range of a cuda_ipc registration (DeviceRegistration), which every rank has opened.
struct DeviceBytes {
  uint64_t region = 0;  // its id; 0: none
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Where a Forward's inputs are read from and its output written to.
struct ForwardBytes {
  TensorBytes hidden;
  TensorBytes hidden_scales;
  TensorBytes topk_ids;
  TensorBytes topk_weights;
  uint8_t* output = nullptr;  // output_region's bytes; null: the output goes in the response
  size_t output_size = 0;
  DeviceBytes hidden_device;  // hidden in GPU memory (hidden.on_device)
  DeviceBytes output_device;  // output_region in GPU memory (output stays null)

  // Whether the activations or the output are in GPU memory.
  bool on_device() const { return hidden_device.region != 0 || output_device.region != 0; }
};

// A request's tensors as the message carries them.
ForwardBytes InlineBytes(const gcmoe::v1::ForwardRequest& request);

struct ValidatedForward {
  int num_tokens = 0;
  engine::DType hidden_dtype = engine::DType::kBF16;
  bool output_fp32 = false;
  std::vector<int> tokens_per_rank;  // [P] contiguous shards: the source rank of each token
  std::vector<int64_t> counts;       // [P, E] C[src][expert]
  std::string request_id;            // the call's id (server/request_id.h), sent with its step
  ForwardBytes bytes;                // what the coordinator copies to the ranks and writes back
  // What `bytes` points into beyond the request itself (registered regions' mappings, routing
  // copied out of them), held until the call has finished.
  std::vector<std::shared_ptr<const void>> keep_alive;
};

// Splits T tokens into P contiguous shards, the first T % P one token larger.
std::vector<int> ShardSizes(int num_tokens, int world_size);

// Checks the request's layer, dtypes and shapes, and every value of `bytes` (finite, within the
// bounds of DESIGN.md §4, expert ids in range and distinct per token), and computes the shards
// and counts; `bytes` is left in out->bytes. The first form takes the message's own bytes.
Status ValidateForward(const gcmoe::v1::ForwardRequest& request, const ForwardLimits& limits,
                       ValidatedForward* out);
// The value scans of a large tensor are split over `pool` when there is one.
Status ValidateForward(const gcmoe::v1::ForwardRequest& request, const ForwardBytes& bytes,
                       const ForwardLimits& limits, ValidatedForward* out,
                       engine::ThreadPool* pool = nullptr);

// An output is returned only when every element is finite: a layer that overflowed FP32 (weights
// can be as large as FP32 allows, so the input bounds alone cannot rule it out) fails the call
// with INVALID_ARGUMENT naming the element, never OK. For an output of `dtype` (BF16 or FP32)
// with `cols` values per row at `data`.
Status ValidateForwardOutput(gcmoe::v1::DType dtype, const uint8_t* data, size_t size,
                             int64_t cols);
// Whether `size` bytes of BF16 or FP32 output are all finite: ValidateForwardOutput's fast pass,
// for a part of an output (a whole number of values) as it is copied.
bool OutputFinite(gcmoe::v1::DType dtype, const uint8_t* data, size_t size);

const char* DTypeName(gcmoe::v1::DType dtype);

}  // namespace gcmoe::server
