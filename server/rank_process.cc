#include "server/rank_process.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <tuple>

#include <spdlog/spdlog.h>

#include "common/spin_wait.h"
#include "server/coordinator_server.h"
#include "server/engine_config.h"
#include "server/systemd_notify.h"
#include "server/tls_credentials.h"

namespace gcmoe::server {
namespace {

namespace internal = gcmoe::internal::v1;

engine::DType EngineDType(gcmoe::v1::DType dtype) {
  switch (dtype) {
    case gcmoe::v1::FP32:
      return engine::DType::kFP32;
    case gcmoe::v1::FP8_E4M3:
      return engine::DType::kFP8E4M3;
    case gcmoe::v1::FP16:
      return engine::DType::kFP16;
    default:
      return engine::DType::kBF16;
  }
}

// This rank's rows of the step: 0 for a step that gives none (the engine says what is wrong).
int64_t ShardRows(const internal::Step& step, int rank) {
  return rank < step.tokens_per_rank_size() ? step.tokens_per_rank(rank) : 0;
}

// Whether every row's output went to GPU memory, so that none comes back.
bool AllOutputOnDevice(const internal::Step& step, int64_t shard_rows) {
  int64_t rows = 0;
  for (const internal::DeviceRows& d : step.device_rows()) {
    if (d.output().region() != 0) rows += static_cast<int64_t>(d.rows());
  }
  return rows == shard_rows;
}

// Values found on the GPU that the service refuses: their calls fail, the step did not. The
// messages are the coordinator's for host bytes (server/forward_validation.cc), naming the
// call's rows.
void AddValueErrors(const internal::Step& step, int64_t hidden,
                    const std::vector<engine::DeviceFaults>& faults, internal::StepResult* result) {
  for (int i = 0; i < step.device_rows_size() && i < static_cast<int>(faults.size()); ++i) {
    const int64_t first_row = static_cast<int64_t>(step.device_rows(i).call_row());
    auto element = [first_row, hidden](int64_t index) {
      return "[" + std::to_string(first_row + index / hidden) + ", " +
             std::to_string(index % hidden) + "]";
    };
    std::string message;
    if (const engine::ValueFault& f = faults[i].hidden; f.index >= 0) {
      char text[32];
      std::snprintf(text, sizeof(text), "%g", static_cast<double>(f.value));
      message = "hidden: element " + element(f.index) + " is " +
                (std::isnan(f.value)   ? std::string("NaN, expected finite activations")
                 : std::isinf(f.value) ? std::string("Inf, expected finite activations")
                                       : text + std::string(", expected a magnitude of at most "
                                                            "2^32 (DESIGN.md §4)"));
    } else if (const engine::ValueFault& o = faults[i].output; o.index >= 0) {
      message = "output: element " + element(o.index) + " is " +
                (std::isnan(o.value) ? "NaN" : "Inf") +
                ": the layer overflowed FP32 on this input; expected smaller hidden or "
                "topk_weights (DESIGN.md §4)";
    }
    if (message.empty()) continue;
    internal::ValueError* error = result->add_value_errors();
    error->set_range(static_cast<uint32_t>(i));
    error->set_message(std::move(message));
  }
}

}  // namespace

Result<std::unique_ptr<RankProcess>> RankProcess::Create(const RankProcessOptions& options) {
  GCMOE_ASSIGN_OR_RETURN(AttachSecret secret,
                         AttachSecret::Load(options.config.server.rank_secret_file));
  std::unique_ptr<RankProcess> process(new RankProcess(std::move(secret)));
  process->options_ = options;
  process->spin_ =
      HotPathSpinBudget(options.config.server.spin_wait, options.config.engine.backend);
  GCMOE_ASSIGN_OR_RETURN(BalancerSetup balancing, BalancerFromConfig(options.config));
  const engine::EngineOptions engine_options = EngineOptionsFromConfig(
      options.config, options.rank, process->secret_.InstanceName(options.config.Digest()));
  GCMOE_ASSIGN_OR_RETURN(
      process->engine_,
      engine::Engine::Create(engine_options, std::move(balancing.balancer), balancing.placement));
  return process;
}

RankProcess::~RankProcess() { UnmapIo(); }

void RankProcess::Stop() {
  stop_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (running_generation_ != 0) engine_->Abort(running_generation_);
  if (context_ != nullptr) context_->TryCancel();
  cv_.notify_all();
}

int RankProcess::Run() {
  int exit_code = 0;
  bool ever_attached = false;
  int backoff_ms = 100;
  const auto started = std::chrono::steady_clock::now();
  while (!stop_.load()) {
    const bool reconnect = Session(&exit_code, &ever_attached);
    if (!reconnect || stop_.load()) break;
    if (options_.exit_with_coordinator) {
      const bool startup_over =
          std::chrono::steady_clock::now() - started >
          std::chrono::milliseconds(options_.config.server.startup_timeout_ms);
      if (ever_attached || startup_over) {
        spdlog::info("rank {}: the coordinator is gone; exiting", options_.rank);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 2000);
  }
  return fatal_exit_code_.load() != 0 ? fatal_exit_code_.load() : exit_code;
}

bool RankProcess::Session(int* exit_code, bool* ever_attached) {
  grpc::ChannelArguments args;
  const int max_bytes = static_cast<int>(MaxMessageBytes(options_.config));
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  // Read at every attach, so a rank picks up renewed certificates when it reconnects.
  Result<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      RankChannelCredentials(options_.config.server);
  if (!credentials.ok()) {
    spdlog::error("rank {}: {}", options_.rank, credentials.status().message());
    *exit_code = kExitStartFailed;
    return false;
  }
  auto channel = grpc::CreateCustomChannel(options_.coordinator, *credentials, args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(1))) {
    spdlog::debug("rank {}: coordinator {} not reachable yet", options_.rank, options_.coordinator);
    // A coordinator that is still starting is the usual reason; a refused TLS handshake looks
    // the same from here (only the coordinator's log names the certificate), so say so.
    ++failed_connects_;
    if (failed_connects_ % 30 == 3) {
      spdlog::warn("rank {}: cannot connect to the coordinator at {} ({} attempts){}",
                   options_.rank, options_.coordinator, failed_connects_,
                   options_.config.server.rank_tls.cert.empty()
                       ? ""
                       : " over mutual TLS: is it up, and did server.rank_tls.ca sign both "
                         "its certificate and this rank's?");
    }
    return true;
  }
  failed_connects_ = 0;
  auto stub = internal::RankControl::NewStub(channel);
  grpc::ClientContext context;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.load()) return false;
    context_ = &context;
    session_over_ = false;
    queue_.clear();
    queued_.store(false);
  }
  std::unique_ptr<Stream> stream = stub->Attach(&context);

  // The coordinator speaks first: a nonce this rank's Hello proves the attach secret against.
  internal::CoordinatorMessage message;
  bool reconnect = true;
  if (!stream->Read(&message) || !message.has_challenge()) {
    context.TryCancel();
    const grpc::Status status = stream->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      context_ = nullptr;
    }
    spdlog::warn("rank {}: {} sent no attach challenge ({})", options_.rank, options_.coordinator,
                 status.ok() ? "stream closed" : status.error_message());
    return true;
  }
  static const uint64_t incarnation = std::random_device{}() * 0x100000000ull ^ getpid();
  internal::RankMessage hello_message;
  internal::Hello* hello = hello_message.mutable_hello();
  hello->set_rank(options_.rank);
  hello->set_world_size(options_.config.parallel.ranks);
  hello->set_config_digest(options_.config.Digest());
  hello->set_pid(getpid());
  hello->set_transport_name(engine_->transport_name());
  hello->set_incarnation(incarnation);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  hello->set_host(host);
  hello->set_attach_proof(secret_.Proof(message.challenge().nonce(), *hello));

  if (stream->Write(hello_message)) {
    std::thread worker([this, &stream] { WorkerLoop(stream.get()); });
    bool announced = false;
    while (stream->Read(&message)) {
      if (message.has_reject()) {
        if (message.reject().retryable()) {
          spdlog::warn("rank {}: the coordinator cannot admit this rank yet ({}); dialing again",
                       options_.rank, message.reject().reason());
        } else {
          spdlog::error(
              "rank {}: the coordinator refused this rank: {} (this rank's config "
              "digest is {})",
              options_.rank, message.reject().reason(), options_.config.Digest());
          *exit_code = kExitRefused;
          reconnect = false;
        }
        break;
      }
      if (!announced) {
        spdlog::info("rank {}: attached to coordinator {}", options_.rank, options_.coordinator);
        announced = true;
        *ever_attached = true;
      }
      if (message.has_abort()) {
        std::lock_guard<std::mutex> lock(mu_);
        engine_->Abort(message.abort().generation());
        spdlog::warn("rank {}: step {} aborted: {}", options_.rank, message.abort().generation(),
                     message.abort().reason());
      } else if (message.has_shutdown()) {
        spdlog::info("rank {}: shutting down ({})", options_.rank, message.shutdown().reason());
        reconnect = false;
        break;
      } else if (message.has_setup() || message.has_step() || message.has_open_region() ||
                 message.has_close_region()) {
        const int64_t received_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count();
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(Received{std::move(message), received_ns});
        queued_.store(true, std::memory_order_release);
        cv_.notify_all();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      session_over_ = true;
      if (running_generation_ != 0) engine_->Abort(running_generation_);
      cv_.notify_all();
    }
    worker.join();
    device_regions_.clear();  // the registrations were the coordinator's session's
    UnmapIo();  // the coordinator's next session brings a new region
    context.TryCancel();
  }
  const grpc::Status status = stream->Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
  }
  if (reconnect && !stop_.load()) {
    spdlog::warn("rank {}: lost the coordinator ({})", options_.rank,
                 status.ok() ? "stream closed" : status.error_message());
  }
  return reconnect;
}

void RankProcess::WorkerLoop(Stream* stream) {
  for (;;) {
    // A step in flight is answered once the device is done with it, unless the next step comes
    // first: that one is launched behind it, so that its host work overlaps this one's device
    // work.
    if (!in_flight_.empty() && !NextStepFirst()) {
      FinishStep(stream);
      continue;
    }
    Received received;
    {
      // The next step usually comes within the spin (at once when the coordinator sent it while
      // this one ran): no wake-up from sleep between steps.
      SpinUntil([this] { return queued_.load(std::memory_order_acquire) || stop_.load(); }, spin_);
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return session_over_ || stop_.load() || !queue_.empty(); });
      if (session_over_ || stop_.load()) {
        lock.unlock();
        // Their device work reads and writes memory this session holds: wait for it.
        while (!in_flight_.empty()) FinishStep(stream);
        return;
      }
      received = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(!queue_.empty(), std::memory_order_release);
      if (received.message.has_step()) running_generation_ = received.message.step().generation();
    }
    const internal::CoordinatorMessage& message = received.message;
    // Only a step comes in while another is in flight (NextStepFirst).
    if (message.has_setup()) {
      HandleSetup(message.setup(), stream);
    } else if (message.has_open_region()) {
      const Status status = OpenRegion(message.open_region());
      internal::RankMessage reply;
      internal::RegionOpened* opened = reply.mutable_region_opened();
      opened->set_id(message.open_region().id());
      if (!status.ok()) {
        opened->set_code(static_cast<int>(status.code()));
        opened->set_error(status.message());
      }
      stream->Write(reply);
    } else if (message.has_close_region()) {
      // A step still using it holds its own reference.
      device_regions_.erase(message.close_region().id());
    } else if (message.has_step()) {
      StepInFlight* step =
          in_flight_.empty() || in_flight_.front() != &steps_[0] ? &steps_[0] : &steps_[1];
      LaunchStep(std::move(received), step);
      if (!engine_->pipelines()) FinishStep(stream);
    }
  }
}

bool RankProcess::NextStepFirst() {
  if (in_flight_.size() >= 2 || !engine_->pipelines()) return false;
  const StepInFlight& oldest = *in_flight_.front();
  const uint64_t generation = oldest.received.message.step().generation();
  while (oldest.launched && !engine_->Done(generation) &&
         !queued_.load(std::memory_order_acquire) && !stop_.load()) {
    std::this_thread::yield();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return !session_over_ && !stop_.load() && !queue_.empty() && queue_.front().message.has_step();
}

bool RankProcess::SampleGpuMemory(bool force, gcmoe::v1::GpuMemory* memory) {
  // Often enough for a scrape every few seconds; rare enough that the driver call stays off
  // all but one step a second.
  constexpr auto kMemorySampleInterval = std::chrono::seconds(1);
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - memory_sampled_ < kMemorySampleInterval) return false;
  engine::DeviceMemory device;
  if (!engine_->QueryDeviceMemory(&device)) return false;
  memory_sampled_ = now;
  memory->set_device(device.device);
  memory->set_used_bytes(device.used_bytes);
  memory->set_total_bytes(device.total_bytes);
  return true;
}

void RankProcess::HandleSetup(const internal::Setup& setup, Stream* stream) {
  std::vector<std::string> peers(setup.peer_transport_names().begin(),
                                 setup.peer_transport_names().end());
  Status status = Status::Ok();
  if (setup.has_placement()) {
    balancer::Placement placement;
    placement.num_ranks = options_.config.parallel.ranks;
    placement.num_experts = options_.config.model.experts;
    placement.home.assign(setup.placement().home().begin(), setup.placement().home().end());
    placement.host.assign(setup.placement().host().begin(), setup.placement().host().end());
    status = placement.Validate();
    if (status.ok()) status = engine_->SetPlacement(placement);
    if (status.ok()) placement_version_ = setup.placement().version();
  }
  const std::string io_error = MapIo(setup);
  // The registrations live now: those already open stay, the others open, the rest close.
  std::map<uint64_t, std::shared_ptr<engine::ImportedMemory>> kept;
  std::vector<internal::RegionOpened> unopened;
  for (const internal::DeviceRegion& region : setup.device_regions()) {
    const auto open = device_regions_.find(region.id());
    if (open != device_regions_.end()) {
      kept.insert(*open);
      continue;
    }
    if (const Status opened = OpenRegion(region); !opened.ok()) {
      spdlog::error("rank {}: cannot reopen registered GPU memory {}: {}", options_.rank,
                    region.id(), opened.ToString());
      internal::RegionOpened failure;
      failure.set_id(region.id());
      failure.set_code(static_cast<int>(opened.code()));
      failure.set_error(opened.message());
      unopened.push_back(std::move(failure));
      continue;
    }
    kept.insert(*device_regions_.find(region.id()));
  }
  device_regions_ = std::move(kept);
  engine::PeerSetup peer_setup;
  peer_setup.epoch = setup.epoch();
  peer_setup.peer_names = peers;
  peer_setup.nccl_unique_id = setup.nccl_unique_id();
  if (status.ok()) status = engine_->Connect(peer_setup);
  internal::RankMessage reply;
  reply.mutable_ready()->set_epoch(setup.epoch());
  reply.mutable_ready()->set_io_error(io_error);
  for (internal::RegionOpened& failure : unopened) {
    *reply.mutable_ready()->add_unopened_regions() = std::move(failure);
  }
  gcmoe::v1::GpuMemory memory;
  if (SampleGpuMemory(/*force=*/true, &memory))
    *reply.mutable_ready()->mutable_gpu_memory() = memory;
  if (!status.ok()) {
    reply.mutable_ready()->set_error(status.ToString());
    spdlog::error("rank {}: epoch {} setup failed: {}", options_.rank, setup.epoch(),
                  status.ToString());
  } else {
    spdlog::info("rank {}: connected to {} peer(s) for epoch {}", options_.rank, peers.size() - 1,
                 setup.epoch());
    // A rank unit (Type=notify) is active once its rank has joined an epoch; later READYs
    // are ignored by systemd.
    NotifySystemd("READY=1\nSTATUS=rank " + std::to_string(options_.rank) + " ready in epoch " +
                  std::to_string(setup.epoch()));
  }
  stream->Write(reply);
}

Status RankProcess::OpenRegion(const internal::DeviceRegion& region) {
  GCMOE_ASSIGN_OR_RETURN(std::shared_ptr<engine::ImportedMemory> memory,
                         engine_->ImportDeviceMemory(region.ipc_handle(), region.device(),
                                                     region.offset(), region.byte_size()));
  spdlog::info("rank {}: opened registered GPU memory {} ({} bytes on device {})", options_.rank,
               region.id(), region.byte_size(), region.device());
  device_regions_[region.id()] = std::move(memory);
  return Status::Ok();
}

Result<std::pair<std::shared_ptr<engine::ImportedMemory>, uint8_t*>> RankProcess::ResolveSpan(
    const std::string& field, const internal::DeviceSpan& span) const {
  const auto found = device_regions_.find(span.region());
  if (found == device_regions_.end()) {
    return FailedPrecondition(field + ": registered GPU memory " + std::to_string(span.region()) +
                              " is not open on rank " + std::to_string(options_.rank));
  }
  const uint64_t size = found->second->size;
  if (span.offset() > size || span.byte_size() > size - span.offset()) {
    return Internal(field + ": bytes beyond registered GPU memory " +
                    std::to_string(span.region()));
  }
  return std::make_pair(found->second, found->second->data + span.offset());
}

void RankProcess::UnmapIo() {
  if (!io_) return;
  doorbell_stop_.store(true);
  io_->Wake(RankIo::kToRank);
  if (doorbell_.joinable()) doorbell_.join();
  engine_->UnregisterHostMemory(io_->base());
  io_.reset();
}

void RankProcess::DoorbellLoop() {
  uint32_t seen = io_->sequence(RankIo::kToRank);
  std::string bytes;
  while (!doorbell_stop_.load()) {
    if (!io_->Wait(RankIo::kToRank, &seen, spin_, std::chrono::milliseconds(100), &bytes)) continue;
    Received received;
    received.received_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
    received.doorbell = true;
    if (!received.message.mutable_step()->ParseFromString(bytes)) {
      spdlog::error("rank {}: an unreadable step in the I/O region", options_.rank);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(received));
    queued_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
}

std::string RankProcess::MapIo(const internal::Setup& setup) {
  if (io_ && io_->name() == setup.io_region()) return "";
  UnmapIo();
  if (setup.io_region().empty()) return "";
  const config::Config& c = options_.config;
  const RankIoLayout layout = RankIoLayout::For(c.engine.max_tokens_per_rank, c.model.hidden,
                                                c.model.top_k, RankIo::kSlots);
  if (setup.io_slots() != static_cast<uint32_t>(layout.slots) ||
      setup.io_bytes() != layout.total_bytes) {
    return "the I/O region has " + std::to_string(setup.io_slots()) + " slots of " +
           std::to_string(setup.io_bytes()) + " bytes in all; this rank's config gives " +
           std::to_string(layout.slots) + " and " + std::to_string(layout.total_bytes);
  }
  Result<std::unique_ptr<RankIo>> io = RankIo::Open(setup.io_region(), layout);
  if (!io.ok()) return io.status().ToString();
  if (const Status pinned = engine_->RegisterHostMemory((*io)->base(), (*io)->bytes());
      !pinned.ok()) {
    return pinned.ToString();
  }
  io_ = std::move(*io);
  doorbell_stop_.store(false);
  doorbell_ = std::thread([this] { DoorbellLoop(); });
  spdlog::info("rank {}: inputs and outputs through {} ({} bytes)", options_.rank, io_->name(),
               io_->bytes());
  return "";
}

void RankProcess::LaunchStep(Received received, StepInFlight* in_flight) {
  in_flight->received = std::move(received);
  in_flight->launched = false;
  in_flight->held.clear();
  in_flight->device_rows.clear();
  in_flight_.push_back(in_flight);
  const internal::Step& step = in_flight->received.message.step();
  in_flight->tokens_per_rank.assign(step.tokens_per_rank().begin(), step.tokens_per_rank().end());
  const std::vector<int>& tokens_per_rank = in_flight->tokens_per_rank;
  engine::StepRequest& request = in_flight->request;
  request = engine::StepRequest{};
  request.generation = step.generation();
  request.layer = static_cast<int>(step.layer());
  request.tokens_per_rank = tokens_per_rank;
  request.counts = std::span<const int64_t>(step.counts().data(), step.counts().size());
  request.hidden.dtype = EngineDType(step.hidden().dtype());
  request.output_fp32 = step.output_dtype() == gcmoe::v1::FP32;
  request.relief_passes = static_cast<int>(step.relief_passes());
  Status status = Status::Ok();
  engine::StepOutput& output = in_flight->output;
  output.destination = {};
  if (step.io()) {
    // The shard is in the I/O region's slot, and the output goes there.
    const int slot = static_cast<int>(step.io_slot());
    const int me = options_.rank;
    if (!io_ || slot < 0 || slot >= io_->layout().slots ||
        me >= static_cast<int>(tokens_per_rank.size()) ||
        tokens_per_rank[me] > io_->layout().max_tokens) {
      status = Internal("step " + std::to_string(step.generation()) + " names I/O slot " +
                        std::to_string(slot) +
                        (io_ ? " beyond this rank's region" : " but this rank has no I/O region"));
    } else {
      request.hidden.data = io_->hidden(slot);
      request.hidden.scales = io_->scales(slot);
      request.topk_ids = reinterpret_cast<const int32_t*>(io_->ids(slot));
      request.topk_weights = reinterpret_cast<const float*>(io_->weights(slot));
      output.destination = std::span<uint8_t>(io_->output(slot), io_->layout().output_bytes);
    }
  } else {
    request.hidden.data = step.hidden().data().data();
    request.hidden.scales = reinterpret_cast<const uint8_t*>(step.hidden_scales().data().data());
    request.topk_ids = reinterpret_cast<const int32_t*>(step.topk_ids().data().data());
    request.topk_weights = reinterpret_cast<const float*>(step.topk_weights().data().data());
  }
  // Calls' activations or outputs in a client's GPU memory (the coordinator checked the spans
  // against the registrations; the rank against what it opened).
  std::vector<engine::DeviceRows>& device_rows = in_flight->device_rows;
  const int64_t H = options_.config.model.hidden;
  const int64_t shard_rows = ShardRows(step, options_.rank);
  const size_t in_row_bytes = static_cast<size_t>(H) * engine::DTypeBytes(request.hidden.dtype);
  const size_t out_row_bytes = static_cast<size_t>(H) * (request.output_fp32 ? 4 : 2);
  int64_t device_hidden_rows = 0;
  for (const internal::DeviceRows& d : step.device_rows()) {
    if (!status.ok()) break;
    engine::DeviceRows rows;
    rows.row = static_cast<int64_t>(d.shard_row());
    rows.rows = static_cast<int64_t>(d.rows());
    for (const auto& [field, span, row_bytes] :
         {std::tuple{"hidden.region", &d.hidden(), in_row_bytes},
          std::tuple{"output_region", &d.output(), out_row_bytes}}) {
      if (span->region() == 0) continue;
      auto resolved = ResolveSpan(field, *span);
      status = resolved.status();
      if (status.ok() && span->byte_size() != d.rows() * row_bytes) {
        status = Internal(std::string(field) + ": a span of " + std::to_string(span->byte_size()) +
                          " bytes for " + std::to_string(d.rows()) + " rows");
      }
      if (!status.ok()) break;
      in_flight->held.push_back(resolved->first);
      if (span == &d.hidden()) {
        rows.hidden = resolved->second;
        device_hidden_rows += rows.rows;
      } else {
        rows.output = resolved->second;
      }
    }
    device_rows.push_back(rows);
  }
  if (status.ok() && !device_rows.empty()) {
    request.device_rows = device_rows;
    // Every row's activations in GPU memory: nothing to read from the host.
    if (device_hidden_rows == shard_rows) request.hidden.data = nullptr;
  }
  if (status.ok() && step.placement_version() != placement_version_) {
    status = Internal("step " + std::to_string(step.generation()) + " is for placement version " +
                      std::to_string(step.placement_version()) + ", this rank holds version " +
                      std::to_string(placement_version_));
  }
  if (status.ok()) status = engine_->Launch(request, &output, &in_flight->stats);
  in_flight->launched = status.ok();
  in_flight->status = status;
}

void RankProcess::FinishStep(Stream* stream) {
  StepInFlight& in_flight = *in_flight_.front();
  const Received& received = in_flight.received;
  const internal::Step& step = received.message.step();
  Status status = in_flight.status;
  if (in_flight.launched) {
    status = engine_->Finish(step.generation(), &in_flight.output, &in_flight.stats);
    in_flight.launched = false;
  }
  in_flight.held.clear();  // the device is done with the clients' memory
  const engine::StepOutput& output = in_flight.output;
  const engine::StepStats& stats = in_flight.stats;
  const bool output_fp32 = in_flight.request.output_fp32;
  const int64_t H = options_.config.model.hidden;
  internal::RankMessage reply;
  internal::StepResult* result = reply.mutable_step_result();
  result->set_generation(step.generation());
  result->set_code(static_cast<int>(status.code()));
  if (!status.ok()) {
    result->set_message(status.message());
    spdlog::warn("rank {}: step {} failed: {}", options_.rank, step.generation(),
                 status.ToString());
  } else {
    gcmoe::v1::Tensor* out = result->mutable_output();
    out->set_dtype(output_fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    out->add_shape(in_flight.tokens_per_rank[options_.rank]);
    out->add_shape(H);
    if (!step.io() && !AllOutputOnDevice(step, ShardRows(step, options_.rank))) {
      out->set_data(output.output.data(), output.output.size());
    }
    AddValueErrors(step, H, output.device_faults, result);
    result->mutable_load_before()->Assign(stats.load_before.begin(), stats.load_before.end());
    result->mutable_load_after()->Assign(stats.load_after.begin(), stats.load_after.end());
    result->set_relief_passes(stats.passes);
    result->set_relief_solve_ns(stats.solve_ns);
    result->set_engine_ns(stats.engine_ns);
    result->set_assignments_computed(stats.assignments_computed);
    result->set_host_ns(stats.host_ns);
    result->set_h2d_ns(stats.h2d_ns);
    result->set_device_ns(stats.device_ns);
    result->set_d2h_ns(stats.d2h_ns);
  }
  gcmoe::v1::GpuMemory memory;
  if (SampleGpuMemory(/*force=*/false, &memory)) *result->mutable_gpu_memory() = memory;
  result->set_received_ns(received.received_ns);
  result->set_replied_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count());
  // Back the way the step came: the doorbell, or the control stream (also when it does not fit).
  if (!(received.doorbell && io_ &&
        io_->Post(RankIo::kToCoordinator, result->SerializeAsString()))) {
    stream->Write(reply);
  }
  in_flight_.pop_front();
  if (in_flight_.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    running_generation_ = 0;
  }
  if (!status.ok()) {
    if (const std::string lost = engine_->device_lost(); !lost.empty()) {
      spdlog::critical(
          "rank {}: its GPU is unusable for this process after step {} ({}); exiting with code "
          "{} so that it is restarted",
          options_.rank, step.generation(), lost, kExitDeviceLost);
      fatal_exit_code_.store(kExitDeviceLost);
      Stop();
    }
  }
}

}  // namespace gcmoe::server
