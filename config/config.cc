// Loading, the embedded default, and the canonical JSON and digest of a Config.
#include "config/config.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/problems.h"
#include "config/schema.h"

namespace gcmoe::config {

// Generated at build time from config/examples/tiny-cpu.json (config/embed_text.cmake).
extern const char kDefaultConfigJson[];

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Strings from overrides are not checked for UTF-8; never let a dump throw over one.
std::string Dump(const ordered_json& value, int indent) {
  return value.dump(indent, ' ', false, ordered_json::error_handler_t::replace);
}

// The float a config holds, as the shortest decimal that reads back to it ("1.702", not
// "1.7020000219345093"), so that ToJson reads as written and round-trips exactly.
ordered_json FloatJson(float value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof(text) - 1, value);
  *end = '\0';
  return ordered_json(std::strtod(text, nullptr));
}

ordered_json ModelJson(const ModelConfig& m) {
  ordered_json activation = ordered_json::object();
  activation["alpha"] = FloatJson(m.activation_alpha);
  activation["clamp"] = m.activation_clamp ? FloatJson(*m.activation_clamp) : ordered_json();
  activation["up_offset"] = FloatJson(m.activation_up_offset);
  ordered_json j = ordered_json::object();
  j["hidden"] = m.hidden;
  j["intermediate"] = m.intermediate;
  j["experts"] = m.experts;
  j["top_k"] = m.top_k;
  j["layers"] = m.layers;
  j["shared_intermediate"] = m.shared_intermediate;
  j["activation"] = activation;
  j["weights"] = m.weights;
  return j;
}

ordered_json ParallelJson(const ParallelConfig& p) {
  ordered_json j = ordered_json::object();
  j["ranks"] = p.ranks;
  j["devices"] = p.devices;
  j["restart_ranks"] = p.restart_ranks;
  j["restart_backoff_ms"] = p.restart_backoff_ms;
  return j;
}

ordered_json EngineJson(const EngineConfig& e) {
  ordered_json j = ordered_json::object();
  j["backend"] = e.backend;
  j["threads"] = e.threads;
  j["max_tokens_per_rank"] = e.max_tokens_per_rank;
  j["exchange_timeout_ms"] = e.exchange_timeout_ms;
  j["dispatch_sms"] = e.dispatch_sms;
  j["exchange"] = e.exchange;
  ordered_json cuda = ordered_json::object();
  cuda["ring_blocks"] = e.cuda.ring_blocks;
  cuda["role1_grid"] = e.cuda.role1_grid;
  cuda["overlap_roles"] = e.cuda.overlap_roles;
  cuda["wait_timeout_ms"] = e.cuda.wait_timeout_ms;
  cuda["wait_sleep_cap_ns"] = e.cuda.wait_sleep_cap_ns;
  cuda["trace_role2"] = e.cuda.trace_role2;
  j["cuda"] = cuda;
  return j;
}

ordered_json BalancerJson(const BalancerConfig& b) {
  ordered_json j = ordered_json::object();
  j["enabled"] = b.enabled;
  j["topology"] = b.topology;
  j["replicas_per_rank"] = b.replicas_per_rank;
  j["fractional_bits"] = b.fractional_bits;
  j["passes"] = b.passes ? ordered_json(*b.passes) : ordered_json("auto");
  j["placement"] = b.placement;
  j["placement_file"] = b.placement_file;
  j["refit_steps"] = b.refit_steps;
  return j;
}

ordered_json ServerJson(const ServerConfig& s) {
  ordered_json j = ordered_json::object();
  j["listen"] = s.listen;
  j["rank_listen"] = s.rank_listen;
  j["coordinator"] = s.coordinator;
  j["max_message_bytes"] = s.max_message_bytes;
  j["receive_quota_bytes"] = s.receive_quota_bytes;
  j["default_deadline_ms"] = s.default_deadline_ms;
  j["max_queue"] = s.max_queue;
  j["startup_timeout_ms"] = s.startup_timeout_ms;
  j["step_timeout_ms"] = s.step_timeout_ms;
  j["rank_io"] = s.rank_io;
  j["batch_window_us"] = s.batch_window_us;
  j["max_batch_calls"] = s.max_batch_calls;
  j["max_steps_in_flight"] = s.max_steps_in_flight;
  j["spin_wait"] = s.spin_wait;
  j["copy_threads"] = s.copy_threads;
  j["echo"] = s.echo;
  j["allow_registered_memory"] = s.allow_registered_memory;
  j["metrics_listen"] = s.metrics_listen;
  ordered_json tls = ordered_json::object();
  tls["cert"] = s.tls.cert;
  tls["key"] = s.tls.key;
  tls["client_ca"] = s.tls.client_ca;
  j["tls"] = tls;
  ordered_json rank_tls = ordered_json::object();
  rank_tls["cert"] = s.rank_tls.cert;
  rank_tls["key"] = s.rank_tls.key;
  rank_tls["ca"] = s.rank_tls.ca;
  j["rank_tls"] = rank_tls;
  ordered_json auth = ordered_json::object();
  auth["tokens_file"] = s.auth.tokens_file;
  j["auth"] = auth;
  j["rank_secret_file"] = s.rank_secret_file;
  return j;
}

ordered_json LoggingJson(const LoggingConfig& l) {
  ordered_json j = ordered_json::object();
  j["level"] = l.level;
  j["format"] = l.format;
  j["file"] = l.file;
  j["failure_interval_ms"] = l.failure_interval_ms;
  j["failures_per_interval"] = l.failures_per_interval;
  return j;
}

// "line 3, column 14: invalid JSON: syntax error while parsing object - unexpected '}'; ..."
std::string SyntaxErrorMessage(const std::string& text, const json::parse_error& e) {
  // e.byte counts the characters read, the offending one included.
  const size_t offset = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, text.size());
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  // what(): "[json.exception.parse_error.101] parse error at line 3, column 14: <detail>".
  const std::string what = e.what();
  const size_t colon = what.find(": ");
  const std::string detail = colon == std::string::npos ? what : what.substr(colon + 2);
  return "line " + std::to_string(line) + ", column " + std::to_string(offset - line_start + 1) +
         ": invalid JSON: " + detail;
}

}  // namespace

std::string Config::ToJson() const {
  ordered_json j = ordered_json::object();
  j["model"] = ModelJson(model);
  j["parallel"] = ParallelJson(parallel);
  j["engine"] = EngineJson(engine);
  j["balancer"] = BalancerJson(balancer);
  j["server"] = ServerJson(server);
  j["logging"] = LoggingJson(logging);
  return Dump(j, 2);
}

std::string Config::Digest() const {
  // Exactly what every process of one service must agree on; devices, listen addresses and
  // logging legitimately differ between the processes of one service.
  ordered_json parallel_part = ordered_json::object();
  parallel_part["ranks"] = parallel.ranks;
  ordered_json j = ordered_json::object();
  j["model"] = ModelJson(model);
  j["parallel"] = parallel_part;
  j["engine"] = EngineJson(engine);
  j["balancer"] = BalancerJson(balancer);
  // FNV-1a, 64 bits: stable across builds and platforms, unlike std::hash.
  uint64_t hash = 14695981039346656037ull;
  for (const unsigned char c : Dump(j, -1)) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

const std::string& DefaultConfigText() {
  static const std::string text(kDefaultConfigJson);
  return text;
}

Config DefaultConfig() {
  Result<Config> config = ParseConfig(DefaultConfigText(), "<embedded default>");
  if (!config.ok()) {
    // Not input but a build defect: tests/config validates the embedded file.
    std::fprintf(stderr, "gcmoe: the embedded default config is invalid: %s\n",
                 config.status().message().c_str());
    std::abort();
  }
  return std::move(config).value();
}

Result<Config> ParseConfig(const std::string& json_text, const std::string& source_name,
                           const std::vector<std::string>& overrides,
                           const CheckpointReader& checkpoint) {
  json document;
  try {
    document = json::parse(json_text);
  } catch (const json::parse_error& e) {
    return InvalidArgument(SyntaxErrorMessage(json_text, e));
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("invalid JSON: ") + e.what());
  }
  internal::Problems problems;
  Config config;
  try {
    internal::ApplyOverrides(overrides, &document, &problems);
    config = internal::ReadConfig(document, &problems, checkpoint);
    // Rules between keys would only restate that the document is not an object at all.
    if (document.is_object()) internal::CheckCrossFieldRules(config, &problems);
  } catch (const json::exception& e) {
    return Internal(std::string("reading the config: ") + e.what());
  }
  GCMOE_RETURN_IF_ERROR(problems.ToStatus());
  config.source = source_name;
  return config;
}

Result<Config> LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides,
                              const CheckpointReader& checkpoint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read config file " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLoss("error reading config file " + path);
  return ParseConfig(text.str(), path, overrides, checkpoint);
}

}  // namespace gcmoe::config
