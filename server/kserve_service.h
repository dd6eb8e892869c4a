// inference.GRPCInferenceService: the Open Inference Protocol (KServe v2) front door, served
// beside gcmoe.v1.MoeService on the same port. One model, "gcmoe" version "1": ModelInfer runs
// the same Forward as MoeService (same validation, queue, deadlines and statistics), so its
// output bytes are Forward's. With server.auth.tokens_file, ModelInfer and the metadata calls need
// the bearer token as MoeService's calls do; ServerLive, ServerReady and ModelReady are the
// protocol's health probes and stay open, like grpc.health.v1.
#pragma once

#include "config/config.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/coordinator.h"
#include "server/moe_service.h"
#include "server/service_stats.h"

namespace gcmoe::server {

class KServeServiceImpl final : public inference::GRPCInferenceService::Service {
 public:
  KServeServiceImpl(const config::Config& config, MoeServiceImpl* moe_service,
                    Coordinator* coordinator, ServiceStats* stats);

  grpc::Status ServerLive(grpc::ServerContext* context, const inference::ServerLiveRequest* request,
                          inference::ServerLiveResponse* response) override;
  // Ready exactly when MoeService serves: every rank attached and ready.
  grpc::Status ServerReady(grpc::ServerContext* context,
                           const inference::ServerReadyRequest* request,
                           inference::ServerReadyResponse* response) override;
  grpc::Status ModelReady(grpc::ServerContext* context, const inference::ModelReadyRequest* request,
                          inference::ModelReadyResponse* response) override;
  grpc::Status ServerMetadata(grpc::ServerContext* context,
                              const inference::ServerMetadataRequest* request,
                              inference::ServerMetadataResponse* response) override;
  grpc::Status ModelMetadata(grpc::ServerContext* context,
                             const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response) override;
  grpc::Status ModelInfer(grpc::ServerContext* context, const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override;

 private:
  const config::Config config_;
  MoeServiceImpl* moe_service_;
  Coordinator* coordinator_;
  ServiceStats* stats_;
};

}  // namespace gcmoe::server
