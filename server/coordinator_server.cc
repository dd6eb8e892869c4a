#include "server/coordinator_server.h"

#include <malloc.h>

#include <algorithm>
#include <functional>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "common/spin_wait.h"

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

int64_t ReceiveQuotaBytes(const config::Config& config, int64_t max_message_bytes) {
  if (config.server.receive_quota_bytes > 0) return config.server.receive_quota_bytes;
  return std::max<int64_t>(2 * max_message_bytes, int64_t{256} << 20);
}

int CopyThreads(const config::ServerConfig& server) {
  if (server.copy_threads > 0) return server.copy_threads;
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 4);
}

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const config::Config& config) {
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->config_ = config;
  // Every Forward allocates its request and response buffers (MBs at large T) on one of gRPC's
  // handler threads. With glibc's defaults each thread's arena hands such blocks back to the
  // kernel when they are freed, and the next call pays a page fault per 4 KiB again: measured as
  // 1.3-1.6 ms to assemble a 3 MiB response instead of 0.4 ms. Keep freed memory for reuse.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  // ... in two arenas: with one per handler thread, each keeps what it once held, and 64
  // callers grew the coordinator from 46 to 73 MB over 150 s of soak; with two it stays at
  // 38-42 MB at the same throughput (docs/PERFORMANCE.md, soak). Small blocks come from each
  // thread's cache without the arena's lock.
  mallopt(M_ARENA_MAX, 2);
  const int64_t max_bytes = MaxMessageBytes(config);
  if (max_bytes > INT32_MAX) {
    return InvalidArgument("server.max_message_bytes: the largest batch needs " +
                           std::to_string(max_bytes) +
                           " bytes, over gRPC's 2 GiB limit; lower engine.max_tokens_per_rank");
  }
  GCMOE_ASSIGN_OR_RETURN(AttachSecret secret, AttachSecret::Load(config.server.rank_secret_file));
  server->stats_ = std::make_unique<ServiceStats>(config.parallel.ranks);
  GCMOE_ASSIGN_OR_RETURN(server->metrics_,
                         Metrics::Start(config.server.metrics_listen, config.parallel.ranks));
  if (!config.server.auth.tokens_file.empty()) {
    GCMOE_ASSIGN_OR_RETURN(server->auth_, TokenAuthenticator::Load(config.server.auth.tokens_file));
  }
  std::shared_ptr<grpc::ServerCredentials> public_credentials = grpc::InsecureServerCredentials();
  if (!config.server.tls.cert.empty()) {
    GCMOE_ASSIGN_OR_RETURN(server->public_tls_,
                           ReloadableServerCredentials::Create(PublicTlsFiles(config.server)));
    public_credentials = server->public_tls_->credentials();
  }
  std::shared_ptr<grpc::ServerCredentials> rank_credentials = grpc::InsecureServerCredentials();
  if (!config.server.rank_tls.cert.empty()) {
    GCMOE_ASSIGN_OR_RETURN(server->rank_tls_,
                           ReloadableServerCredentials::Create(RankTlsFiles(config.server)));
    rank_credentials = server->rank_tls_->credentials();
  }
  FailureLog::Options failure_options;
  failure_options.interval = std::chrono::milliseconds(config.logging.failure_interval_ms);
  failure_options.lines_per_interval = config.logging.failures_per_interval;
  server->failure_log_ = std::make_unique<FailureLog>(failure_options);
  // The copy threads spin like the hot path's waits: a call's phases (validation, the shards'
  // copies, assembly) come a few hundred microseconds apart, closer than a wake-up is cheap.
  const std::chrono::microseconds spin =
      HotPathSpinBudget(config.server.spin_wait, config.engine.backend);
  server->copy_pool_ = std::make_unique<engine::ThreadPool>(CopyThreads(config.server), spin);
  CoordinatorOptions options;
  options.copy_pool = server->copy_pool_.get();
  options.world_size = config.parallel.ranks;
  options.hidden = config.model.hidden;
  options.experts = config.model.experts;
  options.top_k = config.model.top_k;
  options.max_tokens_per_rank = config.engine.max_tokens_per_rank;
  options.shared_memory_io = config.server.rank_io == "auto";
  options.rank_io_uploaded = config.engine.backend == "cuda";
  options.batch_window = std::chrono::microseconds(config.server.batch_window_us);
  options.max_batch_calls = config.server.max_batch_calls;
  options.max_steps_in_flight = config.server.max_steps_in_flight;
  options.spin = spin;
  options.config_digest = config.Digest();
  options.max_queue = config.server.max_queue;
  options.exchange_timeout_ms = config.engine.exchange_timeout_ms;
  options.step_timeout_ms = config.server.step_timeout_ms;
  options.balancer_enabled = config.balancer.enabled;
  options.nccl_bootstrap = config.engine.backend == "cuda" && config.engine.exchange == "nccl";
  GCMOE_ASSIGN_OR_RETURN(auto planner, BalancePlanner::Create(config));
  server->coordinator_ =
      std::make_unique<Coordinator>(options, std::move(planner), server->stats_.get());
  server->moe_service_ = std::make_unique<MoeServiceImpl>(
      config, max_bytes, server->coordinator_.get(), server->stats_.get(), server->metrics_.get(),
      server->auth_.get(), server->failure_log_.get(), server->copy_pool_.get());
  server->kserve_service_ = std::make_unique<KServeServiceImpl>(
      config, server->moe_service_.get(), server->coordinator_.get(), server->stats_.get());
  Coordinator* coordinator = server->coordinator_.get();
  const int world_size = config.parallel.ranks;
  server->metrics_->SetStateSource([coordinator, world_size] {
    ServiceState state;
    state.serving = coordinator->serving();
    state.queue_depth = coordinator->queue_depth();
    gcmoe::v1::Stats stats;
    // FillRankStats fills the rank entries that are there.
    for (int r = 0; r < world_size; ++r) stats.add_ranks()->set_rank(static_cast<uint32_t>(r));
    coordinator->FillRankStats(&stats);
    state.ranks.assign(stats.ranks().begin(), stats.ranks().end());
    return state;
  });
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
    builder.AddListeningPort(config.server.rank_listen, rank_credentials, &rank_port);
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
    builder.AddListeningPort(config.server.listen, public_credentials, &public_port);
    // gRPC grants a stream the window its message header asks for and checks the size only once
    // the whole message is in: the quota is what refuses oversize calls while they stream in
    // (RESOURCE_EXHAUSTED) and bounds what concurrent ones hold.
    grpc::ResourceQuota quota("gcmoe-public-api");
    quota.Resize(static_cast<size_t>(ReceiveQuotaBytes(config, max_bytes)));
    builder.SetResourceQuota(quota);
    builder.SetMaxReceiveMessageSize(static_cast<int>(max_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(max_bytes));
    builder.RegisterService(server->moe_service_.get());
    builder.RegisterService(server->kserve_service_.get());
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
  spdlog::info(
      "coordinator: API on {}, ranks attach on {} ({} rank(s), {} backend, "
      "max {} tokens per call, max message {} bytes, {} copy thread(s))",
      server->public_address_, server->rank_address_, config.parallel.ranks, config.engine.backend,
      config.max_tokens(), max_bytes, server->copy_pool_->size());
  spdlog::info("coordinator: API {}{}; rank port {}; metrics {}",
               server->public_tls_ ? "over TLS" : "in plaintext",
               !config.server.tls.client_ca.empty() ? " with client certificates (mTLS)" : "",
               server->rank_tls_ ? "over mutual TLS" : "in plaintext",
               server->metrics_->address().empty()
                   ? std::string("off")
                   : "on http://" + server->metrics_->address() + "/metrics");
  if (server->auth_) {
    spdlog::info("coordinator: MoeService calls need a bearer token ({} token(s) from {})",
                 server->auth_->size(), config.server.auth.tokens_file);
    if (!server->public_tls_) {
      spdlog::warn(
          "coordinator: server.auth.tokens_file without server.tls: tokens cross the "
          "network in plaintext");
    }
  }
  return server;
}

Status CoordinatorServer::Reload() {
  Status result = Status::Ok();
  auto reload = [&result](const char* what, const std::function<Status()>& load) {
    if (Status s = load(); !s.ok()) {
      spdlog::error("reload: {} kept as they were: {}", what, s.message());
      if (result.ok()) result = s;
    } else {
      spdlog::info("reload: {} reloaded", what);
    }
  };
  if (public_tls_) reload("API certificates", [this] { return public_tls_->Reload(); });
  if (rank_tls_) reload("rank-port certificates", [this] { return rank_tls_->Reload(); });
  if (auth_) reload("tokens", [this] { return auth_->Reload(); });
  if (!public_tls_ && !rank_tls_ && !auth_) {
    spdlog::info("reload: no TLS certificates or tokens file configured; nothing to reload");
  }
  return result;
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
