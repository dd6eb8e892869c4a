// Every problem of a bad config is reported at once, each with its JSON path and the value
// expected. One table row per rule: a mutation of the valid tiny-cpu document and the exact
// line it must produce (and no other line, so a rule never cascades into spurious ones).
#include <functional>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/config.h"

namespace gcmoe::config {
namespace {

using nlohmann::json;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct BadConfig {
  const char* name;
  std::function<void(json&)> mutate;
  std::string expected_line;
};

void PrintTo(const BadConfig& c, std::ostream* os) { *os << c.name; }

class ConfigErrorTable : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigErrorTable, ReportsExactlyTheExpectedLine) {
  json document = json::parse(DefaultConfigText());
  GetParam().mutate(document);
  Result<Config> config = ParseConfig(document.dump(), "bad.json");
  ASSERT_FALSE(config.ok()) << "accepted: " << document.dump();
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(Lines(config.status().message()), ::testing::ElementsAre(GetParam().expected_line));
}

const BadConfig kBadConfigs[] = {
    {"HiddenNotMultipleOf32", [](json& j) { j["model"]["hidden"] = 100; },
     "model.hidden: expected a positive multiple of 32 up to 1048576, got 100"},
    {"HiddenTooLarge", [](json& j) { j["model"]["hidden"] = 1 << 21; },
     "model.hidden: expected a positive multiple of 32 up to 1048576, got 2097152"},
    {"ExpertsTooMany", [](json& j) { j["model"]["experts"] = 70000; },
     "model.experts: expected a positive integer up to 65536, got 70000"},
    {"LayersTooMany", [](json& j) { j["model"]["layers"] = 1 << 20; },
     "model.layers: expected a positive integer up to 65536, got 1048576"},
    {"HiddenIsFloat", [](json& j) { j["model"]["hidden"] = 256.0; },
     "model.hidden: expected an integer, got 256.0"},
    {"IntermediateZero", [](json& j) { j["model"]["intermediate"] = 0; },
     "model.intermediate: expected a positive multiple of 32 up to 1048576, got 0"},
    {"HiddenMissing", [](json& j) { j["model"].erase("hidden"); },
     "model.hidden: required key is missing (expected a positive multiple of 32 up to 1048576)"},
    {"ModelMissing", [](json& j) { j.erase("model"); },
     "model: required section is missing (expected an object with hidden, intermediate, experts, "
     "top_k, layers and weights)"},
    {"ModelNotAnObject", [](json& j) { j["model"] = 5; },
     "model: expected an object with hidden, intermediate, experts, top_k, layers and weights, "
     "got 5"},
    {"ListenWithoutPort", [](json& j) { j["server"]["listen"] = "localhost"; },
     "server.listen: expected host:port, got \"localhost\""},
    {"ListenPortTooLarge", [](json& j) { j["server"]["listen"] = "127.0.0.1:70000"; },
     "server.listen: expected host:port, got \"127.0.0.1:70000\""},
    {"CoordinatorNotHostPort", [](json& j) { j["server"]["coordinator"] = "coordinator"; },
     "server.coordinator: expected host:port or \"\" (none), got \"coordinator\""},
    {"PassesZero", [](json& j) { j["balancer"]["passes"] = 0; },
     "balancer.passes: expected a positive integer or \"auto\", got 0"},
    {"PassesWrongWord", [](json& j) { j["balancer"]["passes"] = "many"; },
     "balancer.passes: expected a positive integer or \"auto\", got \"many\""},
    {"MisspeltKey", [](json& j) { j["model"]["hiden"] = 256; },
     "model.hiden: unknown key (did you mean model.hidden?)"},
    {"MisspeltSection", [](json& j) { j["paralel"] = json::object(); },
     "paralel: unknown key (did you mean parallel?)"},
    {"KeyInWrongSection", [](json& j) { j["model"]["ranks"] = 2; },
     "model.ranks: unknown key (did you mean parallel.ranks?)"},
    {"DottedKeyWrittenFlat", [](json& j) { j["model.activation.alpha"] = 1.0; },
     "model.activation.alpha: unknown key (keys nest as objects: write {\"model\": "
     "{\"activation\": {\"alpha\": ...}}})"},
    {"UnknownKeyNoSuggestion", [](json& j) { j["engine"]["turbo"] = true; },
     "engine.turbo: unknown key"},
    {"RanksIsString", [](json& j) { j["parallel"]["ranks"] = "2"; },
     "parallel.ranks: expected an integer, got \"2\""},
    {"RanksTooMany", [](json& j) { j["parallel"]["ranks"] = 5000; },
     "parallel.ranks: expected an integer in 1..1024, got 5000"},
    {"TopKAboveExperts", [](json& j) { j["model"]["top_k"] = 20; },
     "model.top_k: expected at most model.experts (16), got 20"},
    {"SharedNotMultipleOf32", [](json& j) { j["model"]["shared_intermediate"] = 100; },
     "model.shared_intermediate: expected 0 (no shared expert) or a positive multiple of 32 up to "
     "1048576, "
     "got 100"},
    {"FewerExpertsThanRanks",
     [](json& j) {
       j["model"]["experts"] = 1;
       j["model"]["top_k"] = 1;
     },
     "model.experts: expected at least parallel.ranks (2), got 1"},
    {"DevicesLengthNotRanks",
     [](json& j) {
       j["parallel"]["devices"] = {0, 1, 2};
     },
     "parallel.devices: expected one GPU index per rank (parallel.ranks = 2), got 3 entries"},
    {"DeviceNegative",
     [](json& j) {
       j["parallel"]["devices"] = {0, -1};
     },
     "parallel.devices[1]: expected a non-negative integer (a GPU index), got -1"},
    {"DevicesNotAList", [](json& j) { j["parallel"]["devices"] = 0; },
     "parallel.devices: expected a list of GPU indices, one per rank, got 0"},
    {"BackendUnknown", [](json& j) { j["engine"]["backend"] = "gpu"; },
     "engine.backend: expected \"cpu\" or \"cuda\", got \"gpu\""},
    {"ExchangeUnknown", [](json& j) { j["engine"]["exchange"] = "mpi"; },
     "engine.exchange: expected \"gcmoe\" or \"nccl\", got \"mpi\""},
    {"CudaOverlapRolesUnknown", [](json& j) { j["engine"]["cuda"]["overlap_roles"] = "yes"; },
     "engine.cuda.overlap_roles: expected \"auto\", \"on\" or \"off\", got \"yes\""},
    {"CudaWaitSleepCapBelowFloor", [](json& j) { j["engine"]["cuda"]["wait_sleep_cap_ns"] = 100; },
     "engine.cuda.wait_sleep_cap_ns: expected an integer in 512..1000000 (nanoseconds), got 100"},
    {"CudaRingBlocksNegative", [](json& j) { j["engine"]["cuda"]["ring_blocks"] = -1; },
     "engine.cuda.ring_blocks: expected an integer in 0..1048576 (0 = no slot reuse), got -1"},
    {"CudaWaitTimeoutZero", [](json& j) { j["engine"]["cuda"]["wait_timeout_ms"] = 0; },
     "engine.cuda.wait_timeout_ms: expected an integer in 1..3600000 (milliseconds), got 0"},
    {"RankIoUnknown", [](json& j) { j["server"]["rank_io"] = "shm"; },
     "server.rank_io: expected \"auto\" or \"inline\", got \"shm\""},
    {"SpinWaitUnknown", [](json& j) { j["server"]["spin_wait"] = "yes"; },
     "server.spin_wait: expected \"auto\", \"on\" or \"off\", got \"yes\""},
    {"BatchWindowNegative", [](json& j) { j["server"]["batch_window_us"] = -1; },
     "server.batch_window_us: expected an integer in 0..1000000 (microseconds), got -1"},
    {"MaxBatchCallsZero", [](json& j) { j["server"]["max_batch_calls"] = 0; },
     "server.max_batch_calls: expected an integer in 1..4096, got 0"},
    {"CopyThreadsTooMany", [](json& j) { j["server"]["copy_threads"] = 65; },
     "server.copy_threads: expected an integer in 0..64 (0 = auto), got 65"},
    {"EchoNotBool", [](json& j) { j["server"]["echo"] = "yes"; },
     "server.echo: expected true or false, got \"yes\""},
    {"CudaUnknownKey", [](json& j) { j["engine"]["cuda"]["ring_block"] = 2; },
     "engine.cuda.ring_block: unknown key (did you mean engine.cuda.ring_blocks?)"},
    {"MaxTokensZero", [](json& j) { j["engine"]["max_tokens_per_rank"] = 0; },
     "engine.max_tokens_per_rank: expected an integer in 1..1048576, got 0"},
    {"TorusDoesNotCoverRanks",
     [](json& j) {
       j["parallel"]["ranks"] = 4;
       j["balancer"] = {{"enabled", true}, {"topology", "torus:2x4"}};
     },
     "balancer.topology: expected \"torus:AxB\" with A*B = parallel.ranks (4), got \"torus:2x4\" "
     "(8 ranks)"},
    {"CubeNeedsEightRanks",
     [](json& j) {
       j["parallel"]["ranks"] = 4;
       j["balancer"] = {{"enabled", true}, {"topology", "cube"}};
     },
     "balancer.topology: expected \"ring\" or \"torus:AxB\" for parallel.ranks = 4 (\"cube\" needs "
     "exactly 8), got \"cube\""},
    {"TopologyUnknown", [](json& j) { j["balancer"]["topology"] = "mesh"; },
     "balancer.topology: expected \"ring\", \"cube\" or \"torus:AxB\", got \"mesh\""},
    {"TorusZeroDimension", [](json& j) { j["balancer"]["topology"] = "torus:0x2"; },
     "balancer.topology: expected \"ring\", \"cube\" or \"torus:AxB\", got \"torus:0x2\""},
    {"PlacementFileMissing", [](json& j) { j["balancer"]["placement"] = "file"; },
     "balancer.placement_file: expected a file path when balancer.placement is \"file\", got \"\""},
    {"ObservedWithoutRefit", [](json& j) { j["balancer"]["placement"] = "observed"; },
     "balancer.refit_steps: expected a positive integer when balancer.placement is \"observed\", "
     "got 0"},
    {"PlacementUnknown", [](json& j) { j["balancer"]["placement"] = "random"; },
     "balancer.placement: expected \"uniform\", \"file\" or \"observed\", got \"random\""},
    {"ReplicasAboveExpertsPerRank",
     [](json& j) {
       j["balancer"] = {{"enabled", true}, {"replicas_per_rank", 9}};
     },
     "balancer.replicas_per_rank: expected at most the experts per rank (model.experts / "
     "parallel.ranks = 8), got 9"},
    {"BalancerOnOneRank",
     [](json& j) {
       j["parallel"]["ranks"] = 1;
       j["balancer"]["enabled"] = true;
     },
     "balancer.enabled: expected false with parallel.ranks = 1 (one rank has nothing to "
     "balance), got true"},
    {"EnabledNotBool", [](json& j) { j["balancer"]["enabled"] = "yes"; },
     "balancer.enabled: expected true or false, got \"yes\""},
    {"FractionalBitsTooMany", [](json& j) { j["balancer"]["fractional_bits"] = 31; },
     "balancer.fractional_bits: expected an integer in 0..30, got 31"},
    {"ClampNegative", [](json& j) { j["model"]["activation"]["clamp"] = -1; },
     "model.activation.clamp: expected a positive number or null, got -1"},
    {"AlphaIsString", [](json& j) { j["model"]["activation"]["alpha"] = "1"; },
     "model.activation.alpha: expected a number, got \"1\""},
    {"ActivationNotAnObject", [](json& j) { j["model"]["activation"] = 1.5; },
     "model.activation: expected an object with alpha, clamp and up_offset, got 1.5"},
    {"WeightsBadSeed", [](json& j) { j["model"]["weights"] = "synthetic:abc"; },
     "model.weights: expected \"synthetic:SEED\", \"hf:DIR\" or a safetensors file path, got "
     "\"synthetic:abc\""},
    {"WeightsEmpty", [](json& j) { j["model"]["weights"] = ""; },
     "model.weights: expected \"synthetic:SEED\", \"hf:DIR\" or a safetensors file path, got "
     "\"\""},
    {"WeightsHfWithoutDir", [](json& j) { j["model"]["weights"] = "hf:"; },
     "model.weights: expected \"synthetic:SEED\", \"hf:DIR\" or a safetensors file path, got "
     "\"hf:\""},
    {"UpOffsetIsString", [](json& j) { j["model"]["activation"]["up_offset"] = "one"; },
     "model.activation.up_offset: expected a finite number (0 = plain SwiGLU), got \"one\""},
    {"LevelUnknown",
     [](json& j) {
       j["logging"] = {{"level", "verbose"}};
     },
     "logging.level: expected \"trace\", \"debug\", \"info\", \"warn\" or \"error\", got "
     "\"verbose\""},
    {"ReceiveQuotaNegative", [](json& j) { j["server"]["receive_quota_bytes"] = -5; },
     "server.receive_quota_bytes: expected 0 (2 x the message limit, at least 256 MiB) or a byte "
     "count up to 2^40, got -5"},
    {"MaxMessageBytesNegative", [](json& j) { j["server"]["max_message_bytes"] = -1; },
     "server.max_message_bytes: expected 0 (derived from capacity) or a byte count up to "
     "2147483647, got -1"},
    {"StepTimeoutZero", [](json& j) { j["server"]["step_timeout_ms"] = 0; },
     "server.step_timeout_ms: expected a positive integer (milliseconds), got 0"},
    {"MetricsListenNotHostPort", [](json& j) { j["server"]["metrics_listen"] = "9464"; },
     "server.metrics_listen: expected host:port or \"\" (no metrics endpoint), got \"9464\""},
    {"TlsCertWithoutKey",
     [](json& j) {
       j["server"]["tls"] = {{"cert", "/etc/gcmoe/tls.crt"}};
     },
     "server.tls.key: expected a PEM file path: server.tls.cert and server.tls.key go together, "
     "got \"\""},
    {"TlsClientCaWithoutTls",
     [](json& j) {
       j["server"]["tls"] = {{"client_ca", "/etc/gcmoe/ca.crt"}};
     },
     "server.tls.client_ca: expected \"\" without server.tls.cert and server.tls.key (mTLS needs "
     "TLS), got \"/etc/gcmoe/ca.crt\""},
    {"TlsUnknownKey",
     [](json& j) {
       j["server"]["tls"] = {{"ca", "/etc/gcmoe/ca.crt"}};
     },
     "server.tls.ca: unknown key (did you mean server.rank_tls.ca?)"},
    {"RankTlsWithoutCa",
     [](json& j) {
       j["server"]["rank_tls"] = {{"cert", "/etc/gcmoe/rank.crt"}, {"key", "/etc/gcmoe/rank.key"}};
     },
     "server.rank_tls.ca: expected a PEM file path: server.rank_tls.cert, key and ca go together "
     "(mutual TLS), got \"\""},
    {"TokensFileNotAString",
     [](json& j) {
       j["server"]["auth"] = {{"tokens_file", 7}};
     },
     "server.auth.tokens_file: expected a file path or \"\" (no authentication), got 7"},
    {"RankSecretFileNotAString", [](json& j) { j["server"]["rank_secret_file"] = 7; },
     "server.rank_secret_file: expected a file path or \"\" (gcmoe serve: one it creates), got "
     "7"},
    {"FailureIntervalTooShort", [](json& j) { j["logging"]["failure_interval_ms"] = 50; },
     "logging.failure_interval_ms: expected an integer in 100..3600000 (milliseconds), got 50"},
    {"FailuresPerIntervalNegative", [](json& j) { j["logging"]["failures_per_interval"] = -1; },
     "logging.failures_per_interval: expected an integer in 0..100000 (0 = summaries only), got "
     "-1"},
    {"IntegerBeyondInt64", [](json& j) { j["server"]["max_queue"] = 18446744073709551615ull; },
     "server.max_queue: expected a positive integer, got 18446744073709551615"},
    {"TopLevelNotAnObject",
     [](json& j) {
       j = json::array({1, 2});
     },
     "(top level): expected an object with sections model, parallel, engine, balancer, server "
     "and logging, got [1,2]"},
};

INSTANTIATE_TEST_SUITE_P(Rules, ConfigErrorTable, ::testing::ValuesIn(kBadConfigs),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConfigErrors, EveryProblemIsReportedTogetherInDocumentOrder) {
  const std::string text = R"({
    "model": {"hidden": 100, "intermediate": 96, "experts": 4, "top_k": 8, "layers": 0,
              "weights": "synthetic:1", "activaton": {}},
    "parallel": {"ranks": "2"},
    "engine": {"backend": "cuda"},
    "server": {"listen": "localhost"},
    "balancer": {"enabled": true, "passes": 0}
  })";
  Result<Config> config = ParseConfig(text, "bad.json");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(
      Lines(config.status().message()),
      ::testing::ElementsAre(
          "model.hidden: expected a positive multiple of 32 up to 1048576, got 100",
          "model.layers: expected a positive integer up to 65536, got 0",
          "parallel.ranks: expected an integer, got \"2\"",
          "balancer.passes: expected a positive integer or \"auto\", got 0",
          "server.listen: expected host:port, got \"localhost\"",
          "model.activaton: unknown key (did you mean model.activation?)",
          "model.top_k: expected at most model.experts (4), got 8"));
}

TEST(ConfigErrors, RulesBetweenKeysSkipKeysThatAlreadyFailed) {
  // top_k is not an integer: "top_k <= experts" must not add a second line about it.
  json document = json::parse(DefaultConfigText());
  document["model"]["top_k"] = "four";
  document["model"]["experts"] = 0;
  Result<Config> config = ParseConfig(document.dump(), "bad.json");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(Lines(config.status().message()),
              ::testing::ElementsAre(
                  "model.experts: expected a positive integer up to 65536, got 0",
                  "model.top_k: expected an integer, got \"four\""));
}

}  // namespace
}  // namespace gcmoe::config
