// The CUDA backend: one rank's share of a layer step as one replay of the GC-MoE layer graph
// (kernels/layer_graph.h) on the rank's GPU. Implements the Backend seam; the concrete type is
// public for the GPU tests and `gcmoe bench layer`, which also measure and introspect it.
//
// P > 1 ranks, one GPU each, on one host. transport_name() names this rank's exchange region
// (cuda_ipc.h); ConnectPeers maps each peer's region and installs the bases in the layer graph's
// peer table. With exchange "nccl" (the baseline) no peer memory is mapped: ConnectPeers joins an
// NCCL communicator from the coordinator's unique id, and a step is NCCL all-to-all rounds around
// the same kernels, launched eagerly on the compute partition.
//
// Tuning comes from BackendOptions::cuda (the engine.cuda config keys, and the ablation switches
// of `gcmoe bench layer`); engine.cuda.trace_role2 makes every step log role2's task timeline
// (kernels/role2_trace.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda_ipc.h"
#include "engine/gpu_step_tables.h"
#include "engine/nccl_comm.h"
#include "kernels/layer_graph.h"
#include "kernels/value_check.h"

namespace gcmoe::engine {

// The block size (rows per ring block, 8/16/32/64) for a step whose rank computes a mean of
// `rows_per_expert` routed rows per held expert: the size measured fastest on both model slices.
// A smaller block streams an expert's weights once more per extra block; a larger one multiplies
// empty token columns and fits fewer CTAs per SM.
int BlockRowsForMeanRows(double rows_per_expert);

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  Status LoadExperts(const WeightSource& source, std::span<const int> experts) override;
  std::string transport_name() const override;
  Status ConnectPeers(const PeerSetup& setup) override;
  bool needs_nccl() const override { return alltoall_; }
  Status Step(const StepContext& ctx, StepOutput* out) override;
  // Pipelined with the gcmoe exchange and without engine.cuda.trace_role2 (whose trace buffer
  // is one per workspace); the NCCL baseline runs each step whole in Launch.
  bool pipelines() const override { return !alltoall_ && !trace_role2_; }
  Status Launch(const StepContext& ctx, StepOutput* out) override;
  bool Done(uint64_t generation) override;
  Status Finish(uint64_t generation, StepOutput* out) override;
  void PrefetchInputs(const StepContext& ctx) override;
  Status RegisterHostMemory(void* data, size_t bytes) override;
  void UnregisterHostMemory(void* data) override;
  Result<std::shared_ptr<ImportedMemory>> ImportDeviceMemory(const std::string& ipc_handle,
                                                             int device, uint64_t offset,
                                                             uint64_t bytes) override;
  bool QueryDeviceMemory(DeviceMemory* memory) const override;
  std::string device_lost() const override;
  void Abort(uint64_t generation) override;

  const kernels::GreenContextPair& partitions() const { return graph_->partitions(); }
  bool sequential() const { return graph_->sequential(); }
  // The GEMM block size (tokens per ring block) the last Step used.
  int last_block_rows() const { return last_bm_; }
  // The block size a step with `rows` routed assignments on this rank uses:
  // BlockRowsForMeanRows(rows / held experts), unless ForceBlockRows pinned one.
  int ChooseBlockRows(int64_t rows) const;
  // Pins the block size of later steps (8, 16, 32 or 64; 0 = ChooseBlockRows), for ablations.
  Status ForceBlockRows(int bm);
  // Rows of an expert's last block that role2 computes with the block before it
  // (RingBlock::tail_rows): the wgmma kernel's MMA width above its block size, else 0.
  int MaxTailRows(int bm) const;
  const kernels::Role2Shape& role2_shape(int bm) const { return graph_->role2_shape(bm); }
  int role2_grid(int bm) const { return graph_->role2_grid(bm); }

  // Replays the last Step's graph (same inputs) `warmup` times untimed, then `replays` times,
  // each timed with CUDA events; returns the per-replay times in microseconds.
  // With P > 1 every rank must call it with the same counts (the replays meet at the
  // cross-rank barriers).
  Result<std::vector<float>> TimeReplays(int warmup, int replays);
  // With CudaTuning::record_sm_ids: the SM of every role1 and role2 CTA of the last replay.
  Status ReadSmIds(std::vector<int>* role1, std::vector<int>* role2);

 private:
  struct LayerWeights {
    void* w1 = nullptr;              // [held][I/32 tiles] E2M1
    void* w2 = nullptr;              // [held][H/64 tiles]
    void* ws1 = nullptr;             // shared [I_s/32 tiles] E4M3
    void* ws2 = nullptr;             // shared [H/64 tiles]
    int32_t* scale_shift = nullptr;  // kernels::StepHeader::scale_shift
    float* b1 = nullptr;             // [held][I/32 tiles][64] or null: StepHeader::b1
    float* b2 = nullptr;             // [held][H] or null
  };
  // The sizes the kernels run at: H, I and I_s rounded up to multiples of 128, zero-padded
  // (DESIGN.md §6, shapes), equal to the model's when they are multiples already.
  struct PaddedDims {
    int hidden = 0;
    int intermediate = 0;
    int shared_intermediate = 0;
  };

  // A launched step's own state, so that the next step can be launched before it finishes: two
  // of these alternate. The device workspace itself is one: the next step's uploads are
  // enqueued behind this step's work on the same stream, so they wait for it there.
  struct Lane {
    bool busy = false;        // launched and not finished
    bool enqueued = false;    // work went to the device (a lone rank without tokens sends none)
    bool prefetched = false;  // PrefetchInputs enqueued this generation's activations
    uint64_t generation = 0;
    StepContext ctx;   // as launched, without the plan (the engine's, reused by the next step)
    int64_t rows = 0;  // routed assignments computed (StepOutput::assignments_computed)
    kernels::StepHeader header{};  // for the role2 trace
    int bm = 0;
    // Timing of the step's stages: before the uploads, after them, after the layer, after the
    // output's copy back (StepOutput's h2d_ns, device_ns, d2h_ns); the last marks its end.
    // With PrefetchInputs, the first is recorded before the activations' copy, ahead of the host
    // work that plans the step.
    cudaEvent_t events[4] = {};
    // Pinned host mirror of the graph's step inputs (kernels::StepInputsLayout), uploaded from
    // here in one copy: a copy from pageable memory goes through the driver's own bounce buffer.
    uint8_t* staging = nullptr;
    // The first bad index of each DeviceRows range's activations [i] and output [n + i]
    // (kernels/value_check.h): on the device, and its pinned copy read after the step's end.
    unsigned long long* faults = nullptr;
    unsigned long long* faults_host = nullptr;
  };

  CudaBackend(const BackendOptions& options, std::unique_ptr<kernels::LayerGraph> graph);
  Status CheckStep(const StepContext& ctx) const;
  // Launch's and Finish's work, under step_mutex_.
  Status LaunchStep(const StepContext& ctx, StepOutput* out, Lane* lane, bool prefetched);
  Status FinishStep(Lane* lane, StepOutput* out);
  // After a failed launch or finish: whether the context is broken for good (device_lost()).
  void NoteSticky();
  // The busy lane of `generation`, or null.
  Lane* LaneOf(uint64_t generation);
  // StepContext::device_rows: disjoint, in order, within the shard, and what they hold allowed.
  Status CheckDeviceRows(const StepContext& ctx) const;
  // Enqueues the copy of the step's activations (and FP8 scales) into the graph's input, rows of
  // the padded H (dims_) with zero padding columns: the host's, then those in GPU memory, whose
  // value checks go to faults_[0, n) (n = device_rows.size()).
  cudaError_t UploadHidden(const StepContext& ctx, Lane* lane);
  // Enqueues the copy of the output rows that go to GPU memory, checked into faults_[n, 2n),
  // and of faults_ to faults_host_.
  cudaError_t CopyOutputToDevice(const StepContext& ctx, Lane* lane);
  // After the step's end: StepOutput::device_faults from the lane's faults_host.
  void ReadFaults(const Lane& lane, StepOutput* out);
  // With engine.cuda.trace_role2: role2's task timeline of the step just run, as one log entry.
  void LogRole2Trace(const kernels::StepHeader& header, int bm, uint64_t generation) const;
  // The all-to-all baseline's NCCL rounds in bytes, from tables_.
  void SetAllToAllBytes();
  // One replay: the graph, or the baseline's stages and NCCL rounds.
  cudaError_t LaunchLayer(int bm, Status* nccl_status);
  Status SelectDevice() const;
  // Waits for a lane's step: its end event, or with the NCCL baseline the stream, polled.
  Status Sync(const char* what, const Lane& lane);
  void FreeWeights();

  BackendOptions options_;
  std::unique_ptr<kernels::LayerGraph> graph_;
  std::mutex step_mutex_;  // one Launch or Finish at a time
  mutable std::mutex lost_mutex_;
  std::string lost_;  // device_lost(), under lost_mutex_
  std::vector<LayerWeights> layers_;
  PaddedDims dims_;
  // With a padded H: the input dtype whose rows' padding columns are known to hold zeros in
  // the device input buffer (its row pitch depends on the dtype), -1 for none yet.
  int zero_padded_dtype_ = -1;
  std::vector<int> slot_of_;  // [E] local slot of a held expert, -1 otherwise
  int held_experts_ = 0;
  int last_bm_ = 0;
  int forced_bm_ = 0;
  bool connected_ = false;
  bool alltoall_ = false;     // exchange "nccl"
  bool trace_role2_ = false;  // engine.cuda.trace_role2
  // engine.cuda.wait_timeout_ms: the NCCL path's Sync polls against it every step.
  std::chrono::milliseconds wait_timeout_{5000};
  CudaIpcPeers ipc_peers_;  // peers' regions (remapped on reconnect)
  std::unique_ptr<NcclComm> nccl_;
  std::string ipc_name_;  // transport_name()

  // Host copies of the step tables, storage reused.
  GpuStepTables tables_;
  std::vector<int32_t> direct_rows_host_;  // BuildDirectRows
  std::vector<kernels::RowCopy> row_copies_;  // the DeviceRows ranges' copies in or out
  AllToAllLayout records_;                 // the baseline's dispatch round
  AllToAllLayout partials_;                // and its return round
  Lane lanes_[2];
  int next_lane_ = 0;              // the lane the next launch takes
  std::vector<void*> registered_;  // RegisterHostMemory's pinned ranges
};

}  // namespace gcmoe::engine
