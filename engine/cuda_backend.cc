#include "engine/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "kernels/weight_tiles_sm90.h"

namespace gcmoe::engine {
namespace {

using kernels::TileFormat;

Status CudaError(const std::string& what, cudaError_t err) {
  return Internal("cuda backend: " + what + ": " + cudaGetErrorString(err));
}

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

int32_t InputDType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return kernels::kInBF16;
    case DType::kFP32:
      return kernels::kInFP32;
    case DType::kFP16:
      return kernels::kInFP16;
    case DType::kFP8E4M3:
      return kernels::kInFP8;
  }
  return kernels::kInBF16;
}

// Packs one matrix into tiles on the host and uploads it.
Status UploadTiles(bool gated, TileFormat format, const std::vector<uint8_t>& codes,
                   const std::vector<uint8_t>& scales, int rows_or_inter, int k, uint8_t* dst,
                   std::vector<uint8_t>* staging) {
  const int64_t bytes = gated ? kernels::GatedTilesBytes(format, rows_or_inter, k)
                              : kernels::PlainTilesBytes(format, rows_or_inter, k);
  staging->resize(static_cast<size_t>(bytes));
  if (gated) {
    kernels::PackGatedTiles(format, codes.data(), scales.data(), rows_or_inter, k, staging->data());
  } else {
    kernels::PackPlainTiles(format, codes.data(), scales.data(), rows_or_inter, k, staging->data());
  }
  const cudaError_t err = cudaMemcpy(dst, staging->data(), bytes, cudaMemcpyHostToDevice);
  return err == cudaSuccess ? Status::Ok() : CudaError("uploading weights", err);
}

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const BackendOptions& options) {
  // Before the process's first CUDA call (a no-op if something initialized CUDA already; the
  // layer graph also loads every kernel explicitly).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  const ModelSpec& m = options.model;
  GCMOE_RETURN_IF_ERROR(m.Validate());
  if (options.world_size != 1 || options.rank != 0) {
    return Unimplemented("cuda backend: runs one rank per service today (parallel.ranks = 1); " +
                         std::to_string(options.world_size) +
                         " ranks need the multi-GPU peer mapping, not built yet");
  }
  if (m.hidden % 128 != 0 || m.intermediate % 128 != 0 || m.shared_intermediate % 128 != 0) {
    return InvalidArgument(
        "cuda backend: model.hidden, model.intermediate and "
        "model.shared_intermediate must be multiples of 128 (got " +
        std::to_string(m.hidden) + ", " + std::to_string(m.intermediate) + ", " +
        std::to_string(m.shared_intermediate) + ")");
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
  cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, options.device)) != cudaSuccess) {
    return CudaError("reading the device properties", err);
  }
  if (prop.major != 9 || prop.minor != 0) {
    return Unavailable("cuda backend: the kernels are built for sm_90a (H100/H200/H20); device " +
                       std::to_string(options.device) + " is " + prop.name + ", compute " +
                       std::to_string(prop.major) + "." + std::to_string(prop.minor));
  }

  kernels::LayerGraphOptions graph_options;
  kernels::LayerDims& d = graph_options.dims;
  d.hidden = m.hidden;
  d.intermediate = m.intermediate;
  d.shared_intermediate = m.shared_intermediate;
  d.num_experts = m.num_experts;
  d.local_experts = m.num_experts;  // P = 1 holds every expert
  d.top_k = m.top_k;
  d.capacity = options.max_tokens_per_rank;
  d.world_size = options.world_size;
  d.rank = options.rank;
  d.has_clamp = m.activation_clamp.has_value() ? 1 : 0;
  d.alpha = m.activation_alpha;
  d.clamp = m.activation_clamp.value_or(0.0f);
  graph_options.device = options.device;
  graph_options.dispatch_sms = options.dispatch_sms;
  graph_options.ring_blocks = EnvInt("GCMOE_CUDA_RING_BLOCKS", 0);
  graph_options.sequential = EnvInt("GCMOE_CUDA_SEQUENTIAL", 0) != 0;
  graph_options.timeout_ns =
      static_cast<uint64_t>(std::max(1, EnvInt("GCMOE_CUDA_WAIT_TIMEOUT_MS", 5000))) * 1000000ull;
  graph_options.record_sm_ids = EnvInt("GCMOE_CUDA_RECORD_SM_IDS", 0) != 0;
  if (const char* gemm = std::getenv("GCMOE_CUDA_GEMM"); gemm != nullptr && *gemm != '\0') {
    const std::string name = gemm;
    if (name == "mma") {
      graph_options.gemm = kernels::GemmKernel::kMmaSync;
    } else if (name == "stream") {
      graph_options.gemm = kernels::GemmKernel::kStreamMma;
    } else if (name == "wgmma") {
      graph_options.gemm = kernels::GemmKernel::kStreamWgmma;
    } else {
      return InvalidArgument("cuda backend: GCMOE_CUDA_GEMM is wgmma, stream or mma, not " + name);
    }
  }
  std::unique_ptr<kernels::LayerGraph> graph;
  std::string message;
  err = kernels::LayerGraph::Create(graph_options, &graph, &message);
  if (err != cudaSuccess) {
    if (err == cudaErrorInvalidValue) return InvalidArgument("cuda backend: " + message);
    return Internal("cuda backend: " + message);
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(options, std::move(graph)));
}

CudaBackend::CudaBackend(const BackendOptions& options, std::unique_ptr<kernels::LayerGraph> graph)
    : options_(options), graph_(std::move(graph)) {}

CudaBackend::~CudaBackend() {
  graph_.reset();  // synchronizes before freeing the workspace
  FreeWeights();
}

void CudaBackend::FreeWeights() {
  for (LayerWeights& l : layers_) {
    for (void* p : {l.w1, l.w2, l.ws1, l.ws2}) {
      if (p != nullptr) cudaFree(p);
    }
  }
  layers_.clear();
}

Status CudaBackend::LoadExperts(const WeightSource& source, std::span<const int> experts) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  const ModelSpec& m = options_.model;
  const int H = m.hidden;
  const int I = m.intermediate;
  const int Is = m.shared_intermediate;
  FreeWeights();
  slot_of_.assign(m.num_experts, -1);
  held_experts_ = static_cast<int>(experts.size());
  for (int slot = 0; slot < held_experts_; ++slot) {
    const int e = experts[slot];
    if (e < 0 || e >= m.num_experts || slot_of_[e] >= 0) {
      return InvalidArgument("cuda backend: expert " + std::to_string(e) +
                             " is out of range or listed twice");
    }
    slot_of_[e] = slot;
  }
  const int64_t w1_bytes = kernels::GatedTilesBytes(TileFormat::kE2M1, I, H);
  const int64_t w2_bytes = kernels::PlainTilesBytes(TileFormat::kE2M1, H, I);
  std::vector<uint8_t> staging;
  layers_.resize(m.num_layers);
  for (int l = 0; l < m.num_layers; ++l) {
    LayerWeights& lw = layers_[l];
    cudaError_t err = cudaMalloc(&lw.w1, std::max<int64_t>(1, w1_bytes * held_experts_));
    if (err == cudaSuccess)
      err = cudaMalloc(&lw.w2, std::max<int64_t>(1, w2_bytes * held_experts_));
    if (err != cudaSuccess) return CudaError("allocating layer " + std::to_string(l), err);
    for (int slot = 0; slot < held_experts_; ++slot) {
      GCMOE_ASSIGN_OR_RETURN(ExpertWeights w, source.LoadExpert(l, experts[slot]));
      if (w.w1.size() != static_cast<size_t>(2) * I * H / 2 ||
          w.w2.size() != static_cast<size_t>(H) * I / 2) {
        return Internal("cuda backend: expert " + std::to_string(experts[slot]) + " of layer " +
                        std::to_string(l) + " has unexpected sizes");
      }
      GCMOE_RETURN_IF_ERROR(UploadTiles(true, TileFormat::kE2M1, w.w1, w.w1_scales, I, H,
                                        static_cast<uint8_t*>(lw.w1) + slot * w1_bytes, &staging));
      GCMOE_RETURN_IF_ERROR(UploadTiles(false, TileFormat::kE2M1, w.w2, w.w2_scales, H, I,
                                        static_cast<uint8_t*>(lw.w2) + slot * w2_bytes, &staging));
    }
    if (m.has_shared()) {
      GCMOE_ASSIGN_OR_RETURN(SharedExpertWeights w, source.LoadShared(l));
      const int64_t s1 = kernels::GatedTilesBytes(TileFormat::kE4M3, Is, H);
      const int64_t s2 = kernels::PlainTilesBytes(TileFormat::kE4M3, H, Is);
      err = cudaMalloc(&lw.ws1, s1);
      if (err == cudaSuccess) err = cudaMalloc(&lw.ws2, s2);
      if (err != cudaSuccess) return CudaError("allocating the shared expert", err);
      GCMOE_RETURN_IF_ERROR(UploadTiles(true, TileFormat::kE4M3, w.w1, w.w1_scales, Is, H,
                                        static_cast<uint8_t*>(lw.ws1), &staging));
      GCMOE_RETURN_IF_ERROR(UploadTiles(false, TileFormat::kE4M3, w.w2, w.w2_scales, H, Is,
                                        static_cast<uint8_t*>(lw.ws2), &staging));
    }
  }
  return Status::Ok();
}

std::string CudaBackend::transport_name() const {
  return "cuda:" + options_.instance + ":" + std::to_string(options_.rank);
}

Status CudaBackend::ConnectPeers(uint64_t /*epoch*/, std::span<const std::string> peer_names) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  if (static_cast<int>(peer_names.size()) != options_.world_size) {
    return InvalidArgument("cuda backend: " + std::to_string(peer_names.size()) +
                           " peer names for a world of " + std::to_string(options_.world_size));
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

int CudaBackend::ChooseBlockRows(int64_t rows) const {
  if (forced_bm_ != 0) return forced_bm_;
  const double per_expert = static_cast<double>(rows) / std::max(1, held_experts_);
  const double want = per_expert + std::sqrt(per_expert);
  for (int bm : kernels::kBlockSizes) {
    if (bm >= want) return bm;
  }
  return 64;
}

Status CudaBackend::CheckStep(const StepContext& ctx) const {
  const ModelSpec& m = options_.model;
  if (!connected_) return FailedPrecondition("cuda backend: ConnectPeers was not called");
  if (ctx.layer < 0 || ctx.layer >= static_cast<int>(layers_.size())) {
    return NotFound("cuda backend: layer " + std::to_string(ctx.layer) + " is not loaded");
  }
  if (ctx.num_tokens < 0 || ctx.num_tokens > options_.max_tokens_per_rank) {
    return ResourceExhausted("cuda backend: " + std::to_string(ctx.num_tokens) +
                             " tokens exceed the per-rank capacity of " +
                             std::to_string(options_.max_tokens_per_rank));
  }
  const StepPlan* plan = ctx.plan;
  if (plan == nullptr || plan->world_size != 1 || plan->num_experts != m.num_experts ||
      plan->tokens_per_rank[0] != ctx.num_tokens) {
    return Internal("cuda backend: the step plan does not match this rank's shard");
  }
  if (ctx.hidden.dtype == DType::kFP8E4M3 && ctx.hidden.scales == nullptr) {
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
    if (e >= 0 && slot_of_[e] < 0) {
      return Internal("cuda backend: expert " + std::to_string(e) + " is not held here");
    }
  }
  return Status::Ok();
}

// The receive index of this rank lists, expert after expert (ascending id), the positions of
// each held expert it computes; role1 fills it, the blocks below cut it into ring blocks.
int64_t CudaBackend::BuildTables(const StepContext& ctx, int bm) {
  const StepPlan& plan = *ctx.plan;
  const int E = options_.model.num_experts;
  const int me = options_.rank;
  routes_.resize(E);
  blocks_.clear();
  int64_t rows = 0;
  for (int e = 0; e < E; ++e) {
    const int64_t total = plan.expert_tokens[e];
    const int64_t at_home = plan.home_tokens[e];
    kernels::ExpertRoute& r = routes_[e];
    r = kernels::ExpertRoute{};
    r.home_rank = plan.home[e];
    r.host_rank = plan.host[e];
    r.home_tokens = static_cast<int32_t>(at_home);
    r.src_offset = static_cast<int32_t>(plan.src_offset[static_cast<size_t>(me) * E + e]);
    int64_t mine = 0;  // positions of e computed here
    if (plan.home[e] == me) {
      r.home_base = static_cast<int32_t>(rows);
      mine = at_home;
    } else if (plan.host[e] == me) {
      r.host_base = static_cast<int32_t>(rows);
      mine = total - at_home;
    }
    for (int64_t b = 0; b < mine; b += bm) {
      blocks_.push_back(kernels::RingBlock{slot_of_[e], static_cast<int32_t>(rows + b),
                                           static_cast<int32_t>(std::min<int64_t>(bm, mine - b)),
                                           0});
    }
    rows += mine;
  }
  return rows;
}

Status CudaBackend::Sync(const char* what) {
  const cudaError_t err = cudaStreamSynchronize(graph_->stream());
  if (err != cudaSuccess) {
    const std::string timeout = graph_->TimeoutDiagnostic();
    return Internal(std::string("cuda backend: ") + what + " failed: " + cudaGetErrorString(err) +
                    (timeout.empty() ? "" : " (" + timeout + ")"));
  }
  return Status::Ok();
}

Status CudaBackend::Step(const StepContext& ctx, StepOutput* out) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  GCMOE_RETURN_IF_ERROR(CheckStep(ctx));
  const ModelSpec& m = options_.model;
  const int T = ctx.num_tokens;
  const int H = m.hidden;
  const int k = m.top_k;
  const size_t out_bytes = ctx.output_fp32 ? 4 : 2;
  out->output.resize(static_cast<size_t>(T) * H * out_bytes);
  out->assignments_computed = 0;
  if (T == 0) return Status::Ok();

  // Block size from the expected tokens per held expert; rows from the plan.
  int64_t rows = 0;
  for (int e = 0; e < m.num_experts; ++e) rows += ctx.plan->expert_tokens[e];
  const int bm = ChooseBlockRows(rows);
  rows = BuildTables(ctx, bm);
  last_bm_ = bm;

  kernels::StepHeader header{};
  header.generation = ctx.generation;
  header.num_tokens = T;
  header.in_dtype = InputDType(ctx.hidden.dtype);
  header.out_fp32 = ctx.output_fp32 ? 1 : 0;
  header.num_blocks = static_cast<int32_t>(blocks_.size());
  header.num_shared_blocks = m.has_shared() ? (T + bm - 1) / bm : 0;
  const LayerWeights& lw = layers_[ctx.layer];
  header.w1 = static_cast<const uint8_t*>(lw.w1);
  header.w2 = static_cast<const uint8_t*>(lw.w2);
  header.ws1 = static_cast<const uint8_t*>(lw.ws1);
  header.ws2 = static_cast<const uint8_t*>(lw.ws2);

  cudaStream_t s = graph_->stream();
  const size_t in_bytes = static_cast<size_t>(T) * H * DTypeBytes(ctx.hidden.dtype);
  cudaError_t err =
      cudaMemcpyAsync(graph_->header(), &header, sizeof(header), cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess && !blocks_.empty()) {
    err = cudaMemcpyAsync(graph_->blocks(), blocks_.data(),
                          blocks_.size() * sizeof(kernels::RingBlock), cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(graph_->routes(), routes_.data(),
                          routes_.size() * sizeof(kernels::ExpertRoute), cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess) {
    err =
        cudaMemcpyAsync(graph_->hidden_in(), ctx.hidden.data, in_bytes, cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess && ctx.hidden.dtype == DType::kFP8E4M3) {
    err = cudaMemcpyAsync(graph_->hidden_scales_in(), ctx.hidden.scales,
                          static_cast<size_t>(T) * (H / 32), cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(graph_->topk_ids(), ctx.topk_ids, sizeof(int32_t) * T * k,
                          cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(graph_->topk_weights(), ctx.topk_weights, sizeof(float) * T * k,
                          cudaMemcpyHostToDevice, s);
  }
  if (err == cudaSuccess) err = graph_->Replay(bm);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(out->output.data(), graph_->output(), out->output.size(),
                          cudaMemcpyDeviceToHost, s);
  }
  if (err != cudaSuccess) return CudaError("launching step " + std::to_string(ctx.generation), err);
  GCMOE_RETURN_IF_ERROR(Sync("step"));
  if (graph_->Aborted(ctx.generation)) {
    return Aborted("step " + std::to_string(ctx.generation) + " aborted");
  }
  out->assignments_computed = rows;
  return Status::Ok();
}

Result<std::vector<float>> CudaBackend::TimeReplays(int warmup, int replays) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  if (last_bm_ == 0) return FailedPrecondition("cuda backend: TimeReplays needs a Step first");
  cudaStream_t s = graph_->stream();
  std::vector<cudaEvent_t> events(static_cast<size_t>(replays) + 1, nullptr);
  cudaError_t err = cudaSuccess;
  for (cudaEvent_t& e : events) {
    if (err == cudaSuccess) err = cudaEventCreate(&e);
  }
  for (int i = 0; i < warmup && err == cudaSuccess; ++i) err = graph_->Replay(last_bm_);
  if (err == cudaSuccess) err = cudaEventRecord(events[0], s);
  for (int i = 0; i < replays && err == cudaSuccess; ++i) {
    err = graph_->Replay(last_bm_);
    if (err == cudaSuccess) err = cudaEventRecord(events[i + 1], s);
  }
  std::vector<float> times;
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
  return times;
}

Result<double> CudaBackend::MeasureCopyBandwidth(size_t bytes, int reps) {
  std::lock_guard<std::mutex> lock(step_mutex_);
  void* a = nullptr;
  void* b = nullptr;
  cudaStream_t s = graph_->stream();
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaError_t err = cudaMalloc(&a, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&b, bytes);
  if (err == cudaSuccess) err = cudaMemsetAsync(a, 1, bytes, s);
  if (err == cudaSuccess) err = cudaEventCreate(&start);
  if (err == cudaSuccess) err = cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < reps + 1 && err == cudaSuccess; ++i) {
    err = cudaEventRecord(start, s);
    if (err == cudaSuccess) err = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s);
    if (err == cudaSuccess) err = cudaEventRecord(stop, s);
    if (err == cudaSuccess) err = cudaEventSynchronize(stop);
    float t = 0.0f;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&t, start, stop);
    if (i > 0) ms.push_back(t);  // the first copy is a warm-up
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (a != nullptr) cudaFree(a);
  if (b != nullptr) cudaFree(b);
  if (err != cudaSuccess) return CudaError("measuring copy bandwidth", err);
  std::sort(ms.begin(), ms.end());
  const double median_s = ms[ms.size() / 2] * 1e-3;
  return 2.0 * static_cast<double>(bytes) / median_s;
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
