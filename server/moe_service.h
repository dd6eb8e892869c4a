// gcmoe.v1.MoeService: the public API, a thin edge over the coordinator.
#pragma once

#include "config/config.h"
#include "gcmoe/v1/moe.grpc.pb.h"
#include "server/coordinator.h"
#include "server/failure_log.h"
#include "server/forward_validation.h"
#include "server/service_stats.h"

namespace gcmoe::server {

class MoeServiceImpl final : public gcmoe::v1::MoeService::Service {
 public:
  // failure_log: where failed calls are logged, rate-limited (shared with the rank gate).
  MoeServiceImpl(const config::Config& config, int64_t max_message_bytes, Coordinator* coordinator,
                 ServiceStats* stats, FailureLog* failure_log);

  grpc::Status Forward(grpc::ServerContext* context, const gcmoe::v1::ForwardRequest* request,
                       gcmoe::v1::ForwardResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context,
                            const gcmoe::v1::GetModelInfoRequest* request,
                            gcmoe::v1::ModelInfo* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const gcmoe::v1::GetStatsRequest* request,
                        gcmoe::v1::Stats* response) override;

 private:
  const config::Config config_;
  const int64_t max_message_bytes_;
  ForwardLimits limits_;
  Coordinator* coordinator_;
  ServiceStats* stats_;
  FailureLog* failure_log_;
};

}  // namespace gcmoe::server
