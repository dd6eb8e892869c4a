// gcmoe.v1.MoeService: the public API, a thin edge over the coordinator. Every call is
// authenticated here (when tokens are configured) and counted in the metrics as it ends.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "gcmoe/v1/moe.grpc.pb.h"
#include "server/auth_tokens.h"
#include "server/coordinator.h"
#include "server/failure_log.h"
#include "server/forward_validation.h"
#include "server/memory_registry.h"
#include "server/metrics.h"
#include "server/service_stats.h"

namespace gcmoe::server {

class MoeServiceImpl final : public gcmoe::v1::MoeService::Service {
 public:
  // `auth` may be null (no token authentication); failure_log: where failed calls are logged,
  // rate-limited (shared with the rank gate); copy_pool (may be null): shares the checks of
  // large activations (server.copy_threads).
  MoeServiceImpl(const config::Config& config, int64_t max_message_bytes, Coordinator* coordinator,
                 ServiceStats* stats, Metrics* metrics, const TokenAuthenticator* auth,
                 FailureLog* failure_log, engine::ThreadPool* copy_pool);

  grpc::Status Forward(grpc::ServerContext* context, const gcmoe::v1::ForwardRequest* request,
                       gcmoe::v1::ForwardResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context,
                            const gcmoe::v1::GetModelInfoRequest* request,
                            gcmoe::v1::ModelInfo* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const gcmoe::v1::GetStatsRequest* request,
                        gcmoe::v1::Stats* response) override;
  grpc::Status ForwardStream(grpc::ServerContext* context,
                             grpc::ServerReaderWriter<gcmoe::v1::ForwardStreamResponse,
                                                      gcmoe::v1::ForwardRequest>* stream) override;
  grpc::Status Echo(grpc::ServerContext* context, const gcmoe::v1::ForwardRequest* request,
                    gcmoe::v1::ForwardResponse* response) override;
  grpc::Status RegisterMemory(grpc::ServerContext* context,
                              const gcmoe::v1::RegisterMemoryRequest* request,
                              gcmoe::v1::RegisterMemoryResponse* response) override;
  grpc::Status UnregisterMemory(grpc::ServerContext* context,
                                const gcmoe::v1::UnregisterMemoryRequest* request,
                                gcmoe::v1::UnregisterMemoryResponse* response) override;

  // OK without server.auth.tokens_file; else the token check, a refusal logged with the peer.
  // Public for the other services of the port (KServe) that the tokens also guard.
  grpc::Status Authenticate(const grpc::ServerContext& context) const;

  // Registrations made with a bearer token belong to it; without tokens there is one owner.
  std::string RegistrationOwner(const grpc::ServerContext& context) const;

  // Forward for a caller another service of the port (KServe's ModelInfer) has authenticated.
  grpc::Status ForwardAuthenticated(grpc::ServerContext* context,
                                    const gcmoe::v1::ForwardRequest* request,
                                    gcmoe::v1::ForwardResponse* response);

 private:
  // One Forward, for the unary call and for each message of a stream: request id, validation,
  // the coordinator, the output check, stats, metrics and logs. The call's id (the request_id
  // field, else `request_id_header`, else a new one) is left in *request_id_out once resolved.
  // On failure `response` is cleared.
  Status RunForward(grpc::ServerContext* context, const gcmoe::v1::ForwardRequest& request,
                    std::optional<std::string_view> request_id_header,
                    std::string* request_id_out, gcmoe::v1::ForwardResponse* response);

  // RegisterMemory's cuda_ipc: every rank opens the memory, then the registry holds it.
  Status RegisterCudaIpc(const std::string& owner, const std::string& name,
                         const gcmoe::v1::CudaIpcMemory& memory);

  const config::Config config_;
  const int64_t max_message_bytes_;
  ForwardLimits limits_;
  Coordinator* coordinator_;
  ServiceStats* stats_;
  Metrics* metrics_;
  const TokenAuthenticator* auth_;
  FailureLog* failure_log_;
  engine::ThreadPool* copy_pool_;
  // Null unless server.allow_registered_memory: then every use of a region is refused.
  std::unique_ptr<MemoryRegistry> registry_;
};

}  // namespace gcmoe::server
