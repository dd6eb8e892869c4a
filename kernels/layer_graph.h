// One rank's GC-MoE layer on one GPU: the device workspace (every buffer sized for the
// capacity once), the device-persistent signals, and one captured CUDA graph per block size:
//
//     role1 (dispatch partition) ──┐
//                                  ├──> role3 (compute partition)
//     role2 (compute partition) ───┘
//
// role1 and role2 are independent roots, so the driver runs them at once on disjoint SMs;
// role3 depends on both. Sizes (tokens, blocks, the layer's weights) are read on the device
// from the step tables, so a graph serves every step up to the capacity; graphs differ only
// in the GEMM's block size BM (8, 16, 32, 64 tokens), picked per step from the expected tokens
// per expert (and at BM 64 in whether role2 runs merged tails: Replay). Replays need no
// host-side reset: role3 restores every signal.
//
// P ranks: the buffers peers read or write (quantized activations, receive index, combine
// buffer, signals) live in one allocation, the exchange region, at offsets that depend only on
// the layer's dimensions, so a peer's region base is all a rank needs to reach them.
// SetPeerBases installs every rank's base as this rank maps it (the engine maps them, by CUDA
// IPC or peer access) into the by-value peer table and recaptures the graphs. Until then the
// table names this rank's own region for every rank, which runs P = 1 and the empty replays.
//
// With `alltoall` the workspace also holds the NCCL all-to-all baseline's buffers, and the
// baseline's stages are launched one by one (Launch*Local, LaunchAllToAllStage).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/green_context.h"
#include "kernels/layer_roles.h"
#include "kernels/layer_types.h"

namespace gcmoe::kernels {

// Index of a block size in kBlockSizes, or -1.
int BlockSizeIndex(int bm);

// The step's small inputs in one device allocation at offsets fixed by the dimensions (each
// 256-byte aligned), mirrored by the host's staging buffer, so that a step sends them up in one
// copy instead of one each: the header, the routes, the top-k ids, weights and direct rows
// (the capacity's rows, used or not: 12 k bytes per token of capacity, 24 KiB at 256 tokens and
// top-8), then the blocks, whose count varies, last.
struct StepInputsLayout {
  size_t header = 0;
  size_t routes = 0;        // [E] ExpertRoute
  size_t topk_ids = 0;      // [capacity, k] int32
  size_t topk_weights = 0;  // [capacity, k] float
  size_t direct_rows = 0;   // [capacity, k] int32
  size_t blocks = 0;        // [max_blocks(8)] RingBlock
  size_t total = 0;

  static StepInputsLayout For(int num_experts, int capacity, int top_k, int max_blocks);
  // What a step with `num_blocks` blocks copies up: everything before the blocks, and its own.
  size_t BytesWith(int64_t num_blocks) const {
    return blocks + static_cast<size_t>(num_blocks) * sizeof(RingBlock);
  }
};

struct LayerGraphOptions {
  LayerDims dims;
  int device = 0;
  int dispatch_sms = 0;  // SMs requested for the communication partition; 0 = none
  // Ring slots per graph; 0: as many as the largest step has blocks (no slot is reused within
  // a replay). A small value exercises the generation-tagged reuse.
  int ring_blocks = 0;
  // role1's CTAs when there is no dispatch partition; 0: one per SM. (A CTA pulls its ring
  // blocks one after another: at 16 CTAs, the W1 tasks of GLM-5.2 T = 256, 80 blocks, waited
  // up to 45 us (p90) for theirs.)
  int role1_grid = 0;
  // Roles one after the other on one stream (forced in the single-context fallback). Nothing
  // ever spins on a kernel that has not run, which tools that serialize kernels need.
  bool sequential = false;
  uint64_t timeout_ns = 5'000'000'000ull;
  // LayerParams::wait_sleep_ns: the longest sleep between two polls of a spin wait.
  uint32_t wait_sleep_ns = kDefaultWaitSleepNs;
  bool record_sm_ids = false;  // role1/role2 CTAs log their SM (tests, bench)
  bool trace_role2 = false;    // role2 records every task's timeline (TaskTrace)
  bool alltoall = false;       // also allocate the all-to-all baseline's buffers
};

class LayerGraph {
 public:
  static cudaError_t Create(const LayerGraphOptions& options, std::unique_ptr<LayerGraph>* out,
                            std::string* error);
  ~LayerGraph();
  LayerGraph(const LayerGraph&) = delete;
  LayerGraph& operator=(const LayerGraph&) = delete;

  const GreenContextPair& partitions() const { return *pair_; }
  bool sequential() const { return sequential_; }
  // The stream step I/O goes to; graphs are launched on it.
  cudaStream_t stream() const { return pair_->compute_stream; }

  int max_recv_rows() const { return max_recv_rows_; }
  int max_blocks(int bm) const;  // logical blocks a step of block size bm can have
  int ring_blocks(int bm) const;
  int role1_grid() const { return role1_grid_; }
  int role2_grid(int bm) const;
  int role3_grid() const { return role3_grid_; }
  const Role2Shape& role2_shape(int bm) const { return role2_shape_[BlockSizeIndex(bm)]; }

  // Device buffers the host fills before a replay (on stream()). All but the activations lie
  // in step_inputs(), laid out as step_inputs_layout() says.
  uint8_t* step_inputs() const { return step_inputs_; }
  const StepInputsLayout& step_inputs_layout() const { return inputs_layout_; }
  StepHeader* header() const { return header_; }
  RingBlock* blocks() const { return blocks_; }                    // [max_blocks(8)]
  ExpertRoute* routes() const { return routes_; }                  // [E]
  void* hidden_in() const { return hidden_in_; }                   // [capacity, H] x 4 bytes
  uint8_t* hidden_scales_in() const { return hidden_scales_in_; }  // [capacity, H/32]
  int32_t* topk_ids() const { return topk_ids_; }                  // [capacity, k]
  float* topk_weights() const { return topk_weights_; }
  int32_t* direct_rows() const { return direct_rows_; }  // [capacity, k]
  const void* output() const { return out_; }            // [capacity, H] x 4 bytes

  // One replay of the graph for block size bm (8, 16, 32 or 64) on stream(). merged_tails: the
  // step's blocks may carry merged tails (RingBlock::tail_rows > 0). A BM 64 step without them
  // runs the wgmma kernel's instance without the merged tails' N = 80 path, which leaves its
  // other loops more registers.
  cudaError_t Replay(int bm, bool merged_tails = true);

  // The exchange region (cudaMalloc'd, so CUDA IPC can export it).
  void* exchange_base() const { return exchange_; }
  size_t exchange_bytes() const { return exchange_bytes_; }
  // bases[r]: rank r's exchange region as mapped here (bases[rank] = exchange_base()). Call
  // with no replay in flight; recaptures every graph.
  cudaError_t SetPeerBases(const std::vector<uint8_t*>& bases);
  // Whether the layers' weights have expert biases (LayerDims::has_biases): role2 then runs its
  // instances with the extended epilogue (ExtendedEpilogue). Call with no replay in flight;
  // recaptures every graph when it changes.
  cudaError_t SetExpertBiases(bool has_biases);

  // The NCCL all-to-all baseline (options.alltoall), launched on stream(): its own stages, and
  // role2 and role3 with the rank-local peer table.
  cudaError_t LaunchAllToAllStage(AllToAllStage stage, int bm);
  cudaError_t LaunchLocalRole2(int bm);
  cudaError_t LaunchLocalRole3(int bm);
  uint8_t* a2a_send() const { return a2a_send_; }           // [capacity * k] records
  uint8_t* a2a_recv() const { return a2a_recv_; }           // [P * capacity * k] records
  uint16_t* a2a_ret_send() const { return a2a_ret_send_; }  // [P * capacity * k, H]
  uint16_t* a2a_ret_recv() const { return a2a_ret_recv_; }  // [capacity * k, H]

  // Makes a replay whose header generation is <= `generation` leave its waits (thread-safe).
  void Abort(uint64_t generation);
  // Whether Abort covered a replay of this generation.
  bool Aborted(uint64_t generation) const;
  // After a failed synchronize: which device wait timed out (or which check broke), or "".
  std::string TimeoutDiagnostic() const;
  // After any replay: a broken end-of-replay check (WaitDiagnostic::broken) as text, or "".
  // Sticky: the workspace is suspect from then on.
  std::string BrokenCheck() const;
  // Zeroes every signal (no replay may be in flight).
  cudaError_t ResetSignals();
  // With record_sm_ids: the SM of each role1 and role2 CTA of the last replay of `bm`.
  cudaError_t ReadSmIds(int bm, std::vector<int>* role1, std::vector<int>* role2) const;
  // With trace_role2: forget the recorded tasks (on the step stream, before a replay), and
  // read the records of the last replay of the step `header` describes (synchronous). Both
  // fail with cudaErrorInvalidValue without trace_role2.
  cudaError_t ClearRole2Trace();
  cudaError_t ReadRole2Trace(const StepHeader& header, int bm, std::vector<TaskTrace>* trace) const;

 private:
  LayerGraph() = default;
  cudaError_t Allocate();
  cudaError_t CaptureAll();
  // merge_tails: role2's instance that runs merged tails (into graph bm_index), or the one
  // without (into kTaillessGraph).
  cudaError_t Capture(int bm_index, bool merge_tails);
  void DestroyGraphs();
  LayerParams Params(int bm_index) const;
  // The baseline's parameters: every peer entry names this rank's buffers, except combine[q]
  // (q != rank), role2's staging of source q's partials.
  LayerParams LocalParams(int bm_index) const;

  LayerGraphOptions options_;
  const GreenContextPair* pair_ = nullptr;
  bool sequential_ = false;
  int max_recv_rows_ = 0;
  int rows_all_ = 0;   // rows of the per-block arrays (max over BM of blocks * BM)
  int ring_rows_ = 0;  // rows of the ring (max over BM of ring blocks * BM)
  int role1_grid_ = 0;
  int role2_grid_[kNumBlockSizes] = {};
  Role2Shape role2_shape_[kNumBlockSizes] = {};
  int role3_grid_ = 0;
  std::vector<void*> allocations_;
  uint8_t* exchange_ = nullptr;  // x_q | x_s | recv | combine | signals
  size_t exchange_bytes_ = 0;
  PeerTable peers_{};

  uint8_t* step_inputs_ = nullptr;
  StepInputsLayout inputs_layout_;
  StepHeader* header_ = nullptr;
  RingBlock* blocks_ = nullptr;
  ExpertRoute* routes_ = nullptr;
  void* hidden_in_ = nullptr;
  uint8_t* hidden_scales_in_ = nullptr;
  int32_t* topk_ids_ = nullptr;
  float* topk_weights_ = nullptr;
  int32_t* direct_rows_ = nullptr;
  uint8_t* x_q_ = nullptr;
  uint8_t* x_s_ = nullptr;
  RowMeta* recv_ = nullptr;
  uint16_t* x_bf_ = nullptr;    // this rank's tokens as BF16 rows (LayerParams::x_bf)
  TmaMap* act_maps_ = nullptr;  // device [kNumActMapSets] (LayerParams::act_maps)
  uint8_t* ring_ = nullptr;
  RowMeta* meta_ = nullptr;
  uint8_t* h_q_ = nullptr;
  uint8_t* hs_q_ = nullptr;
  uint16_t* combine_ = nullptr;
  void* out_ = nullptr;
  Signals* sig_ = nullptr;
  uint32_t* counters_ = nullptr;  // ring_full | ring_empty | w1_done | w1s_done
  size_t counter_words_ = 0;
  int32_t* sm_ids_ = nullptr;
  TaskTrace* task_trace_ = nullptr;  // [task_trace_cap_] with trace_role2
  int task_trace_cap_ = 0;
  uint64_t* abort_host_ = nullptr;  // host-mapped
  WaitDiagnostic* diag_host_ = nullptr;
  uint64_t* abort_device_ = nullptr;
  WaitDiagnostic* diag_device_ = nullptr;
  uint8_t* a2a_send_ = nullptr;
  uint8_t* a2a_recv_ = nullptr;
  uint16_t* a2a_ret_send_ = nullptr;
  uint16_t* a2a_ret_recv_ = nullptr;
  uint16_t* a2a_staging_ = nullptr;  // [P, capacity, k + 1, H]

  // One graph per block size, and one more: BM 64 without merged tails (the wgmma kernel,
  // without the shared expert; CaptureAll).
  static constexpr int kTaillessGraph = kNumBlockSizes;
  static constexpr int kNumGraphs = kNumBlockSizes + 1;
  cudaGraph_t graphs_[kNumGraphs] = {};
  cudaGraphExec_t execs_[kNumGraphs] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_ = nullptr;
};

}  // namespace gcmoe::kernels
