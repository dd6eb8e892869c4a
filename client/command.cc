// `gcmoe client health | info | stats | forward`: a command-line client of the public API.
#include "client/command.h"

#include <cstdio>
#include <cstring>
#include <string>

#include <google/protobuf/util/json_util.h>

#include "client/channel.h"
#include "client/forward.h"
#include "client/tensors.h"
#include "common/flags.h"
#include "gcmoe/v1/moe.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace gcmoe::client {
namespace {

using client::DeadlineIn;
using client::DescribeFailure;
using client::MakeChannel;

constexpr const char* kDefaultAddr = "127.0.0.1:50051";

void PrintGroupUsage(FILE* out) {
  std::fputs(
      "usage: gcmoe client COMMAND [flags]   (gcmoe client COMMAND --help for its flags)\n"
      "\n"
      "Calls a running gcmoe service (gcmoe.v1.MoeService) over gRPC.\n"
      "\n"
      "commands:\n"
      "  health   grpc.health.v1 check: prints SERVING or NOT_SERVING (exit 0 only when SERVING)\n"
      "  info     the served model: shapes, dtypes, ranks, limits\n"
      "  stats    the service's counters, latencies and balance since start-up\n"
      "  forward  send Forward requests (random or from .npy files) and print a summary\n",
      out);
}

std::string JsonOf(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}\n";
  return json;
}

std::string Fixed(double v, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, v);
  return text;
}

std::string Bytes(uint64_t bytes) {
  if (bytes >= (1ull << 20)) return Fixed(bytes / double(1 << 20), 1) + " MiB";
  if (bytes >= (1ull << 10)) return Fixed(bytes / double(1 << 10), 1) + " KiB";
  return std::to_string(bytes) + " B";
}

int RunHealth(int argc, char** argv) {
  std::string addr = kDefaultAddr;
  std::string service;
  int timeout_ms = 5000;
  Flags flags("gcmoe client health",
              "Asks the service's grpc.health.v1.Health for its status and prints it: SERVING,\n"
              "NOT_SERVING (some rank is not ready) or SERVICE_UNKNOWN. Exit status 0 only when\n"
              "SERVING: usable as a readiness probe.");
  flags.String("addr", &addr, "service address host:port");
  flags.String("service", &service,
               "service name to check: \"\" (the server as a whole) or gcmoe.v1.MoeService");
  flags.Int("timeout-ms", &timeout_ms, "deadline of the check in milliseconds");
  client::ConnectionOptions connection;
  client::AddConnectionFlags(&flags, &connection);
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;

  auto made = MakeChannel(addr, client::kDefaultMaxMessageBytes, connection);
  if (!made.ok()) {
    std::fprintf(stderr, "gcmoe client health: %s\n", made.status().message().c_str());
    return 2;
  }
  std::shared_ptr<grpc::Channel> channel = *made;
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(timeout_ms));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    std::printf("SERVICE_UNKNOWN\n");
    std::fprintf(stderr, "%s does not know the service \"%s\"\n", addr.c_str(), service.c_str());
    return 1;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n",
                 DescribeFailure(addr, "Health.Check", channel.get(), status).c_str());
    return 1;
  }
  std::printf("%s\n",
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

std::string DTypeList(const google::protobuf::RepeatedField<int>& dtypes) {
  std::string s;
  for (const int d : dtypes) {
    s += (s.empty() ? "" : ", ") + client::DTypeName(static_cast<v1::DType>(d));
  }
  return s.empty() ? "(none listed)" : s;
}

void PrintModelInfo(const std::string& addr, const v1::ModelInfo& m) {
  std::printf("gcmoe %s at %s\n", m.version().c_str(), addr.c_str());
  std::printf("  model       H=%u I=%u E=%u top-%u, %u layer%s, %s\n", m.hidden(), m.intermediate(),
              m.experts(), m.top_k(), m.layers(), m.layers() == 1 ? "" : "s",
              m.shared_intermediate() > 0
                  ? ("shared expert I_s=" + std::to_string(m.shared_intermediate())).c_str()
                  : "no shared expert");
  std::printf("  activation  SwiGLU, alpha %g, clamp %s, up offset %g\n", m.activation_alpha(),
              m.activation_clamp_enabled() ? Fixed(m.activation_clamp(), 3).c_str() : "none",
              m.activation_up_offset());
  // Which model layer each MoE layer is, where they differ (dense layers are not served).
  bool identity = true;
  std::string model_layers;
  for (int l = 0; l < m.model_layers_size(); ++l) {
    identity = identity && m.model_layers(l) == static_cast<uint32_t>(l);
    model_layers += (l ? "," : "") + std::to_string(m.model_layers(l));
  }
  if (!identity)
    std::printf("  layers      MoE layer i is model layer [%s][i]\n", model_layers.c_str());
  std::printf("  weights     %s\n", m.weights().c_str());
  std::printf("              routed: %s\n", m.routed_weight_format().c_str());
  if (m.shared_intermediate() > 0) {
    std::printf("              shared: %s\n", m.shared_weight_format().c_str());
  }
  std::printf("  dtypes      hidden %s; output %s\n", DTypeList(m.hidden_dtypes()).c_str(),
              DTypeList(m.output_dtypes()).c_str());
  std::printf("  parallel    %u rank%s, %s backend, balancer %s\n", m.ranks(),
              m.ranks() == 1 ? "" : "s", m.backend().c_str(), m.balancer_enabled() ? "on" : "off");
  std::printf("  limits      %u tokens per request, %s per message\n", m.max_tokens(),
              m.max_message_bytes() > 0 ? Bytes(m.max_message_bytes()).c_str() : "(not stated)");
  std::string kinds;
  for (const std::string& kind : m.memory_kinds()) kinds += (kinds.empty() ? "" : ", ") + kind;
  std::printf("  registered  %s\n",
              kinds.empty() ? "off (server.allow_registered_memory)" : kinds.c_str());
}

int RunInfo(int argc, char** argv) {
  std::string addr = kDefaultAddr;
  int timeout_ms = 10000;
  bool json = false;
  Flags flags("gcmoe client info",
              "Prints the served model (GetModelInfo): H, I, experts, top-k, layers, dtypes,\n"
              "ranks, backend and the request limits.");
  flags.String("addr", &addr, "service address host:port");
  flags.Int("timeout-ms", &timeout_ms, "deadline of the call in milliseconds");
  flags.Bool("json", &json, "print the ModelInfo message as JSON");
  client::ConnectionOptions connection;
  client::AddConnectionFlags(&flags, &connection);
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;

  auto made = MakeChannel(addr, client::kDefaultMaxMessageBytes, connection);
  if (!made.ok()) {
    std::fprintf(stderr, "gcmoe client info: %s\n", made.status().message().c_str());
    return 2;
  }
  std::shared_ptr<grpc::Channel> channel = *made;
  auto stub = v1::MoeService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(timeout_ms));
  v1::ModelInfo info;
  const grpc::Status status = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n",
                 DescribeFailure(addr, "GetModelInfo", channel.get(), status).c_str());
    return 1;
  }
  if (json) {
    std::fputs(JsonOf(info).c_str(), stdout);
    std::fputs("\n", stdout);
  } else {
    PrintModelInfo(addr, info);
  }
  return 0;
}

std::string Latency(const v1::LatencySummary& l) {
  return "p50 " + Fixed(l.p50_us(), 1) + "  p90 " + Fixed(l.p90_us(), 1) + "  p99 " +
         Fixed(l.p99_us(), 1) + "  max " + Fixed(l.max_us(), 1) + "  mean " +
         Fixed(l.mean_us(), 1) + " us (" + std::to_string(l.count()) + " calls)";
}

void PrintStats(const std::string& addr, const v1::Stats& s) {
  std::printf("gcmoe at %s: %s, up %.1f s, %llu steps\n", addr.c_str(),
              s.serving() ? "serving" : "NOT serving", s.uptime_s(),
              static_cast<unsigned long long>(s.steps()));
  std::string failures;
  // A std::map view of the proto map, for a stable order.
  const std::map<std::string, uint64_t> by_code(s.failures_by_code().begin(),
                                                s.failures_by_code().end());
  for (const auto& [code, count] : by_code) {
    failures += (failures.empty() ? " (" : ", ") + code + " " + std::to_string(count);
  }
  if (!failures.empty()) failures += ")";
  std::printf("  requests   %llu ok, %llu failed%s\n",
              static_cast<unsigned long long>(s.requests_ok()),
              static_cast<unsigned long long>(s.requests_failed()), failures.c_str());
  std::printf("  tokens     %llu\n", static_cast<unsigned long long>(s.tokens_total()));
  std::printf("  latency    %s, at the coordinator\n", Latency(s.latency()).c_str());
  std::printf("  engine     %s, slowest rank\n", Latency(s.engine_latency()).c_str());
  std::printf(
      "  balance    mean(L)/max(L) %.3f unbalanced -> %.3f balanced; relief %.1f passes, "
      "%.2f us\n",
      s.spatial_utilization_before(), s.spatial_utilization_after(), s.relief_passes_mean(),
      s.relief_solve_us_mean());
  for (const v1::RankStats& r : s.ranks()) {
    std::printf("  rank %-5u %s, %llu restart%s, load %lld -> %lld, engine mean %.1f us\n",
                r.rank(), r.ready() ? "ready" : "NOT ready",
                static_cast<unsigned long long>(r.restarts()), r.restarts() == 1 ? "" : "s",
                static_cast<long long>(r.load_before_total()),
                static_cast<long long>(r.load_after_total()), r.engine_us_mean());
    if (r.has_gpu_memory()) {
      std::printf("             GPU %d: %.2f of %.2f GiB in use\n", r.gpu_memory().device(),
                  static_cast<double>(r.gpu_memory().used_bytes()) / (1 << 30),
                  static_cast<double>(r.gpu_memory().total_bytes()) / (1 << 30));
    }
  }
}

int RunStats(int argc, char** argv) {
  std::string addr = kDefaultAddr;
  int timeout_ms = 10000;
  bool json = false;
  Flags flags("gcmoe client stats",
              "Prints the service's statistics (GetStats): requests by outcome, latency\n"
              "percentiles, load balance before and after Relief, and each rank's state.");
  flags.String("addr", &addr, "service address host:port");
  flags.Int("timeout-ms", &timeout_ms, "deadline of the call in milliseconds");
  flags.Bool("json", &json, "print the Stats message as JSON");
  client::ConnectionOptions connection;
  client::AddConnectionFlags(&flags, &connection);
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;

  auto made = MakeChannel(addr, client::kDefaultMaxMessageBytes, connection);
  if (!made.ok()) {
    std::fprintf(stderr, "gcmoe client stats: %s\n", made.status().message().c_str());
    return 2;
  }
  std::shared_ptr<grpc::Channel> channel = *made;
  auto stub = v1::MoeService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(timeout_ms));
  v1::Stats stats;
  const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", DescribeFailure(addr, "GetStats", channel.get(), status).c_str());
    return 1;
  }
  if (json) {
    std::fputs(JsonOf(stats).c_str(), stdout);
    std::fputs("\n", stdout);
  } else {
    PrintStats(addr, stats);
  }
  return 0;
}

}  // namespace

int RunClientCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintGroupUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "health") return RunHealth(argc, argv);
  if (command == "info") return RunInfo(argc, argv);
  if (command == "stats") return RunStats(argc, argv);
  if (command == "forward") return client::RunForward(argc, argv);
  std::fprintf(stderr, "gcmoe client: unknown command \"%s\"\n\n", command.c_str());
  PrintGroupUsage(stderr);
  return 2;
}

}  // namespace gcmoe::client
