// The coordinator process's servers: the public API (MoeService, the KServe v2
// GRPCInferenceService, health, reflection) on server.listen, and the rank control service on
// server.rank_listen.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "config/config.h"
#include "server/attach_secret.h"
#include "server/auth_tokens.h"
#include "server/coordinator.h"
#include "server/failure_log.h"
#include "server/kserve_service.h"
#include "server/metrics.h"
#include "server/moe_service.h"
#include "server/rank_control_service.h"
#include "server/service_stats.h"
#include "server/tls_credentials.h"

namespace gcmoe::server {

// Largest message the service accepts or sends: the configured value, or one that fits the
// largest batch (FP32 activations of max_tokens tokens, their routing, the FP32 output).
int64_t MaxMessageBytes(const config::Config& config);
// What the public port's transport may hold of requests streaming in (server.receive_quota_bytes,
// or its default from the message limit).
int64_t ReceiveQuotaBytes(const config::Config& config, int64_t max_message_bytes);
// Threads of the coordinator's copy pool, the caller's included: server.copy_threads, or for 0 a
// quarter of this machine's cores, 1 to 4.
int CopyThreads(const config::ServerConfig& server);

class CoordinatorServer {
 public:
  static Result<std::unique_ptr<CoordinatorServer>> Start(const config::Config& config);
  ~CoordinatorServer();

  // Addresses with the ports actually bound (a configured port 0 picks a free one).
  const std::string& public_address() const { return public_address_; }
  const std::string& rank_address() const { return rank_address_; }
  // host:port of /metrics; "" when server.metrics_listen is empty.
  const std::string& metrics_address() const { return metrics_->address(); }
  Coordinator& coordinator() { return *coordinator_; }

  // SIGHUP: reads the TLS certificates and keys and the tokens file again. Each that fails to
  // load keeps its current one, and the error names its config key.
  Status Reload();

  // Drains admitted calls, tells the ranks to exit, stops both servers.
  void Shutdown(std::chrono::milliseconds drain_timeout);

 private:
  CoordinatorServer() = default;

  config::Config config_;
  std::unique_ptr<ServiceStats> stats_;
  std::unique_ptr<TokenAuthenticator> auth_;                 // null: no token authentication
  std::unique_ptr<ReloadableServerCredentials> public_tls_;  // null: plaintext
  std::unique_ptr<ReloadableServerCredentials> rank_tls_;    // null: plaintext
  std::unique_ptr<FailureLog> failure_log_;  // Forward failures and refused attaches
  // server.copy_threads: the coordinator's and the validation's large copies and scans (before
  // them: destroyed after them).
  std::unique_ptr<engine::ThreadPool> copy_pool_;
  std::unique_ptr<Coordinator> coordinator_;
  // After the coordinator: destroyed first, so no scrape reads a destroyed coordinator.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MoeServiceImpl> moe_service_;
  std::unique_ptr<KServeServiceImpl> kserve_service_;
  std::unique_ptr<RankControlService> rank_service_;
  std::unique_ptr<grpc::Server> public_server_;
  std::unique_ptr<grpc::Server> rank_server_;
  std::string public_address_;
  std::string rank_address_;
  bool shut_down_ = false;
};

}  // namespace gcmoe::server
