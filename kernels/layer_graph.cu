#include "kernels/layer_graph.h"

#include <algorithm>
#include <type_traits>

#include "kernels/layer_roles.h"
#include "kernels/tma_map.h"

namespace gcmoe::kernels {
namespace {

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Per-block arrays and the ring: at most ceil(rows / BM) full blocks plus one partial block per
// local expert.
int MaxBlocksFor(int max_recv_rows, int local_experts, int bm) {
  return CeilDiv(max_recv_rows, bm) + local_experts;
}

std::string CudaMessage(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err);
}

}  // namespace

int BlockSizeIndex(int bm) {
  for (int i = 0; i < kNumBlockSizes; ++i) {
    if (kBlockSizes[i] == bm) return i;
  }
  return -1;
}

cudaError_t LoadLayerKernels() {
  cudaError_t err = LoadDispatchRole1Kernel();
  if (err == cudaSuccess) err = LoadGroupedGemmKernels();
  if (err == cudaSuccess) err = LoadFinalizeRole3Kernel();
  if (err == cudaSuccess) err = LoadAllToAllKernels();
  return err;
}

int LayerGraph::max_blocks(int bm) const {
  return MaxBlocksFor(max_recv_rows_, options_.dims.local_experts, bm);
}

int LayerGraph::ring_blocks(int bm) const {
  const int blocks = max_blocks(bm);
  if (sequential_ || options_.ring_blocks <= 0) return blocks;
  return std::min(options_.ring_blocks, blocks);
}

int LayerGraph::role2_grid(int bm) const {
  const int index = BlockSizeIndex(bm);
  return index < 0 ? 0 : role2_grid_[index];
}

cudaError_t LayerGraph::Create(const LayerGraphOptions& options, std::unique_ptr<LayerGraph>* out,
                               std::string* error) {
  std::unique_ptr<LayerGraph> graph(new LayerGraph());
  graph->options_ = options;
  const LayerDims& d = options.dims;
  if (d.world_size < 1 || d.world_size > kMaxRanks || d.rank < 0 || d.rank >= d.world_size) {
    *error = "rank " + std::to_string(d.rank) + " of " + std::to_string(d.world_size) +
             ": the peer table holds 1.." + std::to_string(kMaxRanks) + " ranks";
    return cudaErrorInvalidValue;
  }
  // The workspace, events and graphs belong to this device (the pair may come from a cache
  // that does not select it).
  cudaError_t err = cudaSetDevice(options.device);
  if (err != cudaSuccess) {
    *error = CudaMessage("selecting the device", err);
    return err;
  }
  err = GetGreenContextPair(options.device, options.dispatch_sms, &graph->pair_, error);
  if (err != cudaSuccess) return err;
  graph->sequential_ = options.sequential || !graph->pair_->green;
  // Every role kernel is loaded (and its shared memory configured) before anything is captured
  // or can spin.
  if ((err = LoadLayerKernels()) != cudaSuccess) {
    *error = CudaMessage("loading the layer kernels", err);
    return err;
  }
  graph->max_recv_rows_ = d.world_size * d.capacity * d.top_k;
  const int total_sms = graph->pair_->total_sms;
  graph->role1_grid_ = graph->pair_->green      ? graph->pair_->dispatch_sms
                       : options.role1_grid > 0 ? std::min(options.role1_grid, total_sms)
                                                : total_sms;
  // More than one role3 CTA per SM: its reduction waits on L2 round trips, which one CTA (8 warps)
  // per SM cannot hide at large T.
  int role3_per_sm = 1;
  if ((err = Role3CtasPerSm(&role3_per_sm)) != cudaSuccess) {
    *error = CudaMessage("sizing role3", err);
    return err;
  }
  graph->role3_grid_ = graph->pair_->compute_sms * role3_per_sm;
  for (int i = 0; i < kNumBlockSizes; ++i) {
    const int bm = kBlockSizes[i];
    Role2Shape& shape = graph->role2_shape_[i];
    err = Role2ShapeFor(d, bm, &shape);
    const int per_sm = shape.blocks_per_sm;
    if (err != cudaSuccess || per_sm < 1) {
      *error = "the grouped GEMM for BM " + std::to_string(bm) + " does not fit on an SM";
      return err != cudaSuccess ? err : cudaErrorInvalidConfiguration;
    }
    graph->role2_grid_[i] = graph->pair_->compute_sms * per_sm;
    graph->rows_all_ = std::max(graph->rows_all_, graph->max_blocks(bm) * bm);
    graph->ring_rows_ = std::max(graph->ring_rows_, graph->ring_blocks(bm) * bm);
  }
  if ((err = graph->Allocate()) != cudaSuccess) {
    *error = CudaMessage("allocating the layer workspace", err);
    return err;
  }
  if ((err = cudaEventCreateWithFlags(&graph->fork_, cudaEventDisableTiming)) != cudaSuccess ||
      (err = cudaEventCreateWithFlags(&graph->join_, cudaEventDisableTiming)) != cudaSuccess) {
    *error = CudaMessage("creating events", err);
    return err;
  }
  for (int q = 0; q < d.world_size; ++q) {
    graph->peers_.x_q[q] = graph->x_q_;
    graph->peers_.x_s[q] = graph->x_s_;
    graph->peers_.recv[q] = graph->recv_;
    graph->peers_.combine[q] = graph->combine_;
    graph->peers_.signals[q] = graph->sig_;
  }
  if ((err = graph->CaptureAll()) != cudaSuccess) {
    *error = CudaMessage("capturing the layer graph", err);
    return err;
  }
  // One empty replay of every graph (no tokens: barriers and resets only, nothing can spin on
  // a kernel that has not started), so each role has run once in its green context before a
  // real step depends on it.
  for (int i = 0; i < kNumBlockSizes && err == cudaSuccess; ++i)
    err = graph->Replay(kBlockSizes[i]);
  if (err == cudaSuccess && graph->execs_[kTaillessGraph] != nullptr)
    err = graph->Replay(kWgmmaBm, false);
  if (err == cudaSuccess) err = cudaStreamSynchronize(graph->stream());
  if (err != cudaSuccess) {
    const std::string timeout = graph->TimeoutDiagnostic();
    *error =
        CudaMessage("the first (empty) replays", err) + (timeout.empty() ? "" : ": " + timeout);
    return err;
  }
  *out = std::move(graph);
  return cudaSuccess;
}

StepInputsLayout StepInputsLayout::For(int num_experts, int capacity, int top_k, int max_blocks) {
  const auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t per_token = static_cast<size_t>(capacity) * top_k * 4;
  StepInputsLayout l;
  l.header = 0;
  l.routes = align(sizeof(StepHeader));
  l.topk_ids = l.routes + align(static_cast<size_t>(num_experts) * sizeof(ExpertRoute));
  l.topk_weights = l.topk_ids + align(per_token);
  l.direct_rows = l.topk_weights + align(per_token);
  l.blocks = l.direct_rows + align(per_token);
  l.total = l.blocks + static_cast<size_t>(max_blocks) * sizeof(RingBlock);
  return l;
}

cudaError_t LayerGraph::Allocate() {
  const LayerDims& d = options_.dims;
  const int64_t H = d.hidden;
  const int64_t I = d.intermediate;
  const int64_t Is = d.shared_intermediate;
  const int64_t k = d.top_k;
  const int64_t cap = d.capacity;
  const int64_t cap_rows = cap + 64;  // a shared block may read past the last token
  const int max_blocks8 = max_blocks(8);
  cudaError_t err = cudaSuccess;
  auto alloc = [&](auto** ptr, int64_t bytes) {
    if (err != cudaSuccess) return;
    void* p = nullptr;
    err = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 16)));
    if (err == cudaSuccess)
      err = cudaMemset(p, 0, static_cast<size_t>(std::max<int64_t>(bytes, 16)));
    if (err == cudaSuccess) {
      allocations_.push_back(p);
      *ptr = static_cast<std::remove_reference_t<decltype(*ptr)>>(p);
    }
  };
  inputs_layout_ = StepInputsLayout::For(d.num_experts, static_cast<int>(cap),
                                         static_cast<int>(k), max_blocks8);
  alloc(&step_inputs_, static_cast<int64_t>(inputs_layout_.total));
  if (err != cudaSuccess) return err;
  header_ = reinterpret_cast<StepHeader*>(step_inputs_ + inputs_layout_.header);
  routes_ = reinterpret_cast<ExpertRoute*>(step_inputs_ + inputs_layout_.routes);
  topk_ids_ = reinterpret_cast<int32_t*>(step_inputs_ + inputs_layout_.topk_ids);
  topk_weights_ = reinterpret_cast<float*>(step_inputs_ + inputs_layout_.topk_weights);
  direct_rows_ = reinterpret_cast<int32_t*>(step_inputs_ + inputs_layout_.direct_rows);
  blocks_ = reinterpret_cast<RingBlock*>(step_inputs_ + inputs_layout_.blocks);
  alloc(&hidden_in_, cap * H * 4);
  alloc(&hidden_scales_in_, cap * H / 32);
  // The exchange region: what peers read or write, at offsets fixed by the dimensions. Scale
  // rows are read in aligned 16-byte windows (the streaming role2): 16 bytes of slack.
  const int64_t exchange_parts[] = {cap_rows * H, cap_rows * H / 32 + 16,
                                    static_cast<int64_t>(max_recv_rows_ * sizeof(RowMeta)),
                                    cap * (k + 1) * H * 2, static_cast<int64_t>(sizeof(Signals))};
  int64_t exchange_offsets[5];
  int64_t exchange_bytes = 0;
  for (int i = 0; i < 5; ++i) {
    exchange_offsets[i] = exchange_bytes;
    exchange_bytes += (exchange_parts[i] + 255) / 256 * 256;
  }
  alloc(&exchange_, exchange_bytes);
  if (err != cudaSuccess) return err;
  exchange_bytes_ = static_cast<size_t>(exchange_bytes);
  x_q_ = exchange_ + exchange_offsets[0];
  x_s_ = exchange_ + exchange_offsets[1];
  recv_ = reinterpret_cast<RowMeta*>(exchange_ + exchange_offsets[2]);
  combine_ = reinterpret_cast<uint16_t*>(exchange_ + exchange_offsets[3]);
  sig_ = reinterpret_cast<Signals*>(exchange_ + exchange_offsets[4]);
  // role2 reads BF16 activation rows (LayerParams::act_bf16).
  const int64_t act_bytes = 2;
  alloc(&ring_, static_cast<int64_t>(ring_rows_) * H * act_bytes);
  alloc(&meta_, static_cast<int64_t>(rows_all_) * sizeof(RowMeta));
  alloc(&h_q_, static_cast<int64_t>(rows_all_) * I * act_bytes);
  alloc(&hs_q_, cap_rows * Is * act_bytes);
  alloc(&x_bf_, cap_rows * H * 2);
  alloc(&out_, cap * H * 4);
  alloc(&act_maps_, kNumActMapSets * static_cast<int64_t>(sizeof(TmaMap)));
  if (err == cudaSuccess) {
    const struct {
      ActMap map;
      const void* base;
      int64_t rows, cols;
    } maps[] = {{kMapRing, ring_, ring_rows_, H},
                {kMapH, h_q_, rows_all_, I},
                {kMapXbf, x_bf_, cap_rows, H},
                {kMapHs, hs_q_, cap_rows, Is}};
    // The K32 set for the mma.sync kernel (BM 8-32), the K64 sets for the wgmma kernel (BM 64).
    TmaMap host[kNumActMapSets] = {};
    for (const auto& m : maps) {
      if (m.base == nullptr || m.cols == 0) continue;  // no shared expert
      for (int g = 1; g <= kTmaK32Heights && err == cudaSuccess; ++g) {
        err =
            EncodeBf16TileMap(m.base, m.rows, m.cols, TmaBox::kK32, &host[K32ActMap(m.map, g)], g);
      }
      for (int g = 1; g <= kTmaWideHeights && err == cudaSuccess; ++g) {
        err = EncodeBf16TileMap(m.base, m.rows, m.cols, TmaBox::kK64Swizzled,
                                &host[WideActMap(m.map, g)], g);
      }
    }
    if (err == cudaSuccess) err = cudaMemcpy(act_maps_, host, sizeof(host), cudaMemcpyHostToDevice);
  }
  if (options_.alltoall) {
    const int64_t sent = cap * k;
    const int64_t received = static_cast<int64_t>(d.world_size) * cap * k;
    alloc(&a2a_send_, sent * A2aRecordBytes(d.hidden));
    alloc(&a2a_recv_, received * A2aRecordBytes(d.hidden));
    alloc(&a2a_ret_send_, received * H * 2);
    alloc(&a2a_ret_recv_, sent * H * 2);
    alloc(&a2a_staging_, static_cast<int64_t>(d.world_size) * cap * (k + 1) * H * 2);
  }
  // ring_full and ring_empty (R each), w1_done (blocks), w1s_done (shared blocks).
  counter_words_ = static_cast<size_t>(2 * max_blocks8 + max_blocks8 + CeilDiv(cap, 8) + 1);
  alloc(&counters_, static_cast<int64_t>(counter_words_) * 4);
  if (options_.trace_role2) {
    // The largest task space: every block at BM 8, plus the shared expert's blocks.
    task_trace_cap_ = static_cast<int>(Role2TaskCount(d, max_blocks8, CeilDiv(cap, 8)));
    alloc(&task_trace_, static_cast<int64_t>(task_trace_cap_) * sizeof(TaskTrace));
  }
  if (options_.record_sm_ids) {
    int max_grid = 0;
    for (int g : role2_grid_) max_grid = std::max(max_grid, g);
    alloc(&sm_ids_, static_cast<int64_t>(role1_grid_ + max_grid) * 4);
  }
  if (err != cudaSuccess) return err;
  if ((err = cudaHostAlloc(&abort_host_, sizeof(uint64_t), cudaHostAllocMapped)) != cudaSuccess ||
      (err = cudaHostAlloc(&diag_host_, sizeof(WaitDiagnostic), cudaHostAllocMapped)) !=
          cudaSuccess) {
    return err;
  }
  *abort_host_ = 0;
  *diag_host_ = WaitDiagnostic{};
  if ((err = cudaHostGetDevicePointer(&abort_device_, abort_host_, 0)) != cudaSuccess) return err;
  return cudaHostGetDevicePointer(&diag_device_, diag_host_, 0);
}

LayerParams LayerGraph::Params(int bm_index) const {
  const int bm = kBlockSizes[bm_index];
  const int max_blocks8 = max_blocks(8);
  LayerParams p{};
  p.dims = options_.dims;
  p.peers = peers_;
  p.bm = bm;
  p.ring_blocks = ring_blocks(bm);
  p.max_blocks = max_blocks(bm);
  p.sequential = sequential_ ? 1 : 0;
  p.timeout_ns = options_.timeout_ns;
  p.wait_sleep_ns = options_.wait_sleep_ns;
  p.role1_grid = role1_grid_;
  p.role2_grid = role2_grid(bm);
  p.r2_stages = role2_shape_[bm_index].stages;
  p.r2_tiles_per_task = Role2TilesPerTask(bm);
  p.act_bf16 = Bf16ActOrder(bm);
  p.header = header_;
  p.blocks = blocks_;
  p.routes = routes_;
  p.hidden_in = hidden_in_;
  p.hidden_scales_in = hidden_scales_in_;
  p.topk_ids = topk_ids_;
  p.topk_weights = topk_weights_;
  p.direct_rows = direct_rows_;
  p.x_q = x_q_;
  p.x_s = x_s_;
  p.x_bf = x_bf_;
  p.recv = recv_;
  p.ring = ring_;
  p.meta = meta_;
  p.h_q = h_q_;
  p.hs_q = hs_q_;
  p.act_maps = act_maps_;
  p.combine = combine_;
  p.out = out_;
  p.sig = sig_;
  p.ring_full = counters_;
  p.ring_empty = counters_ + max_blocks8;
  p.w1_done = counters_ + 2 * max_blocks8;
  p.w1s_done = counters_ + 3 * max_blocks8;
  p.abort_generation = abort_device_;
  p.diag = diag_device_;
  p.smid_log = sm_ids_;
  p.task_trace = task_trace_;
  p.task_trace_cap = task_trace_cap_;
  return p;
}

LayerParams LayerGraph::LocalParams(int bm_index) const {
  LayerParams p = Params(bm_index);
  const LayerDims& d = options_.dims;
  for (int q = 0; q < d.world_size; ++q) {
    p.peers.x_q[q] = x_q_;
    p.peers.x_s[q] = x_s_;
    p.peers.recv[q] = recv_;
    p.peers.signals[q] = sig_;
    p.peers.combine[q] = q == d.rank ? combine_
                                     : a2a_staging_ + static_cast<int64_t>(q) * d.capacity *
                                                          (d.top_k + 1) * d.hidden;
  }
  p.a2a_send = a2a_send_;
  p.a2a_recv = a2a_recv_;
  p.a2a_ret_send = a2a_ret_send_;
  p.a2a_ret_recv = a2a_ret_recv_;
  return p;
}

cudaError_t LayerGraph::SetPeerBases(const std::vector<uint8_t*>& bases) {
  const LayerDims& d = options_.dims;
  if (static_cast<int>(bases.size()) != d.world_size || bases[d.rank] != exchange_) {
    return cudaErrorInvalidValue;
  }
  for (int q = 0; q < d.world_size; ++q) {
    const auto at = [&](const void* own) {
      return bases[q] + (static_cast<const uint8_t*>(own) - exchange_);
    };
    peers_.x_q[q] = at(x_q_);
    peers_.x_s[q] = at(x_s_);
    peers_.recv[q] = reinterpret_cast<RowMeta*>(at(recv_));
    peers_.combine[q] = reinterpret_cast<uint16_t*>(at(combine_));
    peers_.signals[q] = reinterpret_cast<Signals*>(at(sig_));
  }
  cudaError_t err = cudaStreamSynchronize(pair_->compute_stream);
  if (err != cudaSuccess) return err;
  DestroyGraphs();
  return CaptureAll();
}

cudaError_t LayerGraph::SetExpertBiases(bool has_biases) {
  if ((options_.dims.has_biases != 0) == has_biases) return cudaSuccess;
  const cudaError_t err = cudaStreamSynchronize(pair_->compute_stream);
  if (err != cudaSuccess) return err;
  options_.dims.has_biases = has_biases ? 1 : 0;
  DestroyGraphs();
  return CaptureAll();
}

cudaError_t LayerGraph::LaunchAllToAllStage(AllToAllStage stage, int bm) {
  const int index = BlockSizeIndex(bm);
  if (index < 0 || a2a_send_ == nullptr) return cudaErrorInvalidValue;
  return kernels::LaunchAllToAllStage(stage, LocalParams(index), pair_->compute_sms,
                                      pair_->compute_stream);
}

cudaError_t LayerGraph::LaunchLocalRole2(int bm) {
  const int index = BlockSizeIndex(bm);
  if (index < 0 || a2a_send_ == nullptr) return cudaErrorInvalidValue;
  return LaunchGroupedGemmRole2(LocalParams(index), role2_shape_[index], role2_grid(bm),
                                pair_->compute_stream);
}

cudaError_t LayerGraph::LaunchLocalRole3(int bm) {
  const int index = BlockSizeIndex(bm);
  if (index < 0 || a2a_send_ == nullptr) return cudaErrorInvalidValue;
  return LaunchFinalizeRole3(LocalParams(index), role3_grid_, pair_->compute_stream);
}

cudaError_t LayerGraph::CaptureAll() {
  cudaError_t err = cudaSuccess;
  for (int i = 0; i < kNumBlockSizes && err == cudaSuccess; ++i) err = Capture(i, true);
  // The wgmma kernel without merged tails, for BM 64 steps that have none (Replay). Only
  // without the shared expert: with it the kernel merges no tails at all.
  if (err == cudaSuccess && options_.dims.shared_intermediate == 0) {
    err = Capture(BlockSizeIndex(kWgmmaBm), false);
  }
  return err;
}

void LayerGraph::DestroyGraphs() {
  for (int i = 0; i < kNumGraphs; ++i) {
    if (execs_[i] != nullptr) cudaGraphExecDestroy(execs_[i]);
    if (graphs_[i] != nullptr) cudaGraphDestroy(graphs_[i]);
    execs_[i] = nullptr;
    graphs_[i] = nullptr;
  }
}

cudaError_t LayerGraph::Capture(int bm_index, bool merge_tails) {
  const LayerParams params = Params(bm_index);
  const int bm = kBlockSizes[bm_index];
  cudaStream_t compute = pair_->compute_stream;
  cudaStream_t dispatch = sequential_ ? compute : pair_->dispatch_stream;
  cudaError_t err = cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return err;
  cudaError_t launch = cudaSuccess;
  if (sequential_) {
    // On one GPU role2 launches programmatically behind role1: its CTAs start, claim tasks and
    // wait on the ring flags while role1 still quantizes and copies (role1's CTAs are all
    // resident first, so no spin can block it), and its W1 tasks start block by block as role1
    // fills them. Not with peers: there role1 pulls over NVLink beside hundreds of waiting role2
    // CTAs, which made steps up to 20x slower (docs/DESIGN-NOTES.md, multi-GPU).
    const bool early = options_.dims.world_size == 1;
    launch = LaunchDispatchRole1(params, role1_grid_, compute);
    if (launch == cudaSuccess)
      launch = LaunchGroupedGemmRole2(params, role2_shape_[bm_index], role2_grid(bm), compute,
                                      early, merge_tails);
  } else {
    // Fork: the dispatch stream joins the capture with no dependency, so role1 and role2 are
    // both roots of the graph.
    launch = cudaEventRecord(fork_, compute);
    if (launch == cudaSuccess) launch = cudaStreamWaitEvent(dispatch, fork_, 0);
    if (launch == cudaSuccess) launch = LaunchDispatchRole1(params, role1_grid_, dispatch);
    if (launch == cudaSuccess)
      launch = LaunchGroupedGemmRole2(params, role2_shape_[bm_index], role2_grid(bm), compute,
                                      false, merge_tails);
    if (launch == cudaSuccess) launch = cudaEventRecord(join_, dispatch);
    if (launch == cudaSuccess) launch = cudaStreamWaitEvent(compute, join_, 0);
  }
  // On one GPU role3 launches programmatically behind role2 too, so that its launch and its CTAs'
  // start overlap role2's last tasks (worth most at small T, where the tail is a larger share).
  if (launch == cudaSuccess)
    launch = LaunchFinalizeRole3(params, role3_grid_, compute,
                                 sequential_ && options_.dims.world_size == 1);
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(compute, &graph);
  if (launch != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return launch;
  }
  if (err != cudaSuccess) return err;
  const int slot = merge_tails ? bm_index : kTaillessGraph;
  graphs_[slot] = graph;
  return cudaGraphInstantiate(&execs_[slot], graph, 0);
}

cudaError_t LayerGraph::Replay(int bm, bool merged_tails) {
  int index = BlockSizeIndex(bm);
  if (index < 0) return cudaErrorInvalidValue;
  if (!merged_tails && bm == kWgmmaBm && execs_[kTaillessGraph] != nullptr) {
    index = kTaillessGraph;
  }
  return cudaGraphLaunch(execs_[index], pair_->compute_stream);
}

void LayerGraph::Abort(uint64_t generation) {
  uint64_t seen = __atomic_load_n(abort_host_, __ATOMIC_RELAXED);
  while (seen < generation && !__atomic_compare_exchange_n(abort_host_, &seen, generation, true,
                                                           __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
}

bool LayerGraph::Aborted(uint64_t generation) const {
  return generation != 0 && __atomic_load_n(abort_host_, __ATOMIC_SEQ_CST) >= generation;
}

std::string LayerGraph::TimeoutDiagnostic() const {
  // Written by the device (host-mapped) right before it trapped.
  const volatile WaitDiagnostic* d = diag_host_;
  if (d->timed_out == 0) return BrokenCheck();
  return "role" + std::to_string(d->role) + " timed out waiting for " + WaitWhatName(d->what) +
         " " + std::to_string(d->index) + ": needed >= " + std::to_string(d->target) + ", saw " +
         std::to_string(d->seen) + " (replay " + std::to_string(d->replay) + ")";
}

std::string LayerGraph::BrokenCheck() const {
  const volatile WaitDiagnostic* d = diag_host_;
  if (d->broken == 0) return "";
  std::string text = "role3 found role2's bookkeeping broken: ";
  text += WaitWhatName(d->broken);
  if (d->broken == kCheckW1Tiles) text.append(" ").append(std::to_string(d->broken_index));
  text.append(": expected ").append(std::to_string(d->broken_expected));
  text.append(", saw ").append(std::to_string(d->broken_seen));
  return text;
}

cudaError_t LayerGraph::ResetSignals() {
  cudaError_t err = cudaMemsetAsync(sig_, 0, sizeof(Signals), pair_->compute_stream);
  if (err == cudaSuccess) {
    err = cudaMemsetAsync(counters_, 0, counter_words_ * 4, pair_->compute_stream);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(pair_->compute_stream);
  return err;
}

cudaError_t LayerGraph::ClearRole2Trace() {
  if (task_trace_ == nullptr) return cudaErrorInvalidValue;
  return cudaMemsetAsync(task_trace_, 0, static_cast<size_t>(task_trace_cap_) * sizeof(TaskTrace),
                         pair_->compute_stream);
}

cudaError_t LayerGraph::ReadRole2Trace(const StepHeader& header, int bm,
                                       std::vector<TaskTrace>* trace) const {
  if (task_trace_ == nullptr) return cudaErrorInvalidValue;
  const int64_t tasks = Role2TaskCount(options_.dims, header.num_blocks, header.num_shared_blocks,
                                       Role2TilesPerTask(bm));
  trace->resize(static_cast<size_t>(std::min<int64_t>(tasks, task_trace_cap_)));
  cudaError_t err = cudaStreamSynchronize(pair_->compute_stream);
  if (err != cudaSuccess) return err;
  return cudaMemcpy(trace->data(), task_trace_, trace->size() * sizeof(TaskTrace),
                    cudaMemcpyDeviceToHost);
}

cudaError_t LayerGraph::ReadSmIds(int bm, std::vector<int>* role1, std::vector<int>* role2) const {
  if (sm_ids_ == nullptr) return cudaErrorInvalidValue;
  std::vector<int> ids(role1_grid_ + role2_grid(bm));
  const cudaError_t err =
      cudaMemcpy(ids.data(), sm_ids_, ids.size() * sizeof(int), cudaMemcpyDeviceToHost);
  role1->assign(ids.begin(), ids.begin() + role1_grid_);
  role2->assign(ids.begin() + role1_grid_, ids.end());
  return err;
}

LayerGraph::~LayerGraph() {
  // Nothing may still run on the workspace when it is freed.
  if (pair_ != nullptr) cudaStreamSynchronize(pair_->compute_stream);
  DestroyGraphs();
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (join_ != nullptr) cudaEventDestroy(join_);
  for (void* p : allocations_) cudaFree(p);
  if (abort_host_ != nullptr) cudaFreeHost(abort_host_);
  if (diag_host_ != nullptr) cudaFreeHost(diag_host_);
}

}  // namespace gcmoe::kernels
