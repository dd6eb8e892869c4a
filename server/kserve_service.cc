#include "server/kserve_service.h"

#include <spdlog/spdlog.h>

#include "server/grpc_status.h"
#include "server/kserve_request.h"

namespace gcmoe::server {
namespace {

void AddTensor(
    const std::string& name, const std::string& datatype, std::vector<int64_t> shape,
    google::protobuf::RepeatedPtrField<inference::ModelMetadataResponse::TensorMetadata>* tensors) {
  auto* tensor = tensors->Add();
  tensor->set_name(name);
  tensor->set_datatype(datatype);
  for (int64_t d : shape) tensor->add_shape(d);
}

}  // namespace

KServeServiceImpl::KServeServiceImpl(const config::Config& config, MoeServiceImpl* moe_service,
                                     Coordinator* coordinator, ServiceStats* stats)
    : config_(config), moe_service_(moe_service), coordinator_(coordinator), stats_(stats) {}

grpc::Status KServeServiceImpl::ServerLive(grpc::ServerContext*,
                                           const inference::ServerLiveRequest*,
                                           inference::ServerLiveResponse* response) {
  // Answering at all is being live: the coordinator keeps serving while ranks come and go.
  response->set_live(true);
  return grpc::Status::OK;
}

grpc::Status KServeServiceImpl::ServerReady(grpc::ServerContext*,
                                            const inference::ServerReadyRequest*,
                                            inference::ServerReadyResponse* response) {
  response->set_ready(coordinator_->serving());
  return grpc::Status::OK;
}

grpc::Status KServeServiceImpl::ModelReady(grpc::ServerContext*,
                                           const inference::ModelReadyRequest* request,
                                           inference::ModelReadyResponse* response) {
  const Status status = CheckKServeModel("name", request->name(),
                                         request->has_version() ? &request->version() : nullptr);
  if (!status.ok()) return ToGrpcStatus(status);
  response->set_ready(coordinator_->serving());
  return grpc::Status::OK;
}

grpc::Status KServeServiceImpl::ServerMetadata(grpc::ServerContext* context,
                                               const inference::ServerMetadataRequest*,
                                               inference::ServerMetadataResponse* response) {
  if (grpc::Status status = moe_service_->Authenticate(*context); !status.ok()) return status;
  response->set_name("gcmoe");
  response->set_version(GCMOE_VERSION);
  return grpc::Status::OK;
}

grpc::Status KServeServiceImpl::ModelMetadata(grpc::ServerContext* context,
                                              const inference::ModelMetadataRequest* request,
                                              inference::ModelMetadataResponse* response) {
  if (grpc::Status status = moe_service_->Authenticate(*context); !status.ok()) return status;
  const Status status = CheckKServeModel("name", request->name(),
                                         request->has_version() ? &request->version() : nullptr);
  if (!status.ok()) return ToGrpcStatus(status);
  const config::ModelConfig& m = config_.model;
  response->set_name(kKServeModelName);
  response->add_versions(kKServeModelVersion);
  response->set_platform("gcmoe");
  // A tensor has one datatype here; the properties say which others an input accepts.
  AddTensor("hidden", "BF16", {-1, m.hidden}, response->mutable_inputs());
  AddTensor("topk_ids", "INT32", {-1, m.top_k}, response->mutable_inputs());
  AddTensor("topk_weights", "FP32", {-1, m.top_k}, response->mutable_inputs());
  AddTensor("output", "BF16", {-1, m.hidden}, response->mutable_outputs());
  auto& properties = *response->mutable_properties();
  properties["hidden_datatypes"] = "BF16,FP32";
  properties["output_datatypes"] = "BF16,FP32";
  properties["parameters"] =
      "layer: int64 in [0, layers), default 0; output_datatype: 'BF16' (default) or 'FP32'";
  properties["layers"] = std::to_string(m.layers);
  properties["experts"] = std::to_string(m.experts);
  properties["max_tokens"] = std::to_string(config_.max_tokens());
  return grpc::Status::OK;
}

grpc::Status KServeServiceImpl::ModelInfer(grpc::ServerContext* context,
                                           const inference::ModelInferRequest* request,
                                           inference::ModelInferResponse* response) {
  // Before the request is read: a caller without a token learns nothing from the validation.
  if (grpc::Status status = moe_service_->Authenticate(*context); !status.ok()) return status;
  gcmoe::v1::ForwardRequest forward;
  const Status status = ToForwardRequest(*request, &forward);
  if (!status.ok()) {
    stats_->RecordFailure(StatusCodeName(status.code()));
    spdlog::debug("ModelInfer {} rejected: {}", request->id(), status.ToString());
    return ToGrpcStatus(status);
  }
  gcmoe::v1::ForwardResponse forward_response;
  grpc::Status forward_status =
      moe_service_->ForwardAuthenticated(context, &forward, &forward_response);
  if (!forward_status.ok()) return forward_status;
  ToInferResponse(*request, forward_response, response);
  return grpc::Status::OK;
}

}  // namespace gcmoe::server
