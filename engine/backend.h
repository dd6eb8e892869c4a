// The backend seam: one rank's share of one MoE layer step (dispatch, expert compute, combine).
// The CPU backend and the CUDA backend implement it and are tested against each other.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model_spec.h"
#include "engine/step_plan.h"
#include "engine/weights.h"

namespace gcmoe::engine {

enum class DType { kBF16, kFP32, kFP8E4M3, kFP16 };
int DTypeBytes(DType dtype);

// A rank's shard of the request, as received (the backend quantizes; DESIGN.md §4 step 1).
struct HiddenView {
  DType dtype = DType::kBF16;
  const void* data = nullptr;       // [T_r, H]
  const uint8_t* scales = nullptr;  // [T_r, H/32] UE8M0, with kFP8E4M3 only
};

// Rows of the shard whose activations and/or output are in GPU memory
// (Backend::ImportDeviceMemory) rather than at HiddenView::data and the StepOutput's host
// output: one range per call of a merged step. Nobody has read these values on the host, so
// the backend checks them as it copies them (StepOutput::device_faults).
struct DeviceRows {
  int64_t row = 0;  // the first of the shard's rows
  int64_t rows = 0;
  const void* hidden = nullptr;  // [rows, H] BF16 or FP32 activations; null: at HiddenView::data
  void* output = nullptr;        // [rows, H] output; null: in the host output
};

// The first value of a tensor the service refuses (DESIGN.md §4), found on the GPU.
struct ValueFault {
  int64_t index = -1;  // row-major element index; -1: none
  float value = 0.0f;
};

// GPU memory of another process (a CUDA IPC export) mapped into this one, unmapped when the last
// holder lets it go.
struct ImportedMemory {
  virtual ~ImportedMemory() = default;
  uint8_t* data = nullptr;  // a device address (unified addressing), `size` bytes
  uint64_t size = 0;
};

struct StepContext {
  uint64_t generation = 0;  // unique, increasing; tags every signal of this step
  int layer = 0;
  int num_tokens = 0;  // T_r: tokens whose source is this rank
  HiddenView hidden;
  const int32_t* topk_ids = nullptr;    // [T_r, k], -1 = unused slot
  const float* topk_weights = nullptr;  // [T_r, k]
  const StepPlan* plan = nullptr;
  bool output_fp32 = false;  // else BF16
  // Ranges of rows in GPU memory, disjoint and in row order. HiddenView::data may be null when
  // they hold every row's activations.
  std::span<const DeviceRows> device_rows;
};

// What the backend found wrong in one DeviceRows range (indices within the range).
struct DeviceFaults {
  ValueFault hidden;  // an activation beyond 2^32, Inf or NaN
  ValueFault output;  // an output element Inf or NaN
};

struct StepOutput {
  // Where the output goes: `destination` when the caller gives one (it must hold T_r x H x the
  // output dtype's bytes, e.g. a slot of the rank's shared-memory I/O region), else `output`.
  // Rows whose output goes to GPU memory (StepContext::device_rows) need not be written here.
  std::span<uint8_t> destination;
  std::vector<DeviceFaults> device_faults;  // one per StepContext::device_rows
  std::vector<uint8_t> output;       // [T_r, H] BF16 or FP32, little-endian; storage reused
  int64_t assignments_computed = 0;  // routed assignments this rank computed (plus shared rows)
  // Where the backend's time went (0 where a stage does not exist, e.g. copies on the CPU).
  int64_t h2d_ns = 0;
  int64_t device_ns = 0;
  int64_t d2h_ns = 0;

  // The [T_r, H] output of `bytes` bytes: `destination`, or `output` resized to it.
  uint8_t* Prepare(size_t bytes) {
    if (!destination.empty()) return destination.data();
    output.resize(bytes);
    return output.data();
  }
};

// What a rank needs to reach its peers for one epoch.
struct PeerSetup {
  uint64_t epoch = 0;
  std::vector<std::string> peer_names;  // every rank's transport_name(), indexed by rank
  std::string nccl_unique_id;           // the coordinator's for this epoch, or empty
};

// The CUDA backend's tuning: the engine.cuda config keys (config/config.h, CudaEngineConfig, says
// what each does), then switches that exist for ablations and diagnostics only, which
// `gcmoe bench layer` sets from its flags and the service never changes.
struct CudaTuning {
  int ring_blocks = 0;                 // engine.cuda.ring_blocks; 0 = no slot reuse
  int role1_grid = 0;                  // engine.cuda.role1_grid; 0 = one CTA per SM
  std::string overlap_roles = "auto";  // engine.cuda.overlap_roles: "auto", "on" or "off"
  int wait_timeout_ms = 5000;          // engine.cuda.wait_timeout_ms
  int wait_sleep_cap_ns = 4096;        // engine.cuda.wait_sleep_cap_ns
  bool trace_role2 = false;            // engine.cuda.trace_role2

  // Ablations (`gcmoe bench layer --no-merge-tails` etc.): each turns one optimization off.
  bool merge_tails = true;     // BM 64: an expert's short last block runs with the block before
  bool heaviest_first = true;  // role2's blocks heaviest expert first (else expert id order)
  bool direct_rows = true;     // one rank: role1 writes each token's ring rows (else the pull)
  bool record_sm_ids = false;  // role1/role2 CTAs log their SM (CudaBackend::ReadSmIds)
};

struct BackendOptions {
  ModelSpec model;
  int rank = 0;
  int world_size = 1;
  int max_tokens_per_rank = 0;     // capacity every buffer is sized for
  int threads = 0;                 // CPU worker threads; 0 = hardware concurrency
  int exchange_timeout_ms = 2000;  // longest any wait on a peer may take before failing
  std::string instance;            // names this service's exchange segments (shm names, etc.)
  // CUDA only.
  int device = 0;
  int dispatch_sms = 0;  // SMs requested for the dispatch green context; 0 = none
  // How tokens cross GPUs (P > 1): "gcmoe" (the fused roles over CUDA IPC peer mappings) or
  // "nccl" (the baseline: NCCL all-to-all around the same grouped GEMM).
  std::string exchange = "gcmoe";
  CudaTuning cuda;
};

// The memory of the GPU a backend runs on, as the driver reports it.
struct DeviceMemory {
  int device = 0;
  int64_t used_bytes = 0;  // total - free, every process on the device
  int64_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Loads, for every layer, the weights of the experts this rank holds a copy of (re-laid out
  // once as the backend likes), plus the shared expert when the model has one.
  virtual Status LoadExperts(const WeightSource& source, std::span<const int> experts) = 0;

  // The name under which peers reach this rank's exchange memory, and the mapping of theirs.
  // Called before the first step and again whenever a peer restarts (a new epoch); no step is
  // in flight then. ConnectPeers also resets this rank's signals.
  virtual std::string transport_name() const = 0;
  virtual Status ConnectPeers(const PeerSetup& setup) = 0;
  // Whether ConnectPeers needs setup.nccl_unique_id (the coordinator then makes one per epoch).
  virtual bool needs_nccl() const { return false; }

  // Runs this rank's part of a step. Blocks until this rank's outputs are complete.
  virtual Status Step(const StepContext& ctx, StepOutput* out) = 0;

  // The same step in two halves, so that a step's host work (the engine's split and plan, the
  // backend's tables and uploads) runs while the step before it is still on the device:
  // Launch enqueues the step and returns, Finish waits for it and completes `out`. With
  // pipelines() false, Launch runs the whole step and Finish only returns. At most two steps are
  // launched and not finished; they finish in launch order, each once (after a Launch that
  // returned OK); `out` and what `ctx` points to, but ctx.plan, stay valid until then.
  virtual bool pipelines() const { return false; }
  virtual Status Launch(const StepContext& ctx, StepOutput* out) { return Step(ctx, out); }
  // Whether Finish(generation) would return without waiting for the device.
  virtual bool Done(uint64_t /*generation*/) { return true; }
  virtual Status Finish(uint64_t /*generation*/, StepOutput* /*out*/) { return Status::Ok(); }
  // Optional: starts moving the step's activations (ctx.hidden of ctx.num_tokens rows; ctx.plan
  // is not made yet) to where Step reads them, so that the move overlaps the host work that
  // plans the step. The Step (or Launch) of the same generation finds them there; any other
  // ignores it.
  virtual void PrefetchInputs(const StepContext& /*ctx*/) {}

  // Optional: host memory that steps will read inputs from and write outputs to, for as long as
  // it stays mapped (the CUDA backend pins it so that copies are one DMA). Undone by
  // UnregisterHostMemory before the memory is unmapped.
  virtual Status RegisterHostMemory(void* /*data*/, size_t /*bytes*/) { return Status::Ok(); }
  virtual void UnregisterHostMemory(void* /*data*/) {}

  // Optional: maps bytes [offset, offset + bytes) of another process's GPU allocation, exported
  // as `ipc_handle` (the 64 bytes of a cudaIpcMemHandle_t), for steps to read activations from
  // and write outputs to (StepContext::device_rows).
  // INVALID_ARGUMENT (naming the registration's fields) when the handle does not open, the
  // allocation is not on `device` or is shorter than offset + bytes; FAILED_PRECONDITION on a
  // backend without a GPU. Thread-safe, and does not wait for a step in flight.
  virtual Result<std::shared_ptr<ImportedMemory>> ImportDeviceMemory(
      const std::string& /*ipc_handle*/, int /*device*/, uint64_t /*offset*/, uint64_t /*bytes*/) {
    return FailedPrecondition("cuda_ipc: the " + name() +
                              " backend has no GPU; CUDA IPC memory needs engine.backend cuda");
  }

  // The memory of this backend's GPU now; false when it runs on none (the CPU backend) or the
  // driver cannot say. Costs a driver call: callers sample it, not every step.
  virtual bool QueryDeviceMemory(DeviceMemory* /*memory*/) const { return false; }

  // Empty while the backend can run steps. Once its device is unusable for the rest of the
  // process (a sticky CUDA error, after which every call fails the same way and only a new
  // process gets the GPU back), why. Thread-safe.
  virtual std::string device_lost() const { return {}; }

  // Thread-safe: makes the Step of this generation (or an earlier one) leave its waits and
  // return kAborted; a later step is unaffected, so an abort that races with the end of its
  // step cannot poison the next one.
  virtual void Abort(uint64_t generation) = 0;
};

Result<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options);
// kUnimplemented when the binary was built without CUDA; kUnavailable without a usable GPU.
Result<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);

}  // namespace gcmoe::engine
