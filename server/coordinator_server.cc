#include "server/coordinator_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

namespace gcmoe::server {
namespace {

// "host:port" with the port replaced by the one actually bound.
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  return address.substr(0, colon) + ":" + std::to_string(port);
}

}  // namespace

int64_t MaxMessageBytes(const config::Config& config) {
  if (config.server.max_message_bytes > 0) return config.server.max_message_bytes;
  const int64_t tokens = config.max_tokens();
  const int64_t hidden = config.model.hidden;
  const int64_t k = config.model.top_k;
  const int64_t request = tokens * hidden * 4 + tokens * (hidden / 32) + tokens * k * 8;
  const int64_t response = tokens * hidden * 4;
  // Room for framing, field tags and request ids.
  return std::max(request, response) + (1 << 20);
}

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const config::Config& config) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->config_ = config;
  const int64_t max_bytes = MaxMessageBytes(config);
  if (max_bytes > INT32_MAX) {
    return InvalidArgument("server.max_message_bytes: the largest batch needs " +
                           std::to_string(max_bytes) +
                           " bytes, over gRPC's 2 GiB limit; lower engine.max_tokens_per_rank");
  }
  GCMOE_ASSIGN_OR_RETURN(AttachSecret secret, AttachSecret::Load(config.server.rank_secret_file));
  server->stats_ = std::make_unique<ServiceStats>(config.parallel.ranks);
  FailureLog::Options failure_options;
  failure_options.interval = std::chrono::milliseconds(config.logging.failure_interval_ms);
  failure_options.lines_per_interval = config.logging.failures_per_interval;
  server->failure_log_ = std::make_unique<FailureLog>(failure_options);
  CoordinatorOptions options;
  options.world_size = config.parallel.ranks;
  options.hidden = config.model.hidden;
  options.experts = config.model.experts;
  options.config_digest = config.Digest();
  options.max_queue = config.server.max_queue;
  options.exchange_timeout_ms = config.engine.exchange_timeout_ms;
  options.step_timeout_ms = config.server.step_timeout_ms;
  options.balancer_enabled = config.balancer.enabled;
  options.nccl_bootstrap = config.engine.backend == "cuda" && config.engine.exchange == "nccl";
  GCMOE_ASSIGN_OR_RETURN(auto planner, BalancePlanner::Create(config));
  server->coordinator_ =
      std::make_unique<Coordinator>(options, std::move(planner), server->stats_.get());
  server->moe_service_ =
      std::make_unique<MoeServiceImpl>(config, max_bytes, server->coordinator_.get(),
                                       server->stats_.get(), server->failure_log_.get());
  AttachPolicy policy{.secret = secret,
                      .instance = secret.InstanceName(options.config_digest),
                      .backend = config.engine.backend};
  server->rank_service_ = std::make_unique<RankControlService>(
      server->coordinator_.get(), std::move(policy), server->failure_log_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  int rank_port = 0;
  {
    grpc::ServerBuilder builder;
    // gRPC turns SO_REUSEPORT on by default on Linux, which would let a second service bind
    // the same port and silently share its traffic: a busy port must be an error instead.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // A rank whose host or network died leaves no FIN behind: pings find its stream dead, so
    // that a restarted rank (admitted only once its predecessor's stream is gone) gets in.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    builder.AddListeningPort(config.server.rank_listen, grpc::InsecureServerCredentials(),
                             &rank_port);
    // Anyone who reaches the port can send a first message before proving anything: bound what
    // the transport may hold, with room for every rank's step result at once.
    grpc::ResourceQuota quota("gcmoe-rank-control");
    quota.Resize(static_cast<size_t>((config.parallel.ranks + 2) * max_bytes));
    builder.SetResourceQuota(quota);
    builder.SetMaxReceiveMessageSize(static_cast<int>(max_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(max_bytes));
    builder.RegisterService(server->rank_service_.get());
    server->rank_server_ = builder.BuildAndStart();
    if (!server->rank_server_ || rank_port == 0) {
      return Unavailable("server.rank_listen: cannot listen on " + config.server.rank_listen +
                         " (in use by another process, or not an address of this host)");
    }
  }
  int public_port = 0;
  {
    grpc::ServerBuilder builder;
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.AddListeningPort(config.server.listen, grpc::InsecureServerCredentials(), &public_port);
    // gRPC grants a stream the window its message header asks for and checks the size only once
    // the whole message is in: the quota is what refuses oversize calls while they stream in
    // (RESOURCE_EXHAUSTED) and bounds what concurrent ones hold, at twice the message limit.
    grpc::ResourceQuota quota("gcmoe-public-api");
    quota.Resize(static_cast<size_t>(2 * max_bytes));
    builder.SetResourceQuota(quota);
    builder.SetMaxReceiveMessageSize(static_cast<int>(max_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(max_bytes));
    builder.RegisterService(server->moe_service_.get());
    server->public_server_ = builder.BuildAndStart();
    if (!server->public_server_ || public_port == 0) {
      server->rank_server_->Shutdown();
      return Unavailable("server.listen: cannot listen on " + config.server.listen +
                         " (in use by another process, or not an address of this host)");
    }
  }
  server->public_address_ = WithPort(config.server.listen, public_port);
  server->rank_address_ = WithPort(config.server.rank_listen, rank_port);

  grpc::HealthCheckServiceInterface* health = server->public_server_->GetHealthCheckService();
  health->SetServingStatus(false);
  server->coordinator_->AddServingCallback([health](bool serving) {
    health->SetServingStatus(serving);
    health->SetServingStatus("gcmoe.v1.MoeService", serving);
  });
  spdlog::info("coordinator: API on {}, ranks attach on {} ({} rank(s), {} backend, "
               "max {} tokens per call, max message {} bytes)",
               server->public_address_, server->rank_address_, config.parallel.ranks,
               config.engine.backend, config.max_tokens(), max_bytes);
  return server;
}

void CoordinatorServer::Shutdown(std::chrono::milliseconds drain_timeout) {
  if (shut_down_) return;
  shut_down_ = true;
  coordinator_->Drain(drain_timeout);
  coordinator_->ShutdownRanks("the coordinator is shutting down");
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  public_server_->Shutdown(deadline);
  rank_server_->Shutdown(deadline);
  spdlog::info("coordinator: stopped");
}

CoordinatorServer::~CoordinatorServer() {
  if (!shut_down_ && public_server_) Shutdown(std::chrono::milliseconds(0));
}

}  // namespace gcmoe::server
