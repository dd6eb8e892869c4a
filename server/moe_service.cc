#include "server/moe_service.h"

#include <chrono>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>

#include "server/grpc_status.h"
#include "server/request_id.h"

namespace gcmoe::server {

MoeServiceImpl::MoeServiceImpl(const config::Config& config, int64_t max_message_bytes,
                               Coordinator* coordinator, ServiceStats* stats,
                               FailureLog* failure_log)
    : config_(config),
      max_message_bytes_(max_message_bytes),
      coordinator_(coordinator),
      stats_(stats),
      failure_log_(failure_log) {
  limits_.hidden = config.model.hidden;
  limits_.experts = config.model.experts;
  limits_.top_k = config.model.top_k;
  limits_.layers = config.model.layers;
  limits_.max_tokens = config.max_tokens();
  limits_.world_size = config.parallel.ranks;
}

namespace {

std::optional<std::string_view> RequestIdHeader(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kRequestIdHeader);
  if (found == metadata.end()) return std::nullopt;
  return std::string_view(found->second.data(), found->second.size());
}

}  // namespace

grpc::Status MoeServiceImpl::Forward(grpc::ServerContext* context,
                                     const gcmoe::v1::ForwardRequest* request,
                                     gcmoe::v1::ForwardResponse* response) {
  ValidatedForward validated;
  Result<std::string> request_id =
      ResolveRequestId(request->request_id(), RequestIdHeader(*context));
  Status status = request_id.status();
  if (status.ok()) {
    validated.request_id = *request_id;
    context->AddInitialMetadata(kRequestIdHeader, RequestIdHeaderValue(validated.request_id));
    status = ValidateForward(*request, limits_, &validated);
  }
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
    status = coordinator_->Forward(
        *request, validated, deadline, [context] { return context->IsCancelled(); }, response);
    // An overflowed layer is an error, never an OK carrying Inf or NaN (DESIGN.md §4).
    if (status.ok()) status = ValidateForwardOutput(response->output());
  }
  if (!status.ok()) {
    stats_->RecordFailure(StatusCodeName(status.code()));
    // Bad input is the caller's business (debug); anything else is the service's (warn).
    const bool bad_input =
        status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound;
    std::string id = validated.request_id;
    if (!request_id.ok()) {
      // Too long to log whole: its head and its length.
      id = RefusedIdPrefix(!request->request_id().empty()
                               ? std::string_view(request->request_id())
                               : RequestIdHeader(*context).value_or(std::string_view()));
    }
    failure_log_->Record(status.code(), bad_input ? spdlog::level::debug : spdlog::level::warn,
                         "Forward \"" + id + "\" failed: " + status.ToString());
    response->Clear();
    return ToGrpcStatus(status);
  }
  response->set_request_id(validated.request_id);
  spdlog::debug("Forward \"{}\": {} tokens in {} us (engine {} us)", validated.request_id,
                validated.num_tokens, response->stats().total_ns() / 1000,
                response->stats().engine_ns() / 1000);
  return grpc::Status::OK;
}

grpc::Status MoeServiceImpl::GetModelInfo(grpc::ServerContext*,
                                          const gcmoe::v1::GetModelInfoRequest*,
                                          gcmoe::v1::ModelInfo* info) {
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
  return grpc::Status::OK;
}

grpc::Status MoeServiceImpl::GetStats(grpc::ServerContext*, const gcmoe::v1::GetStatsRequest*,
                                      gcmoe::v1::Stats* stats) {
  stats_->Fill(stats);
  coordinator_->FillRankStats(stats);
  return grpc::Status::OK;
}

}  // namespace gcmoe::server
