#include "server/moe_service.h"

#include <chrono>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>

#include "server/forward_regions.h"
#include "server/grpc_status.h"
#include "server/request_id.h"

namespace gcmoe::server {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string GrpcCodeName(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) return "UNAUTHENTICATED";
  return StatusCodeName(FromGrpcCode(status.error_code()));
}

std::optional<std::string_view> RequestIdHeader(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kRequestIdHeader);
  if (found == metadata.end()) return std::nullopt;
  return std::string_view(found->second.data(), found->second.size());
}

}  // namespace

MoeServiceImpl::MoeServiceImpl(const config::Config& config, int64_t max_message_bytes,
                               Coordinator* coordinator, ServiceStats* stats, Metrics* metrics,
                               const TokenAuthenticator* auth, FailureLog* failure_log,
                               engine::ThreadPool* copy_pool)
    : config_(config),
      max_message_bytes_(max_message_bytes),
      coordinator_(coordinator),
      stats_(stats),
      metrics_(metrics),
      auth_(auth),
      failure_log_(failure_log),
      copy_pool_(copy_pool) {
  limits_.hidden = config.model.hidden;
  limits_.experts = config.model.experts;
  limits_.top_k = config.model.top_k;
  limits_.layers = config.model.layers;
  limits_.max_tokens = config.max_tokens();
  limits_.world_size = config.parallel.ranks;
  if (config.server.allow_registered_memory) {
    registry_ = std::make_unique<MemoryRegistry>();
    spdlog::info(
        "registered memory is on (server.allow_registered_memory): clients on this host may have "
        "the service map their POSIX shared memory{}, up to {} registrations",
        config.engine.backend == "cuda" ? " and open their GPU memory (CUDA IPC)" : "",
        MemoryRegistry::kMaxRegistrations);
  }
}

std::string MoeServiceImpl::RegistrationOwner(const grpc::ServerContext& context) const {
  return auth_ == nullptr ? std::string() : BearerToken(context);
}

grpc::Status MoeServiceImpl::Authenticate(const grpc::ServerContext& context) const {
  if (auth_ == nullptr) return grpc::Status::OK;
  grpc::Status status = auth_->Check(context);
  if (!status.ok())
    spdlog::info("call from {} refused: {}", context.peer(), status.error_message());
  return status;
}

grpc::Status MoeServiceImpl::Forward(grpc::ServerContext* context,
                                     const gcmoe::v1::ForwardRequest* request,
                                     gcmoe::v1::ForwardResponse* response) {
  if (grpc::Status status = Authenticate(*context); !status.ok()) {
    metrics_->RecordCall("Forward", GrpcCodeName(status), 0.0);
    return status;
  }
  return ForwardAuthenticated(context, request, response);
}

grpc::Status MoeServiceImpl::ForwardAuthenticated(grpc::ServerContext* context,
                                                  const gcmoe::v1::ForwardRequest* request,
                                                  gcmoe::v1::ForwardResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  metrics_->CallStarted();
  std::string request_id;
  const grpc::Status status =
      ToGrpcStatus(RunForward(context, *request, RequestIdHeader(*context), &request_id, response));
  // The id the call is logged under goes back in the response metadata, failures included.
  if (!request_id.empty()) {
    context->AddInitialMetadata(kRequestIdHeader, RequestIdHeaderValue(request_id));
  }
  metrics_->CallFinished();
  metrics_->RecordCall("Forward", GrpcCodeName(status), SecondsSince(start));
  return status;
}

Status MoeServiceImpl::RunForward(grpc::ServerContext* context,
                                  const gcmoe::v1::ForwardRequest& request,
                                  std::optional<std::string_view> request_id_header,
                                  std::string* request_id_out,
                                  gcmoe::v1::ForwardResponse* response) {
  using Clock = Coordinator::Clock;
  const auto start = Clock::now();
  ValidatedForward validated;
  Result<std::string> request_id = ResolveRequestId(request.request_id(), request_id_header);
  Status status = request_id.status();
  if (status.ok()) {
    validated.request_id = *request_id;
    *request_id_out = validated.request_id;
    ForwardBytes bytes;
    status = ResolveForwardBytes(request, registry_.get(), RegistrationOwner(*context), &bytes,
                                 &validated.keep_alive);
    if (status.ok()) status = ValidateForward(request, bytes, limits_, &validated, copy_pool_);
  }
  const auto validated_at = Clock::now();
  if (status.ok()) {
    // The client's deadline, or the configured default when it set none.
    const auto client_deadline = context->deadline();
    Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(config_.server.default_deadline_ms);
    if (client_deadline != std::chrono::system_clock::time_point::max()) {
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    client_deadline - std::chrono::system_clock::now());
    }
    // An overflowed layer is an error, never an OK carrying Inf or NaN (DESIGN.md §4): the
    // coordinator checks host outputs as it assembles them, the ranks those in GPU memory.
    status = coordinator_->Forward(
        request, validated, deadline, [context] { return context->IsCancelled(); }, response);
  }
  if (!status.ok()) {
    stats_->RecordFailure(StatusCodeName(status.code()));
    // Bad input is the caller's business (debug); anything else is the service's (warn).
    const bool bad_input =
        status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound;
    // An id too long to log whole: its head and its length.
    const std::string id =
        request_id.ok()
            ? validated.request_id
            : RefusedIdPrefix(!request.request_id().empty()
                                  ? std::string_view(request.request_id())
                                  : request_id_header.value_or(std::string_view()));
    failure_log_->Record(status.code(), bad_input ? spdlog::level::debug : spdlog::level::warn,
                         "Forward \"" + id + "\" failed: " + status.ToString());
    response->Clear();
    return status;
  }
  response->set_request_id(validated.request_id);
  gcmoe::v1::ForwardStats* stats = response->mutable_stats();
  stats->set_validate_ns(
      std::chrono::duration_cast<std::chrono::nanoseconds>(validated_at - start).count());
  metrics_->RecordStep(*stats, validated.num_tokens);
  const std::pair<const char*, int64_t> stages[] = {{"validate", stats->validate_ns()},
                                                    {"to_ranks", stats->to_ranks_ns()},
                                                    {"host", stats->host_ns()},
                                                    {"h2d", stats->h2d_ns()},
                                                    {"device", stats->device_ns()},
                                                    {"d2h", stats->d2h_ns()},
                                                    {"from_ranks", stats->from_ranks_ns()},
                                                    {"assemble", stats->assemble_ns()}};
  for (const auto& [stage, ns] : stages) {
    metrics_->RecordStage(stage, static_cast<double>(ns) * 1e-9);
  }
  spdlog::debug("Forward \"{}\": {} tokens in {} us (engine {} us, {} call(s) in the step)",
                validated.request_id, validated.num_tokens, stats->total_ns() / 1000,
                stats->engine_ns() / 1000, stats->batched_calls());
  return Status::Ok();
}

grpc::Status MoeServiceImpl::ForwardStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<gcmoe::v1::ForwardStreamResponse, gcmoe::v1::ForwardRequest>* stream) {
  if (grpc::Status status = Authenticate(*context); !status.ok()) {
    metrics_->RecordCall("ForwardStream", GrpcCodeName(status), 0.0);
    return status;
  }
  gcmoe::v1::ForwardRequest request;
  gcmoe::v1::ForwardStreamResponse reply;
  uint64_t messages = 0;
  while (stream->Read(&request)) {
    const auto start = std::chrono::steady_clock::now();
    ++messages;
    reply.Clear();
    metrics_->CallStarted();
    // One x-request-id header cannot name many calls: each message's id is its request_id
    // field, or a new one, returned in the reply.
    std::string request_id;
    const Status status =
        RunForward(context, request, std::nullopt, &request_id, reply.mutable_response());
    metrics_->CallFinished();
    const grpc::Status grpc_status = ToGrpcStatus(status);
    metrics_->RecordCall("ForwardStream", GrpcCodeName(grpc_status), SecondsSince(start));
    reply.set_code(static_cast<int>(grpc_status.error_code()));
    reply.set_message(status.message());
    reply.set_request_id(request_id.empty() ? request.request_id() : request_id);
    if (!status.ok()) reply.clear_response();
    if (!stream->Write(reply)) break;  // the client has gone
  }
  spdlog::debug("ForwardStream ended after {} message(s)", messages);
  return grpc::Status::OK;
}

grpc::Status MoeServiceImpl::Echo(grpc::ServerContext* context,
                                  const gcmoe::v1::ForwardRequest* request,
                                  gcmoe::v1::ForwardResponse* response) {
  if (!config_.server.echo) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "Echo is served only with server.echo on (gcmoe bench serve sets it)");
  }
  if (grpc::Status status = Authenticate(*context); !status.ok()) return status;
  if (NamesRegion(*request)) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "Echo does not read registered memory; send the tensors inline");
  }
  if (request->hidden().shape_size() != 2 || request->hidden().shape(0) < 0 ||
      request->hidden().shape(0) > config_.max_tokens()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        "hidden.shape: expected [T, H] with T from 0 to " + std::to_string(config_.max_tokens()));
  }
  // The bytes Forward would return, and nothing computed: the transport's own cost.
  const bool fp32 = request->output_dtype() == gcmoe::v1::FP32;
  const int64_t tokens = request->hidden().shape(0);
  gcmoe::v1::Tensor* output = response->mutable_output();
  output->set_dtype(fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
  output->add_shape(tokens);
  output->add_shape(config_.model.hidden);
  output->mutable_data()->resize(static_cast<size_t>(tokens) * config_.model.hidden *
                                 (fp32 ? 4 : 2));
  response->set_request_id(request->request_id());
  return grpc::Status::OK;
}

grpc::Status MoeServiceImpl::RegisterMemory(grpc::ServerContext* context,
                                            const gcmoe::v1::RegisterMemoryRequest* request,
                                            gcmoe::v1::RegisterMemoryResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = Authenticate(*context);
  if (status.ok()) {
    Status result;
    if (registry_ == nullptr) {
      result = RegisteredMemoryOff();
    } else if (request->has_cuda_ipc()) {
      result = RegisterCudaIpc(RegistrationOwner(*context), request->name(), request->cuda_ipc());
      if (result.ok()) response->set_byte_size(request->cuda_ipc().byte_size());
    } else if (!request->has_posix_shm()) {
      result = InvalidArgument("posix_shm: missing, expected the shared-memory object to register");
    } else {
      const gcmoe::v1::PosixShmMemory& shm = request->posix_shm();
      result = registry_->RegisterPosixShm(RegistrationOwner(*context), request->name(), shm.key(),
                                           shm.offset(), shm.byte_size());
      if (result.ok()) {
        response->set_byte_size(shm.byte_size());
        spdlog::info("registered memory \"{}\": {} bytes of {} at offset {} ({} registration(s))",
                     request->name(), shm.byte_size(), shm.key(), shm.offset(),
                     registry_->size());
      }
    }
    status = ToGrpcStatus(result);
  }
  metrics_->RecordCall("RegisterMemory", GrpcCodeName(status), SecondsSince(start));
  return status;
}

Status MoeServiceImpl::RegisterCudaIpc(const std::string& owner, const std::string& name,
                                       const gcmoe::v1::CudaIpcMemory& memory) {
  if (config_.engine.backend != "cuda") {
    return FailedPrecondition("cuda_ipc: the service runs engine.backend " +
                              config_.engine.backend +
                              "; GPU memory needs the cuda backend (posix_shm is served)");
  }
  if (memory.byte_size() == 0) {
    return InvalidArgument("cuda_ipc.byte_size: 0, expected at least 1 byte");
  }
  if (memory.device_id() < 0) {
    return InvalidArgument("cuda_ipc.device_id: " + std::to_string(memory.device_id()) +
                           ", expected a device ordinal");
  }
  GCMOE_RETURN_IF_ERROR(registry_->CheckNewName(owner, name));
  gcmoe::internal::v1::DeviceRegion region;
  region.set_ipc_handle(memory.ipc_handle());
  region.set_device(memory.device_id());
  region.set_offset(memory.offset());
  region.set_byte_size(memory.byte_size());
  // Each rank opens it (the coordinator holds no CUDA context) and checks handle, device and
  // size; a rank's error names the field.
  constexpr auto kOpenTimeout = std::chrono::seconds(10);
  GCMOE_ASSIGN_OR_RETURN(const uint64_t id, coordinator_->OpenDeviceRegion(region, kOpenTimeout));
  Coordinator* coordinator = coordinator_;
  auto registration = std::make_shared<const DeviceRegistration>(
      id, memory.byte_size(), [coordinator](uint64_t closed) {
        coordinator->CloseDeviceRegion(closed);
        spdlog::info("registered GPU memory {} closed on the ranks", closed);
      });
  GCMOE_RETURN_IF_ERROR(registry_->RegisterDevice(owner, name, std::move(registration)));
  spdlog::info(
      "registered memory \"{}\": {} bytes of GPU memory on device {} at offset {} "
      "({} registration(s))",
      name, memory.byte_size(), memory.device_id(), memory.offset(), registry_->size());
  return Status::Ok();
}

grpc::Status MoeServiceImpl::UnregisterMemory(grpc::ServerContext* context,
                                              const gcmoe::v1::UnregisterMemoryRequest* request,
                                              gcmoe::v1::UnregisterMemoryResponse*) {
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status = Authenticate(*context);
  if (status.ok()) {
    status = ToGrpcStatus(registry_ == nullptr
                              ? RegisteredMemoryOff()
                              : registry_->Unregister(RegistrationOwner(*context), request->name()));
    if (status.ok()) spdlog::info("unregistered memory \"{}\"", request->name());
  }
  metrics_->RecordCall("UnregisterMemory", GrpcCodeName(status), SecondsSince(start));
  return status;
}

grpc::Status MoeServiceImpl::GetModelInfo(grpc::ServerContext* context,
                                          const gcmoe::v1::GetModelInfoRequest*,
                                          gcmoe::v1::ModelInfo* info) {
  const auto start = std::chrono::steady_clock::now();
  if (grpc::Status status = Authenticate(*context); !status.ok()) {
    metrics_->RecordCall("GetModelInfo", GrpcCodeName(status), SecondsSince(start));
    return status;
  }
  const config::ModelConfig& m = config_.model;
  info->set_hidden(m.hidden);
  info->set_intermediate(m.intermediate);
  info->set_experts(m.experts);
  info->set_top_k(m.top_k);
  info->set_layers(m.layers);
  info->set_shared_intermediate(m.shared_intermediate);
  info->set_activation_alpha(m.activation_alpha);
  info->set_activation_clamp_enabled(m.activation_clamp.has_value());
  info->set_activation_clamp(m.activation_clamp.value_or(0.0f));
  info->set_routed_weight_format("E2M1 (FP4) with UE8M0 scales per 32 along K");
  info->set_shared_weight_format(m.shared_intermediate > 0 ? "E4M3 with UE8M0 scales per 32 along K"
                                                           : "none");
  info->add_hidden_dtypes(gcmoe::v1::BF16);
  info->add_hidden_dtypes(gcmoe::v1::FP32);
  info->add_hidden_dtypes(gcmoe::v1::FP8_E4M3);
  info->add_output_dtypes(gcmoe::v1::BF16);
  info->add_output_dtypes(gcmoe::v1::FP32);
  info->set_ranks(config_.parallel.ranks);
  info->set_backend(config_.engine.backend);
  info->set_max_tokens(config_.max_tokens());
  info->set_balancer_enabled(config_.balancer.enabled);
  info->set_version(GCMOE_VERSION);
  info->set_weights(m.weights);
  info->set_max_message_bytes(static_cast<uint64_t>(max_message_bytes_));
  info->set_activation_up_offset(m.activation_up_offset);
  for (int l = 0; l < m.layers; ++l) {
    info->add_model_layers(m.moe_layer_ids.empty() ? l : m.moe_layer_ids[l]);
  }
  if (registry_) info->add_memory_kinds("posix_shm");
  if (registry_ && config_.engine.backend == "cuda") info->add_memory_kinds("cuda_ipc");
  metrics_->RecordCall("GetModelInfo", "OK", SecondsSince(start));
  return grpc::Status::OK;
}

grpc::Status MoeServiceImpl::GetStats(grpc::ServerContext* context,
                                      const gcmoe::v1::GetStatsRequest*, gcmoe::v1::Stats* stats) {
  const auto start = std::chrono::steady_clock::now();
  if (grpc::Status status = Authenticate(*context); !status.ok()) {
    metrics_->RecordCall("GetStats", GrpcCodeName(status), SecondsSince(start));
    return status;
  }
  stats_->Fill(stats);
  coordinator_->FillRankStats(stats);
  metrics_->RecordCall("GetStats", "OK", SecondsSince(start));
  return grpc::Status::OK;
}

}  // namespace gcmoe::server
