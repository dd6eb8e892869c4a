#include "engine/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include "engine/cuda_error.h"
#include "engine/cuda_ipc.h"
#include "engine/cuda_memory_import.h"
#include "kernels/role2_trace.h"
#include "kernels/wait_backoff.h"

namespace gcmoe::engine {
namespace {

int RoundUpTo128(int n) { return (n + 127) / 128 * 128; }

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  // Before the process's first CUDA call (a no-op if something initialized CUDA already; the
  // layer graph also loads every kernel explicitly).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  const ModelSpec& m = options.model;
  GCMOE_RETURN_IF_ERROR(m.Validate());
  if (options.world_size < 1 || options.world_size > kernels::kMaxRanks || options.rank < 0 ||
      options.rank >= options.world_size) {
    return InvalidArgument("cuda backend: rank " + std::to_string(options.rank) + " of " +
                           std::to_string(options.world_size) + ": one host holds 1.." +
                           std::to_string(kernels::kMaxRanks) + " GPU ranks");
  }
  if (options.exchange != "gcmoe" && options.exchange != "nccl") {
    return InvalidArgument("cuda backend: engine.exchange is \"gcmoe\" or \"nccl\", not \"" +
                           options.exchange + "\"");
  }
  const bool alltoall = options.exchange == "nccl";
  const CudaTuning& tuning = options.cuda;
  if (tuning.overlap_roles != "auto" && tuning.overlap_roles != "on" &&
      tuning.overlap_roles != "off") {
    return InvalidArgument(
        "cuda backend: engine.cuda.overlap_roles is \"auto\", \"on\" or "
        "\"off\", not \"" +
        tuning.overlap_roles + "\"");
  }
  if (tuning.ring_blocks < 0 || tuning.role1_grid < 0 || tuning.wait_timeout_ms < 1 ||
      tuning.wait_sleep_cap_ns < static_cast<int>(kernels::kShortWaitSleepNs) ||
      tuning.wait_sleep_cap_ns > 1000000) {
    return InvalidArgument(
        "cuda backend: engine.cuda: ring_blocks and role1_grid >= 0, wait_timeout_ms >= 1, "
        "wait_sleep_cap_ns in " +
        std::to_string(kernels::kShortWaitSleepNs) + "..1000000");
  }
  if (options.max_tokens_per_rank <= 0) {
    return InvalidArgument("cuda backend: max_tokens_per_rank must be positive");
  }
  if (static_cast<int64_t>(options.max_tokens_per_rank) * m.top_k * 4 > 96 * 1024) {
    return InvalidArgument("cuda backend: max_tokens_per_rank x top_k is " +
                           std::to_string(options.max_tokens_per_rank * m.top_k) +
                           ", at most 24576 routing entries fit the dispatch kernel");
  }
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    return Unavailable(std::string("cuda backend: no usable CUDA device (") +
                       (err != cudaSuccess ? cudaGetErrorString(err) : "no devices") + ")");
  }
  if (options.device < 0 || options.device >= devices) {
    return InvalidArgument("cuda backend: device " + std::to_string(options.device) +
                           " is outside 0.." + std::to_string(devices - 1));
  }
  // Everything below (workspace, events, graphs) belongs to this device, whatever device the
  // calling thread used last.
  if ((err = cudaSetDevice(options.device)) != cudaSuccess) {
    return CudaError("selecting device " + std::to_string(options.device), err);
  }
  cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, options.device)) != cudaSuccess) {
    return CudaError("reading the device properties", err);
  }
  if (prop.major != 9 || prop.minor != 0) {
    return Unavailable("cuda backend: the kernels are built for sm_90a (H100/H200/H20); device " +
                       std::to_string(options.device) + " is " + prop.name + ", compute " +
                       std::to_string(prop.major) + "." + std::to_string(prop.minor));
  }

  // The kernels tile K by 128 and W2's rows by 64: H, I and I_s (multiples of 32) run
  // zero-padded to multiples of 128, which is exact (DESIGN.md §6, shapes).
  const PaddedDims padded{RoundUpTo128(m.hidden), RoundUpTo128(m.intermediate),
                          RoundUpTo128(m.shared_intermediate)};
  kernels::LayerGraphOptions graph_options;
  kernels::LayerDims& d = graph_options.dims;
  d.hidden = padded.hidden;
  d.intermediate = padded.intermediate;
  d.shared_intermediate = padded.shared_intermediate;
  d.num_experts = m.num_experts;
  d.local_experts = m.num_experts;  // an upper bound: placements change what a rank holds
  d.top_k = m.top_k;
  d.capacity = options.max_tokens_per_rank;
  d.world_size = options.world_size;
  d.rank = options.rank;
  d.has_clamp = m.activation_clamp.has_value() ? 1 : 0;
  d.alpha = m.activation_alpha;
  d.clamp = m.activation_clamp.value_or(0.0f);
  d.up_offset = m.activation_up_offset;
  graph_options.device = options.device;
  graph_options.dispatch_sms = options.dispatch_sms;
  graph_options.alltoall = alltoall;
  graph_options.ring_blocks = alltoall ? 0 : tuning.ring_blocks;
  graph_options.role1_grid = tuning.role1_grid;
  // P > 1 runs the roles one after the other by default: overlapped, the 2 x H200 steps were
  // correct but slow and erratic (docs/DESIGN-NOTES.md, multi-GPU). Without a dispatch partition
  // the layer graph runs them in sequence whatever this says.
  graph_options.sequential =
      tuning.overlap_roles == "auto" ? options.world_size > 1 : tuning.overlap_roles == "off";
  graph_options.timeout_ns = static_cast<uint64_t>(tuning.wait_timeout_ms) * 1000000ull;
  graph_options.wait_sleep_ns = static_cast<uint32_t>(tuning.wait_sleep_cap_ns);
  graph_options.record_sm_ids = tuning.record_sm_ids;
  graph_options.trace_role2 = tuning.trace_role2;
  std::unique_ptr<kernels::LayerGraph> graph;
  std::string message;
  err = kernels::LayerGraph::Create(graph_options, &graph, &message);
  if (err != cudaSuccess) {
    if (err == cudaErrorInvalidValue) return InvalidArgument("cuda backend: " + message);
    return Internal("cuda backend: " + message);
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options, std::move(graph)));
  // Two per DeviceRows range, and a range holds at least one of the shard's rows.
  const size_t fault_bytes = 2 * static_cast<size_t>(std::max(1, options.max_tokens_per_rank)) *
                             sizeof(unsigned long long);
  const size_t staging_bytes = backend->graph_->step_inputs_layout().total;
  for (Lane& lane : backend->lanes_) {
    err = cudaMalloc(&lane.faults, fault_bytes);
    if (err == cudaSuccess)
      err = cudaHostAlloc(&lane.faults_host, fault_bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) return CudaError("allocating the value-check results", err);
    for (cudaEvent_t& event : lane.events) {
      err = cudaEventCreate(&event);
      if (err != cudaSuccess) return CudaError("creating the stage timing events", err);
    }
    err = cudaHostAlloc(&lane.staging, staging_bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      return CudaError("pinning " + std::to_string(staging_bytes) + " bytes for the step tables",
                       err);
    }
  }
  backend->alltoall_ = alltoall;
  backend->dims_ = padded;
  backend->trace_role2_ = graph_options.trace_role2;
  backend->wait_timeout_ = std::chrono::milliseconds(tuning.wait_timeout_ms);
  backend->ipc_name_ = CudaIpcRegionName(backend->graph_->exchange_base(),
                                         backend->graph_->exchange_bytes(), options.device);
  return backend;
}

CudaBackend::CudaBackend(const BackendOptions& options, std::unique_ptr<kernels::LayerGraph> graph)
    : options_(options), graph_(std::move(graph)) {}

Status CudaBackend::SelectDevice() const {
  const cudaError_t err = cudaSetDevice(options_.device);
  return err == cudaSuccess ? Status::Ok() : CudaError("selecting the device", err);
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.device);
  graph_.reset();  // synchronizes before freeing the workspace
  for (Lane& lane : lanes_) {
    for (cudaEvent_t event : lane.events) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (lane.staging != nullptr) cudaFreeHost(lane.staging);
    if (lane.faults != nullptr) cudaFree(lane.faults);
    if (lane.faults_host != nullptr) cudaFreeHost(lane.faults_host);
  }
  for (void* data : registered_) cudaHostUnregister(data);
  nccl_.reset();
  ipc_peers_.Close();
  FreeWeights();
}

std::string CudaBackend::transport_name() const { return ipc_name_; }

Status CudaBackend::ConnectPeers(const PeerSetup& setup) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  GCMOE_RETURN_IF_ERROR(SelectDevice());
  const int world = options_.world_size;
  const int me = options_.rank;
  if (static_cast<int>(setup.peer_names.size()) != world) {
    return InvalidArgument("cuda backend: " + std::to_string(setup.peer_names.size()) +
                           " peer names for a world of " + std::to_string(world));
  }
  connected_ = false;
  if (alltoall_) {
    nccl_.reset();
    GCMOE_ASSIGN_OR_RETURN(nccl_, NcclComm::Init(setup.nccl_unique_id, world, me, options_.device));
  } else {
    GCMOE_ASSIGN_OR_RETURN(
        const std::vector<uint8_t*> bases,
        ipc_peers_.Map(setup.peer_names, me, options_.device,
                       static_cast<uint8_t*>(graph_->exchange_base()), graph_->exchange_bytes()));
    const cudaError_t err = graph_->SetPeerBases(bases);
    if (err != cudaSuccess) return CudaError("installing the peer table", err);
  }
  const cudaError_t err = graph_->ResetSignals();
  if (err != cudaSuccess) return CudaError("resetting the layer signals", err);
  connected_ = true;
  return Status::Ok();
}

void CudaBackend::Abort(uint64_t generation) { graph_->Abort(generation); }

Status CudaBackend::ForceBlockRows(int bm) {
  if (bm != 0 && kernels::BlockSizeIndex(bm) < 0) {
    return InvalidArgument("cuda backend: block size " + std::to_string(bm) +
                           " is not one of 8, 16, 32, 64");
  }
  forced_bm_ = bm;
  return Status::Ok();
}

int BlockRowsForMeanRows(double rows_per_expert) {
  // Each switch sits at the geometric midpoint between the measured means on either side: 8 up
  // to a mean of 0.5 rows, 16 from 1 to 8, 32 at 16, and the wgmma kernel's 64 from a mean of
  // 22.6 = sqrt(16 * 32) (docs/DESIGN-NOTES.md, block size).
  if (rows_per_expert >= 22.6) return 64;
  if (rows_per_expert < 0.71) return 8;   // sqrt(0.5 * 1)
  if (rows_per_expert < 11.3) return 16;  // sqrt(8 * 16)
  return 32;
}

int CudaBackend::MaxTailRows(int bm) const {
  // A merged block's W1 tasks wait for both blocks' ring slots: with one slot the tail's could
  // only be filled after the head's tasks, which wait for it.
  // With the shared expert its stages have no room for the tail's rows (WideTokenRows).
  if (!options_.cuda.merge_tails || bm != kernels::kWgmmaBm || graph_->ring_blocks(bm) < 2 ||
      options_.model.has_shared()) {
    return 0;
  }
  return kernels::kWgmmaMaxTailRows;
}

int CudaBackend::ChooseBlockRows(int64_t rows) const {
  if (forced_bm_ != 0) return forced_bm_;
  return BlockRowsForMeanRows(static_cast<double>(rows) / std::max(1, held_experts_));
}

Status CudaBackend::CheckStep(const StepContext& ctx) const {
  const ModelSpec& m = options_.model;
  const int me = options_.rank;
  if (!connected_) {
    return FailedPrecondition(
        "cuda backend: not connected to the peers (ConnectPeers was not "
        "called, or an aborted step needs a new epoch)");
  }
  if (ctx.layer < 0 || ctx.layer >= static_cast<int>(layers_.size())) {
    return NotFound("cuda backend: layer " + std::to_string(ctx.layer) + " is not loaded");
  }
  if (ctx.num_tokens < 0 || ctx.num_tokens > options_.max_tokens_per_rank) {
    return ResourceExhausted("cuda backend: " + std::to_string(ctx.num_tokens) +
                             " tokens exceed the per-rank capacity of " +
                             std::to_string(options_.max_tokens_per_rank));
  }
  const StepPlan* plan = ctx.plan;
  if (plan == nullptr || plan->world_size != options_.world_size ||
      plan->num_experts != m.num_experts || plan->tokens_per_rank[me] != ctx.num_tokens) {
    return Internal("cuda backend: the step plan does not match this rank's shard");
  }
  for (int q = 0; q < plan->world_size; ++q) {
    if (plan->tokens_per_rank[q] > options_.max_tokens_per_rank) {
      return ResourceExhausted("cuda backend: rank " + std::to_string(q) + "'s " +
                               std::to_string(plan->tokens_per_rank[q]) +
                               " tokens exceed the per-rank capacity of " +
                               std::to_string(options_.max_tokens_per_rank));
    }
  }
  GCMOE_RETURN_IF_ERROR(CheckDeviceRows(ctx));
  if (ctx.hidden.dtype == DType::kFP8E4M3 && ctx.hidden.scales == nullptr && ctx.num_tokens > 0) {
    return InvalidArgument("cuda backend: FP8 hidden without scales");
  }
  const int64_t ids = static_cast<int64_t>(ctx.num_tokens) * m.top_k;
  for (int64_t i = 0; i < ids; ++i) {
    const int32_t e = ctx.topk_ids[i];
    if (e < -1 || e >= m.num_experts) {
      return InvalidArgument("cuda backend: topk_ids[" + std::to_string(i / m.top_k) + "][" +
                             std::to_string(i % m.top_k) + "] is " + std::to_string(e) +
                             ", expected -1.." + std::to_string(m.num_experts - 1));
    }
  }
  for (int e = 0; e < m.num_experts; ++e) {
    const bool home_here = plan->home[e] == me && plan->home_tokens[e] > 0;
    const bool host_here = plan->host[e] == me && plan->expert_tokens[e] > plan->home_tokens[e];
    if ((home_here || host_here) && slot_of_[e] < 0) {
      return Internal("cuda backend: the plan has this rank compute expert " + std::to_string(e) +
                      ", which it does not hold");
    }
  }
  return Status::Ok();
}

Status CudaBackend::CheckDeviceRows(const StepContext& ctx) const {
  int64_t next = 0;  // the first row a range may start at
  int64_t hidden_rows = 0;
  for (const DeviceRows& r : ctx.device_rows) {
    if (r.row < next || r.rows < 1 || r.rows > ctx.num_tokens - r.row) {
      return Internal("cuda backend: GPU-memory rows [" + std::to_string(r.row) + ", " +
                      std::to_string(r.row + r.rows) + ") overlap others or lie beyond the " +
                      std::to_string(ctx.num_tokens) + " rows of the shard");
    }
    next = r.row + r.rows;
    if (r.hidden != nullptr) hidden_rows += r.rows;
  }
  if (hidden_rows > 0 && ctx.hidden.dtype != DType::kBF16 && ctx.hidden.dtype != DType::kFP32) {
    return InvalidArgument("cuda backend: activations in GPU memory must be BF16 or FP32");
  }
  if (ctx.hidden.data == nullptr && hidden_rows < ctx.num_tokens) {
    return Internal("cuda backend: " + std::to_string(ctx.num_tokens - hidden_rows) +
                    " rows of the shard have no activations");
  }
  return Status::Ok();
}

// The baseline's NCCL rounds in bytes: the records out and in, then the partials back the way
// their records came (this rank's own stay where role2 put them).
void CudaBackend::SetAllToAllBytes() {
  const GpuStepTables& t = tables_;
  const int me = options_.rank;
  auto fill = [&](const std::vector<int64_t>& out_start, const std::vector<int64_t>& out_count,
                  const std::vector<int64_t>& in_start, const std::vector<int64_t>& in_count,
                  int64_t unit, bool skip_self, AllToAllLayout* layout) {
    const size_t P = out_start.size();
    layout->send_offset.resize(P);
    layout->send_bytes.resize(P);
    layout->recv_offset.resize(P);
    layout->recv_bytes.resize(P);
    for (size_t q = 0; q < P; ++q) {
      const bool skip = skip_self && static_cast<int>(q) == me;
      layout->send_offset[q] = out_start[q] * unit;
      layout->send_bytes[q] = skip ? 0 : out_count[q] * unit;
      layout->recv_offset[q] = in_start[q] * unit;
      layout->recv_bytes[q] = skip ? 0 : in_count[q] * unit;
    }
  };
  fill(t.send_start, t.send_count, t.recv_start, t.recv_count,
       kernels::A2aRecordBytes(dims_.hidden), false, &records_);
  fill(t.recv_start, t.recv_count, t.send_start, t.send_count,
       static_cast<int64_t>(dims_.hidden) * 2, true, &partials_);
}

Status CudaBackend::Sync(const char* what, const Lane& lane) {
  cudaError_t err = cudaSuccess;
  if (!alltoall_) {
    // The lane's end, not the stream's: the next step may be queued behind it already.
    err = cudaEventSynchronize(lane.events[3]);
  } else {
    // NCCL waits on a dead peer forever: poll, and abandon the communicator on an abort or
    // once the device wait limit has passed.
    const auto start = std::chrono::steady_clock::now();
    while ((err = cudaStreamQuery(graph_->stream())) == cudaErrorNotReady) {
      const bool aborted = graph_->Aborted(lane.generation);
      if (aborted || std::chrono::steady_clock::now() - start > wait_timeout_) {
        nccl_->Abort();
        connected_ = false;
        err = cudaStreamSynchronize(graph_->stream());
        if (!aborted) {
          return DeadlineExceeded(std::string("cuda backend: ") + what +
                                  ": the NCCL exchange did not finish in time (a peer is gone?)");
        }
        break;
      }
      std::this_thread::yield();
    }
  }
  if (err != cudaSuccess) {
    const std::string timeout = graph_->TimeoutDiagnostic();
    return Internal(std::string("cuda backend: ") + what + " failed: " + cudaGetErrorString(err) +
                    (timeout.empty() ? "" : " (" + timeout + ")"));
  }
  return Status::Ok();
}

cudaError_t CudaBackend::LaunchLayer(int bm, Status* nccl_status) {
  if (!alltoall_) return graph_->Replay(bm, tables_.merged_tails());
  using kernels::AllToAllStage;
  kernels::LayerGraph& g = *graph_;
  cudaError_t err = g.LaunchAllToAllStage(AllToAllStage::kQuantize, bm);
  if (err == cudaSuccess) err = g.LaunchAllToAllStage(AllToAllStage::kPack, bm);
  if (err != cudaSuccess) return err;
  *nccl_status = nccl_->AllToAllV(g.a2a_send(), g.a2a_recv(), records_, g.stream());
  if (!nccl_status->ok()) return cudaErrorUnknown;
  err = g.LaunchAllToAllStage(AllToAllStage::kUnpack, bm);
  if (err == cudaSuccess) err = g.LaunchLocalRole2(bm);
  if (err == cudaSuccess) err = g.LaunchAllToAllStage(AllToAllStage::kPackReturn, bm);
  if (err != cudaSuccess) return err;
  *nccl_status =
      nccl_->AllToAllV(reinterpret_cast<const uint8_t*>(g.a2a_ret_send()),
                       reinterpret_cast<uint8_t*>(g.a2a_ret_recv()), partials_, g.stream());
  if (!nccl_status->ok()) return cudaErrorUnknown;
  err = g.LaunchAllToAllStage(AllToAllStage::kUnpackReturn, bm);
  if (err == cudaSuccess) err = g.LaunchLocalRole3(bm);
  return err;
}

Status CudaBackend::Step(const StepContext& ctx, StepOutput* out) {
  GCMOE_RETURN_IF_ERROR(Launch(ctx, out));
  return Finish(ctx.generation, out);
}

void CudaBackend::NoteSticky() {
  // A failed step may have left the context broken: then nothing will run again in this process.
  const cudaError_t err = cudaStreamQuery(graph_->stream());
  if (IsStickyCudaError(err)) {
    std::lock_guard<std::mutex> lost_lock(lost_mutex_);
    lost_ = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  }
}

CudaBackend::Lane* CudaBackend::LaneOf(uint64_t generation) {
  for (Lane& lane : lanes_) {
    if (lane.busy && lane.generation == generation) return &lane;
  }
  return nullptr;
}

Status CudaBackend::Launch(const StepContext& ctx, StepOutput* out) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  if (std::string lost = device_lost(); !lost.empty()) {
    return Internal("cuda backend: the GPU is unusable for this process since an earlier step (" +
                    lost + ")");
  }
  Lane& lane = lanes_[next_lane_];
  if (lane.busy) {
    return FailedPrecondition("cuda backend: step " + std::to_string(ctx.generation) +
                              " launched while two steps are unfinished");
  }
  const bool prefetched = lane.prefetched && lane.generation == ctx.generation;
  lane.prefetched = false;
  lane.generation = ctx.generation;
  lane.ctx = ctx;
  lane.ctx.plan = nullptr;
  Status status = LaunchStep(ctx, out, &lane, prefetched);
  if (status.ok()) {
    lane.busy = true;
    next_lane_ = 1 - next_lane_;
    return status;
  }
  // What was enqueued may still read the lane's staging, which the next launch rewrites.
  if (lane.enqueued) cudaStreamSynchronize(graph_->stream());
  if (status.code() != StatusCode::kInvalidArgument) NoteSticky();
  return status;
}

bool CudaBackend::Done(uint64_t generation) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  const Lane* lane = LaneOf(generation);
  return lane == nullptr || !lane->enqueued || alltoall_ ||
         cudaEventQuery(lane->events[3]) != cudaErrorNotReady;
}

Status CudaBackend::Finish(uint64_t generation, StepOutput* out) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  Lane* lane = LaneOf(generation);
  if (lane == nullptr) {
    return FailedPrecondition("cuda backend: step " + std::to_string(generation) +
                              " is not launched");
  }
  if (lanes_[0].busy && lanes_[1].busy && lane != &lanes_[next_lane_]) {
    return FailedPrecondition("cuda backend: step " + std::to_string(generation) +
                              " finished before the step launched before it");
  }
  lane->busy = false;
  Status status = FinishStep(lane, out);
  if (!status.ok() && status.code() != StatusCode::kInvalidArgument) NoteSticky();
  return status;
}

void CudaBackend::PrefetchInputs(const StepContext& ctx) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  Lane& lane = lanes_[next_lane_];
  if (lane.busy) return;  // Launch refuses the step and says why
  lane.prefetched = false;
  // What Step would refuse is left to Step, which says why.
  const bool fp8 = ctx.hidden.dtype == DType::kFP8E4M3;
  if (ctx.num_tokens <= 0 || ctx.num_tokens > options_.max_tokens_per_rank ||
      (ctx.hidden.data == nullptr && ctx.device_rows.empty()) ||
      (fp8 && ctx.hidden.scales == nullptr) || !CheckDeviceRows(ctx).ok()) {
    return;
  }
  if (!device_lost().empty() || !SelectDevice().ok()) return;
  if (cudaEventRecord(lane.events[0], graph_->stream()) != cudaSuccess) return;
  if (UploadHidden(ctx, &lane) != cudaSuccess) return;  // Launch copies again, reports the error
  lane.prefetched = true;
  lane.generation = ctx.generation;
}

std::string CudaBackend::device_lost() const {
  std::lock_guard<std::mutex> lock(lost_mutex_);
  return lost_;
}

Result<std::shared_ptr<ImportedMemory>> CudaBackend::ImportDeviceMemory(
    const std::string& ipc_handle, int device, uint64_t offset, uint64_t bytes) {
  return ImportCudaIpcMemory(ipc_handle, device, offset, bytes, options_.device);
}

Status CudaBackend::RegisterHostMemory(void* data, size_t bytes) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  GCMOE_RETURN_IF_ERROR(SelectDevice());
  const cudaError_t err = cudaHostRegister(data, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess)
    return CudaError("pinning " + std::to_string(bytes) + " bytes of host memory", err);
  registered_.push_back(data);
  return Status::Ok();
}

void CudaBackend::UnregisterHostMemory(void* data) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  const auto it = std::find(registered_.begin(), registered_.end(), data);
  if (it == registered_.end()) return;
  cudaSetDevice(options_.device);
  cudaHostUnregister(data);
  registered_.erase(it);
}

bool CudaBackend::QueryDeviceMemory(DeviceMemory* memory) const {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (cudaSetDevice(options_.device) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    return false;
  }
  memory->device = options_.device;
  memory->used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
  memory->total_bytes = static_cast<int64_t>(total_bytes);
  return true;
}

void CudaBackend::LogRole2Trace(const kernels::StepHeader& header, int bm,
                                uint64_t generation) const {
  std::vector<kernels::TaskTrace> trace;
  if (const cudaError_t err = graph_->ReadRole2Trace(header, bm, &trace); err != cudaSuccess) {
    spdlog::warn("rank {}: step {}: reading the role2 trace: {}", options_.rank, generation,
                 cudaGetErrorString(err));
    return;
  }
  spdlog::info("rank {}: step {}, {} tokens, {} blocks of {} rows: {}", options_.rank, generation,
               header.num_tokens, header.num_blocks, bm, kernels::SummarizeRole2Trace(trace));
}

Result<std::vector<float>> CudaBackend::TimeReplays(int warmup, int replays) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  GCMOE_RETURN_IF_ERROR(SelectDevice());
  if (last_bm_ == 0) return FailedPrecondition("cuda backend: TimeReplays needs a Step first");
  cudaStream_t s = graph_->stream();
  std::vector<cudaEvent_t> events(static_cast<size_t>(replays) + 1, nullptr);
  cudaError_t err = cudaSuccess;
  for (cudaEvent_t& e : events) {
    if (err == cudaSuccess) err = cudaEventCreate(&e);
  }
  Status nccl_status = Status::Ok();
  for (int i = 0; i < warmup && err == cudaSuccess; ++i) err = LaunchLayer(last_bm_, &nccl_status);
  if (err == cudaSuccess) err = cudaEventRecord(events[0], s);
  for (int i = 0; i < replays && err == cudaSuccess; ++i) {
    err = LaunchLayer(last_bm_, &nccl_status);
    if (err == cudaSuccess) err = cudaEventRecord(events[i + 1], s);
  }
  std::vector<float> times;
  GCMOE_RETURN_IF_ERROR(nccl_status);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  for (int i = 0; i < replays && err == cudaSuccess; ++i) {
    float ms = 0.0f;
    err = cudaEventElapsedTime(&ms, events[i], events[i + 1]);
    times.push_back(ms * 1000.0f);
  }
  for (cudaEvent_t e : events) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (err != cudaSuccess) {
    const std::string timeout = graph_->TimeoutDiagnostic();
    return CudaError("timing replays" + (timeout.empty() ? "" : " (" + timeout + ")"), err);
  }
  if (const std::string broken = graph_->BrokenCheck(); !broken.empty()) {
    return Internal("cuda backend: timing replays: " + broken);
  }
  return times;
}

Status CudaBackend::ReadSmIds(std::vector<int>* role1, std::vector<int>* role2) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  const cudaError_t err = graph_->ReadSmIds(last_bm_, role1, role2);
  return err == cudaSuccess ? Status::Ok() : CudaError("reading SM ids", err);
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace gcmoe::engine
