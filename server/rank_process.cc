#include "server/rank_process.h"

#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "server/coordinator_server.h"
#include "server/engine_config.h"

namespace gcmoe::server {
namespace {

namespace internal = gcmoe::internal::v1;

engine::DType EngineDType(gcmoe::v1::DType dtype) {
  switch (dtype) {
    case gcmoe::v1::FP32: return engine::DType::kFP32;
    case gcmoe::v1::FP8_E4M3: return engine::DType::kFP8E4M3;
    case gcmoe::v1::FP16: return engine::DType::kFP16;
    default: return engine::DType::kBF16;
  }
}

}  // namespace

Result<std::unique_ptr<RankProcess>> RankProcess::Create(const RankProcessOptions& options) {
  GCMOE_ASSIGN_OR_RETURN(AttachSecret secret,
                         AttachSecret::Load(options.config.server.rank_secret_file));
  std::unique_ptr<RankProcess> process(new RankProcess(std::move(secret)));
  process->options_ = options;
  GCMOE_ASSIGN_OR_RETURN(BalancerSetup balancing, BalancerFromConfig(options.config));
  const engine::EngineOptions engine_options = EngineOptionsFromConfig(
      options.config, options.rank, process->secret_.InstanceName(options.config.Digest()));
  GCMOE_ASSIGN_OR_RETURN(
      process->engine_,
      engine::Engine::Create(engine_options, std::move(balancing.balancer), balancing.placement));
  return process;
}

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
      const bool startup_over = std::chrono::steady_clock::now() - started >
                                std::chrono::milliseconds(options_.config.server.startup_timeout_ms);
      if (ever_attached || startup_over) {
        spdlog::info("rank {}: the coordinator is gone; exiting", options_.rank);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 2000);
  }
  return exit_code;
}

bool RankProcess::Session(int* exit_code, bool* ever_attached) {
  grpc::ChannelArguments args;
  const int max_bytes = static_cast<int>(MaxMessageBytes(options_.config));
  args.SetMaxReceiveMessageSize(max_bytes);
  args.SetMaxSendMessageSize(max_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  auto channel = grpc::CreateCustomChannel(options_.coordinator,
                                           grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(1))) {
    spdlog::debug("rank {}: coordinator {} not reachable yet", options_.rank,
                  options_.coordinator);
    return true;
  }
  auto stub = internal::RankControl::NewStub(channel);
  grpc::ClientContext context;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_.load()) return false;
    context_ = &context;
    session_over_ = false;
    queue_.clear();
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
          *exit_code = 3;
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
      } else if (message.has_setup() || message.has_step()) {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(message));
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
    internal::CoordinatorMessage message;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return session_over_ || stop_.load() || !queue_.empty(); });
      if (session_over_ || stop_.load()) return;
      message = std::move(queue_.front());
      queue_.pop_front();
      if (message.has_step()) running_generation_ = message.step().generation();
    }
    if (message.has_setup()) {
      HandleSetup(message.setup(), stream);
    } else if (message.has_step()) {
      HandleStep(message.step(), stream);
      std::lock_guard<std::mutex> lock(mu_);
      running_generation_ = 0;
    }
  }
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
  engine::PeerSetup peer_setup;
  peer_setup.epoch = setup.epoch();
  peer_setup.peer_names = peers;
  peer_setup.nccl_unique_id = setup.nccl_unique_id();
  if (status.ok()) status = engine_->Connect(peer_setup);
  internal::RankMessage reply;
  reply.mutable_ready()->set_epoch(setup.epoch());
  if (!status.ok()) {
    reply.mutable_ready()->set_error(status.ToString());
    spdlog::error("rank {}: epoch {} setup failed: {}", options_.rank, setup.epoch(),
                  status.ToString());
  } else {
    spdlog::info("rank {}: connected to {} peer(s) for epoch {}", options_.rank,
                 peers.size() - 1, setup.epoch());
  }
  stream->Write(reply);
}

void RankProcess::HandleStep(const internal::Step& step, Stream* stream) {
  const std::vector<int> tokens_per_rank(step.tokens_per_rank().begin(),
                                         step.tokens_per_rank().end());
  engine::StepRequest request;
  request.generation = step.generation();
  request.layer = static_cast<int>(step.layer());
  request.tokens_per_rank = tokens_per_rank;
  request.counts = std::span<const int64_t>(step.counts().data(), step.counts().size());
  request.hidden.dtype = EngineDType(step.hidden().dtype());
  request.hidden.data = step.hidden().data().data();
  request.hidden.scales = reinterpret_cast<const uint8_t*>(step.hidden_scales().data().data());
  request.topk_ids = reinterpret_cast<const int32_t*>(step.topk_ids().data().data());
  request.topk_weights = reinterpret_cast<const float*>(step.topk_weights().data().data());
  request.output_fp32 = step.output_dtype() == gcmoe::v1::FP32;
  request.relief_passes = static_cast<int>(step.relief_passes());

  const Status status =
      step.placement_version() != placement_version_
          ? Internal("step " + std::to_string(step.generation()) + " is for placement version " +
                     std::to_string(step.placement_version()) + ", this rank holds version " +
                     std::to_string(placement_version_))
          : engine_->Step(request, &output_, &stats_);
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
    out->set_dtype(request.output_fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    out->add_shape(tokens_per_rank[options_.rank]);
    out->add_shape(options_.config.model.hidden);
    out->set_data(output_.output.data(), output_.output.size());
    result->mutable_load_before()->Assign(stats_.load_before.begin(), stats_.load_before.end());
    result->mutable_load_after()->Assign(stats_.load_after.begin(), stats_.load_after.end());
    result->set_relief_passes(stats_.passes);
    result->set_relief_solve_ns(stats_.solve_ns);
    result->set_engine_ns(stats_.engine_ns);
    result->set_assignments_computed(stats_.assignments_computed);
  }
  stream->Write(reply);
}

}  // namespace gcmoe::server
