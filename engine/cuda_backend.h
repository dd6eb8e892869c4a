// The CUDA backend: one rank's share of a layer step as one replay of the GC-MoE layer graph
// (kernels/layer_graph.h) on the rank's GPU. Implements the Backend seam; the concrete type is
// public for the GPU tests and `gcmoe bench layer`, which also measure and introspect it.
//
// P > 1 ranks, one GPU each, on one host. transport_name() names this rank's exchange region:
// "cuda-ipc:<pid>:<device>:<base>:<bytes>:<CUDA IPC handle>". ConnectPeers maps each peer's
// region (CUDA IPC from another process; a rank in this process is reached directly through
// peer access) and installs the bases in the layer graph's peer table. With exchange "nccl"
// (the baseline) no peer memory is mapped: ConnectPeers joins an NCCL communicator from the
// coordinator's unique id, and a step is NCCL all-to-all rounds around the same kernels,
// launched eagerly on the compute partition.
//
// Knobs for tests and tuning (environment, read at creation):
//   GCMOE_CUDA_RING_BLOCKS=N     ring slots per graph (default: no slot reuse within a step)
//   GCMOE_CUDA_ROLE1_GRID=N      role1's CTAs without a dispatch partition (default: one per SM)
//   GCMOE_CUDA_SEQUENTIAL=0|1    roles overlapped (0) or one after the other (1: tools that
//                                serialize kernels); default overlapped on one GPU, in
//                                sequence with P > 1 (see Create)
//   GCMOE_CUDA_WAIT_TIMEOUT_MS=N device spin-wait limit (default 5000)
//   GCMOE_CUDA_RECORD_SM_IDS=1   role1/role2 CTAs log their SM (ReadSmIds)
//   GCMOE_CUDA_DIRECT_ROWS=0     one rank: role1 pulls ring blocks by pieces as with peers
//                                (default: it writes each assignment's ring row directly)
//   GCMOE_CUDA_GEMM=K            role2 kernel: bf16-wgmma (default: warp-specialized bulk-copy
//                                pipeline, exact BF16 operands, mma.sync BF16 below BM 64 and
//                                register-A BF16 wgmma at BM 64), bf16 (the same with mma.sync at
//                                BM 64 too), stream (the same pipeline, E4M3 mma.sync, FP8 wgmma
//                                for W2), wgmma (register-A FP8 wgmma; not within calc_diff 1e-4
//                                everywhere), mma (stepping stone); BackendOptions::role2_kernel,
//                                when set, wins
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/gpu_step_tables.h"
#include "engine/nccl_comm.h"
#include "kernels/layer_graph.h"

namespace gcmoe::engine {

// role2's kernel: `requested` (GCMOE_CUDA_GEMM: bf16-wgmma, bf16, stream, wgmma or mma) when set
// and not empty, else `bf16-wgmma`, on any number of GPUs. An unknown name is an InvalidArgument.
Result<kernels::GemmKernel> ChooseRole2Kernel(const char* requested);

// The block size (rows per ring block, 8/16/32/64) for a step whose rank computes a mean of
// `rows_per_expert` routed rows per held expert on role2 kernel `kernel`: the size measured
// fastest on both model slices (docs/PERFORMANCE.md, "Block size"). A smaller block streams an
// expert's weights once more per extra block; a larger one multiplies empty token columns and
// fits fewer CTAs per SM.
int BlockRowsForMeanRows(kernels::GemmKernel kernel, double rows_per_expert);

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
  void Abort(uint64_t generation) override;

  const kernels::GreenContextPair& partitions() const { return graph_->partitions(); }
  bool sequential() const { return graph_->sequential(); }
  // The GEMM block size (tokens per ring block) the last Step used.
  int last_block_rows() const { return last_bm_; }
  // The block size a step with `rows` routed assignments on this rank uses: the smallest of
  // 8, 16, 32, 64 covering m + sqrt(m) for m = rows / held experts, else 64.
  int ChooseBlockRows(int64_t rows) const;
  // Pins the block size of later steps (8, 16, 32 or 64; 0 = ChooseBlockRows), for ablations.
  Status ForceBlockRows(int bm);
  // Rows of an expert's last block that role2 computes with the block before it
  // (RingBlock::tail_rows): the bf16-wgmma kernel's MMA width above its block size, else 0.
  int MaxTailRows(int bm) const;
  kernels::GemmKernel gemm_kernel() const { return graph_->gemm_kernel(); }
  const kernels::Role2Shape& role2_shape(int bm) const { return graph_->role2_shape(bm); }
  int role2_grid(int bm) const { return graph_->role2_grid(bm); }

  // Replays the last Step's graph (same inputs) `warmup` times untimed, then `replays` times,
  // each timed with CUDA events; returns the per-replay times in microseconds.
  // With P > 1 every rank must call it with the same counts (the replays meet at the
  // cross-rank barriers).
  Result<std::vector<float>> TimeReplays(int warmup, int replays);
  // Device-to-device copy bandwidth in bytes per second (bytes read + written) over a buffer of
  // `bytes`, median of `reps` copies.
  Result<double> MeasureCopyBandwidth(size_t bytes, int reps);
  // With GCMOE_CUDA_RECORD_SM_IDS=1: the SM of every role1 and role2 CTA of the last replay.
  Status ReadSmIds(std::vector<int>* role1, std::vector<int>* role2);

 private:
  struct LayerWeights {
    void* w1 = nullptr;              // [held][I/32 tiles] E2M1
    void* w2 = nullptr;              // [held][H/64 tiles]
    void* ws1 = nullptr;             // shared [I_s/32 tiles] E4M3
    void* ws2 = nullptr;             // shared [H/64 tiles]
    int32_t* scale_shift = nullptr;  // the bf16 role2: kernels::StepHeader::scale_shift
  };

  CudaBackend(const BackendOptions& options, std::unique_ptr<kernels::LayerGraph> graph);
  Status CheckStep(const StepContext& ctx) const;
  // GCMOE_CUDA_TRACE=1: role2's task timeline of the step just run, as one log entry.
  void LogRole2Trace(const kernels::StepHeader& header, uint64_t generation) const;
  // The all-to-all baseline's NCCL rounds in bytes, from tables_.
  void SetAllToAllBytes();
  // One replay: the graph, or the baseline's stages and NCCL rounds.
  cudaError_t Launch(int bm, Status* nccl_status);
  Status SelectDevice() const;
  void ClosePeers();
  Status Sync(const char* what, uint64_t generation);
  void FreeWeights();

  BackendOptions options_;
  std::unique_ptr<kernels::LayerGraph> graph_;
  std::mutex step_mutex_;  // one step at a time: the workspace is single-instance
  std::vector<LayerWeights> layers_;
  std::vector<int> slot_of_;  // [E] local slot of a held expert, -1 otherwise
  int held_experts_ = 0;
  int last_bm_ = 0;
  int forced_bm_ = 0;
  bool merge_tails_ = true;  // GCMOE_CUDA_MERGE_TAILS=0 turns it off (A/B measurements)
  // The experts' blocks in BuildGpuStepTables's heaviest-first order, so that role2's last tasks
  // are its shortest (1.010-1.015x at T = 128, within 0.3 % elsewhere, on the synthetic slices:
  // docs/PERFORMANCE.md, session 17). GCMOE_CUDA_HEAVIEST_FIRST=0: expert id order.
  bool heaviest_first_ = true;
  // One rank, the bf16 role2, no ring slot reused, at least as many rows as role1 has CTAs:
  // role1 writes each assignment's row straight into the ring (StepHeader::direct_rows) instead
  // of pulling ring blocks by pieces. That halves role1 at GLM-5.2 T = 256 (14 against 29 us,
  // ncu) and took the step 1.007-1.030x faster at T = 128 and 256; with fewer rows the pull
  // spreads them over every CTA, where direct rows stay on the CTAs that quantized the token
  // (0.984-0.995x at T = 1 and 8; H200, 2026-12-03, docs/PERFORMANCE.md).
  // GCMOE_CUDA_DIRECT_ROWS=0: the pull, as with peers.
  bool direct_rows_ = true;
  bool connected_ = false;
  bool alltoall_ = false;     // exchange "nccl"
  bool trace_role2_ = false;  // GCMOE_CUDA_TRACE
  // GCMOE_CUDA_WAIT_TIMEOUT_MS, read once: the NCCL path's Sync polls against it every step.
  std::chrono::milliseconds wait_timeout_{5000};
  std::vector<void*> opened_;  // peers' regions opened by CUDA IPC (closed on reconnect)
  std::unique_ptr<NcclComm> nccl_;
  std::string ipc_name_;  // transport_name()

  // Host copies of the step tables, storage reused.
  GpuStepTables tables_;
  std::vector<int32_t> direct_rows_host_;  // BuildDirectRows
  AllToAllLayout records_;                 // the baseline's dispatch round
  AllToAllLayout partials_;                // and its return round
};

}  // namespace gcmoe::engine
