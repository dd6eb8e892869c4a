#include "server/moe_service.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "server/grpc_status.h"

namespace gcmoe::server {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string GrpcCodeName(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) return "UNAUTHENTICATED";
  return StatusCodeName(FromGrpcCode(status.error_code()));
}

}  // namespace

MoeServiceImpl::MoeServiceImpl(const config::Config& config, int64_t max_message_bytes,
                               Coordinator* coordinator, ServiceStats* stats, Metrics* metrics,
                               const TokenAuthenticator* auth)
    : config_(config),
      max_message_bytes_(max_message_bytes),
      coordinator_(coordinator),
      stats_(stats),
      metrics_(metrics),
      auth_(auth) {
  limits_.hidden = config.model.hidden;
  limits_.experts = config.model.experts;
  limits_.top_k = config.model.top_k;
  limits_.layers = config.model.layers;
  limits_.max_tokens = config.max_tokens();
  limits_.world_size = config.parallel.ranks;
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
  const auto start = std::chrono::steady_clock::now();
  metrics_->CallStarted();
  grpc::Status status = Authenticate(*context);
  if (status.ok()) status = DoForward(context, request, response);
  metrics_->CallFinished();
  metrics_->RecordCall("Forward", GrpcCodeName(status), SecondsSince(start));
  return status;
}

grpc::Status MoeServiceImpl::DoForward(grpc::ServerContext* context,
                                       const gcmoe::v1::ForwardRequest* request,
                                       gcmoe::v1::ForwardResponse* response) {
  ValidatedForward validated;
  Status status = ValidateForward(*request, limits_, &validated);
  if (status.ok()) {
    // The client's deadline, or the configured default when it set none.
    using Clock = Coordinator::Clock;
    const auto client_deadline = context->deadline();
    Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(config_.server.default_deadline_ms);
    if (client_deadline != std::chrono::system_clock::time_point::max()) {
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    client_deadline - std::chrono::system_clock::now());
    }
    status = coordinator_->Forward(*request, validated, deadline,
                                   [context] { return context->IsCancelled(); }, response);
  }
  if (!status.ok()) {
    stats_->RecordFailure(StatusCodeName(status.code()));
    if (status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound) {
      spdlog::debug("Forward {} rejected: {}", request->request_id(), status.ToString());
    } else {
      spdlog::warn("Forward {} failed: {}", request->request_id(), status.ToString());
    }
    response->Clear();
    return ToGrpcStatus(status);
  }
  response->set_request_id(request->request_id());
  metrics_->RecordStep(response->stats(), validated.num_tokens);
  spdlog::debug("Forward {}: {} tokens in {} us (engine {} us)", request->request_id(),
                validated.num_tokens, response->stats().total_ns() / 1000,
                response->stats().engine_ns() / 1000);
  return grpc::Status::OK;
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
  info->set_shared_weight_format(m.shared_intermediate > 0
                                     ? "E4M3 with UE8M0 scales per 32 along K"
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
