// Loading, examples, the embedded default, overrides, canonical JSON and the digest.
#include "config/config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gcmoe::config {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ExamplePath(const std::string& name) {
  return std::string(GCMOE_CONFIG_EXAMPLES_DIR) + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Config MustParse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  Result<Config> config = ParseConfig(text, "test", overrides);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? std::move(config).value() : Config{};
}

TEST(ConfigExamples, EveryExampleParsesAndValidates) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GCMOE_CONFIG_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    Result<Config> config = LoadConfigFile(entry.path().string());
    EXPECT_TRUE(config.ok()) << entry.path() << ": " << config.status().ToString();
    if (config.ok()) {
      EXPECT_EQ(config->source, entry.path().string());
    }
  }
  EXPECT_GE(count, 6);
}

TEST(ConfigExamples, GpuRankExamplesDescribeOneRankOfEp8) {
  Result<Config> glm = LoadConfigFile(ExamplePath("glm-5.2-ep8-rank.json"));
  ASSERT_TRUE(glm.ok()) << glm.status().ToString();
  EXPECT_EQ(glm->model.hidden, 6144);
  EXPECT_EQ(glm->model.intermediate, 2048);
  EXPECT_EQ(glm->model.experts, 32);
  EXPECT_EQ(glm->model.top_k, 8);
  EXPECT_EQ(glm->model.layers, 1);
  EXPECT_EQ(glm->model.shared_intermediate, 0);
  EXPECT_EQ(glm->model.activation_clamp, 10.0f);
  EXPECT_EQ(glm->parallel.ranks, 1);
  EXPECT_EQ(glm->engine.backend, "cuda");
  EXPECT_EQ(glm->engine.max_tokens_per_rank, 256);

  Result<Config> ds = LoadConfigFile(ExamplePath("deepseek-v4.1-flash-ep8-rank.json"));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->model.hidden, 5120);
  EXPECT_EQ(ds->model.intermediate, 2304);
  EXPECT_EQ(ds->model.experts, 48);
  EXPECT_EQ(ds->model.top_k, 6);
  EXPECT_EQ(ds->engine.backend, "cuda");

  // gpt-oss-120b's layer (H = I = 2880, not multiples of 128) on the CUDA backend: the GPU
  // kernels run it zero-padded (DESIGN.md §6), so nothing in the config refuses it.
  Result<Config> oss = LoadConfigFile(ExamplePath("gpt-oss-120b-layer.json"));
  ASSERT_TRUE(oss.ok()) << oss.status().ToString();
  EXPECT_EQ(oss->model.hidden, 2880);
  EXPECT_EQ(oss->model.intermediate, 2880);
  EXPECT_EQ(oss->model.experts, 128);
  EXPECT_EQ(oss->model.top_k, 4);
  EXPECT_EQ(oss->model.activation_up_offset, 1.0f);
  EXPECT_EQ(oss->engine.backend, "cuda");

  Result<Config> whole = LoadConfigFile(ExamplePath("deepseek-v4.1-flash-ep8.json"));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->model.experts, 384);
  EXPECT_EQ(whole->parallel.ranks, 8);
  EXPECT_THAT(whole->parallel.devices, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
}

TEST(ConfigExamples, WholeLayerExamplesCanTurnTheBalancerOn) {
  for (const char* name : {"glm-5.2-ep8.json", "deepseek-v4.1-flash-ep8.json"}) {
    Result<Config> config = LoadConfigFile(ExamplePath(name), {"balancer.enabled=true"});
    EXPECT_TRUE(config.ok()) << name << ": " << config.status().ToString();
  }
}

TEST(ConfigDefault, EmbeddedDefaultIsTinyCpuJson) {
  EXPECT_EQ(DefaultConfigText(), ReadFile(ExamplePath("tiny-cpu.json")));
  const Config config = DefaultConfig();
  EXPECT_EQ(config.source, "<embedded default>");
  EXPECT_EQ(config.parallel.ranks, 2);
  EXPECT_EQ(config.model.hidden, 256);
  EXPECT_EQ(config.model.intermediate, 128);
  EXPECT_EQ(config.model.experts, 16);
  EXPECT_EQ(config.model.top_k, 4);
  EXPECT_EQ(config.model.layers, 2);
  EXPECT_EQ(config.model.shared_intermediate, 128);
  EXPECT_EQ(config.model.activation_alpha, 1.0f);
  EXPECT_EQ(config.model.activation_clamp, 10.0f);
  EXPECT_EQ(config.model.weights, "synthetic:1");
  EXPECT_EQ(config.engine.backend, "cpu");
  EXPECT_EQ(config.engine.max_tokens_per_rank, 1024);
  EXPECT_EQ(config.server.listen, "127.0.0.1:50051");
  EXPECT_FALSE(config.balancer.enabled);
  EXPECT_EQ(config.max_tokens(), 2048);
}

TEST(ConfigDefaults, UnsetKeysTakeTheHeaderDefaults) {
  const Config config = MustParse(R"({"model": {"hidden": 64, "intermediate": 32, "experts": 4,
      "top_k": 2, "layers": 1, "weights": "synthetic:7"}})");
  const Config header_defaults;
  EXPECT_EQ(config.model.shared_intermediate, 0);
  EXPECT_EQ(config.model.activation_alpha, 1.0f);
  EXPECT_FALSE(config.model.activation_clamp.has_value());
  EXPECT_EQ(config.parallel.ranks, header_defaults.parallel.ranks);
  EXPECT_EQ(config.parallel.restart_backoff_ms, header_defaults.parallel.restart_backoff_ms);
  EXPECT_EQ(config.engine.max_tokens_per_rank, header_defaults.engine.max_tokens_per_rank);
  EXPECT_EQ(config.engine.dispatch_sms, header_defaults.engine.dispatch_sms);
  EXPECT_EQ(config.engine.exchange, "gcmoe");
  EXPECT_EQ(config.balancer.passes, header_defaults.balancer.passes);
  EXPECT_EQ(config.balancer.topology, "ring");
  EXPECT_EQ(config.server.listen, header_defaults.server.listen);
  EXPECT_EQ(config.server.max_queue, header_defaults.server.max_queue);
  EXPECT_EQ(config.logging.level, "info");
}

TEST(ConfigValues, AcceptsEveryFormOfTheSpecialKeys) {
  const Config config =
      MustParse(DefaultConfigText(),
                {"balancer.passes=\"auto\"", "model.activation.clamp=null", "server.listen=[::1]:0",
                 "server.coordinator=10.0.0.1:7000", "balancer.topology=torus:1x2",
                 "model.weights=/data/w.safetensors", "server.step_timeout_ms=5000",
                 "engine.exchange=nccl", "engine.dispatch_sms=0"});
  EXPECT_FALSE(config.balancer.passes.has_value());
  EXPECT_EQ(config.engine.exchange, "nccl");
  EXPECT_EQ(config.engine.dispatch_sms, 0);  // no dispatch partition
  EXPECT_FALSE(config.model.activation_clamp.has_value());
  EXPECT_EQ(config.server.listen, "[::1]:0");
  EXPECT_EQ(config.server.coordinator, "10.0.0.1:7000");
  EXPECT_EQ(config.balancer.topology, "torus:1x2");
  EXPECT_EQ(config.model.weights, "/data/w.safetensors");
  EXPECT_EQ(config.server.step_timeout_ms, 5000);
}

TEST(ConfigOverrides, ValuesParseAsJsonElseAsStrings) {
  const Config config =
      MustParse(DefaultConfigText(),
                {"parallel.ranks=4", "server.listen=0.0.0.0:5000", "balancer.passes=auto",
                 "parallel.devices=[3, 2, 1, 0]", "balancer.enabled=true", "logging.level=debug",
                 "model.activation.alpha=1.702"});
  EXPECT_EQ(config.parallel.ranks, 4);
  EXPECT_EQ(config.server.listen, "0.0.0.0:5000");
  EXPECT_FALSE(config.balancer.passes.has_value());
  EXPECT_THAT(config.parallel.devices, ElementsAre(3, 2, 1, 0));
  EXPECT_TRUE(config.balancer.enabled);
  EXPECT_EQ(config.logging.level, "debug");
  EXPECT_EQ(config.model.activation_alpha, 1.702f);
}

TEST(ConfigOverrides, LaterOverridesWinAndApplyBeforeValidation) {
  EXPECT_EQ(MustParse(DefaultConfigText(), {"parallel.ranks=4", "parallel.ranks=3"}).parallel.ranks,
            3);
  // The file alone is invalid (hidden 100); the override repairs it before the rules run.
  EXPECT_EQ(MustParse(R"({"model": {"hidden": 100, "intermediate": 32, "experts": 4, "top_k": 2,
                          "layers": 1, "weights": "synthetic:1"}})",
                      {"model.hidden=128"})
                .model.hidden,
            128);
  // And an override can break a valid file.
  Result<Config> broken = ParseConfig(DefaultConfigText(), "test", {"model.hidden=100"});
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().message(),
            "model.hidden: expected a positive multiple of 32 up to 1048576, got 100");
}

TEST(ConfigOverrides, BadOverridesAreReportedWithTheOtherProblems) {
  Result<Config> config =
      ParseConfig(DefaultConfigText(), "test",
                  {"model.hiden=3", "model.hidden.x=1", "noequals", "a..b=1", "parallel.ranks=0"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(config.status().message(),
            "model.hidden.x: cannot be set: model.hidden is 256, not an object "
            "(override \"model.hidden.x=1\")\n"
            "override \"noequals\": expected key.path=value (e.g. parallel.ranks=4)\n"
            "override \"a..b=1\": expected key.path=value with non-empty keys between the dots\n"
            "parallel.ranks: expected an integer in 1..1024, got 0\n"
            "model.hiden: unknown key (did you mean model.hidden?)");
}

TEST(ConfigValues, NegativeDispatchSmsIsRejected) {
  Result<Config> config = ParseConfig(DefaultConfigText(), "test", {"engine.dispatch_sms=-1"});
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().message(),
            "engine.dispatch_sms: expected a non-negative integer (0 = no dispatch partition), got "
            "-1");
}

// The CUDA tuning keys: defaults, values, and every rank agreeing on them (the digest).
TEST(ConfigValues, EngineCudaKeysTakeValuesAndEnterTheDigest) {
  const Config defaults = MustParse(DefaultConfigText());
  EXPECT_EQ(defaults.engine.cuda.ring_blocks, 0);
  EXPECT_EQ(defaults.engine.cuda.role1_grid, 0);
  EXPECT_EQ(defaults.engine.cuda.overlap_roles, "auto");
  EXPECT_EQ(defaults.engine.cuda.wait_timeout_ms, 5000);
  EXPECT_EQ(defaults.engine.cuda.wait_sleep_cap_ns, 4096);
  EXPECT_FALSE(defaults.engine.cuda.trace_role2);
  const Config tuned = MustParse(
      DefaultConfigText(), {"engine.cuda.ring_blocks=3", "engine.cuda.role1_grid=64",
                            "engine.cuda.overlap_roles=off", "engine.cuda.wait_timeout_ms=2000",
                            "engine.cuda.wait_sleep_cap_ns=512", "engine.cuda.trace_role2=true"});
  EXPECT_EQ(tuned.engine.cuda.ring_blocks, 3);
  EXPECT_EQ(tuned.engine.cuda.role1_grid, 64);
  EXPECT_EQ(tuned.engine.cuda.overlap_roles, "off");
  EXPECT_EQ(tuned.engine.cuda.wait_timeout_ms, 2000);
  EXPECT_EQ(tuned.engine.cuda.wait_sleep_cap_ns, 512);
  EXPECT_TRUE(tuned.engine.cuda.trace_role2);
  EXPECT_NE(tuned.Digest(), defaults.Digest());
  EXPECT_NE(MustParse(DefaultConfigText(), {"engine.cuda.wait_sleep_cap_ns=8192"}).Digest(),
            defaults.Digest());
  // `config show` prints them.
  EXPECT_NE(tuned.ToJson().find("\"overlap_roles\": \"off\""), std::string::npos) << tuned.ToJson();
}

TEST(ConfigValues, ServerDataPathKeysTakeValuesAndStayOutOfTheDigest) {
  const Config defaults = MustParse(DefaultConfigText());
  EXPECT_EQ(defaults.server.rank_io, "auto");
  EXPECT_EQ(defaults.server.batch_window_us, 0);
  EXPECT_EQ(defaults.server.max_batch_calls, 64);
  EXPECT_FALSE(defaults.server.echo);
  EXPECT_FALSE(defaults.server.allow_registered_memory);
  EXPECT_EQ(defaults.server.max_steps_in_flight, 2);
  EXPECT_EQ(defaults.server.spin_wait, "auto");
  EXPECT_EQ(defaults.server.copy_threads, 0);
  const Config set =
      MustParse(DefaultConfigText(),
                {"server.rank_io=inline", "server.batch_window_us=250", "server.max_batch_calls=8",
                 "server.echo=true", "server.allow_registered_memory=true",
                 "server.max_steps_in_flight=1", "server.spin_wait=off", "server.copy_threads=3"});
  EXPECT_EQ(set.server.rank_io, "inline");
  EXPECT_EQ(set.server.batch_window_us, 250);
  EXPECT_EQ(set.server.max_batch_calls, 8);
  EXPECT_TRUE(set.server.echo);
  EXPECT_TRUE(set.server.allow_registered_memory);
  EXPECT_EQ(set.server.max_steps_in_flight, 1);
  EXPECT_EQ(set.server.spin_wait, "off");
  EXPECT_EQ(set.server.copy_threads, 3);
  // The coordinator alone reads them: ranks with either setting may serve together.
  EXPECT_EQ(set.Digest(), defaults.Digest());
  EXPECT_NE(set.ToJson().find("\"rank_io\": \"inline\""), std::string::npos) << set.ToJson();
  EXPECT_NE(set.ToJson().find("\"spin_wait\": \"off\""), std::string::npos) << set.ToJson();
  EXPECT_NE(set.ToJson().find("\"copy_threads\": 3"), std::string::npos) << set.ToJson();
}

TEST(ConfigOverrides, CreatesAbsentSections) {
  const Config config = MustParse(DefaultConfigText(), {"logging.format=json"});
  EXPECT_EQ(config.logging.format, "json");
}

TEST(ConfigJson, CanonicalJsonFillsDefaultsAndRoundTrips) {
  const Config config = MustParse(DefaultConfigText(), {"model.activation.alpha=1.702"});
  const std::string json = config.ToJson();
  EXPECT_THAT(json, HasSubstr("\"max_queue\": 64"));
  EXPECT_THAT(json, HasSubstr("\"alpha\": 1.702,"));
  EXPECT_THAT(json, HasSubstr("\"clamp\": 10.0"));
  EXPECT_THAT(json, HasSubstr("\"passes\": 12"));
  EXPECT_THAT(json, HasSubstr("\"devices\": []"));
  // Sections in schema order.
  EXPECT_LT(json.find("\"model\""), json.find("\"parallel\""));
  EXPECT_LT(json.find("\"server\""), json.find("\"logging\""));

  const Config again = MustParse(json);
  EXPECT_EQ(again.ToJson(), json);
  EXPECT_EQ(again.Digest(), config.Digest());
  EXPECT_EQ(again.model.activation_alpha, config.model.activation_alpha);

  const Config auto_passes =
      MustParse(json, {"balancer.passes=auto", "model.activation.clamp=null"});
  EXPECT_THAT(auto_passes.ToJson(), HasSubstr("\"passes\": \"auto\""));
  EXPECT_THAT(auto_passes.ToJson(), HasSubstr("\"clamp\": null"));
  EXPECT_FALSE(MustParse(auto_passes.ToJson()).balancer.passes.has_value());
}

TEST(ConfigDigest, CoversWhatRanksMustAgreeOnOnly) {
  const std::string base = DefaultConfig().Digest();
  ASSERT_EQ(base.size(), 16u);
  EXPECT_EQ(base.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(MustParse(DefaultConfigText()).Digest(), base);

  // Model, ranks, engine and balancer: every process must agree.
  for (const char* change :
       {"model.hidden=512", "model.activation.clamp=null", "model.weights=synthetic:2",
        "parallel.ranks=4", "engine.max_tokens_per_rank=512", "balancer.passes=3"}) {
    EXPECT_NE(MustParse(DefaultConfigText(), {change}).Digest(), base) << change;
  }
  // Addresses, devices and logging may differ between the processes of one service.
  for (const char* change :
       {"server.listen=0.0.0.0:6000", "server.max_queue=8", "parallel.devices=[4, 5]",
        "logging.level=debug", "parallel.restart_ranks=false"}) {
    EXPECT_EQ(MustParse(DefaultConfigText(), {change}).Digest(), base) << change;
  }
}

TEST(ConfigLoad, MissingFileIsNotFound) {
  Result<Config> config = LoadConfigFile(ExamplePath("no-such-file.json"));
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("no-such-file.json"));
}

TEST(ConfigLoad, SyntaxErrorsNameLineAndColumn) {
  // The position is that of the last character of the offending token ("256").
  Result<Config> config = ParseConfig("{\n  \"model\": {\n    \"hidden\" 256\n  }\n}\n", "t");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              ::testing::StartsWith("line 3, column 16: invalid JSON: syntax error"));

  Result<Config> empty = ParseConfig("", "t");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), ::testing::StartsWith("line 1, column 1: invalid JSON"));

  Result<Config> trailing = ParseConfig("{\"model\": {}},", "t");
  ASSERT_FALSE(trailing.ok());
  EXPECT_THAT(trailing.status().message(),
              ::testing::StartsWith("line 1, column 14: invalid JSON"));
}

// A reader standing in for engine/hf_checkpoint.h: what "hf:/ckpt" says about its model.
CheckpointReader FakeCheckpoint(bool readable = true) {
  return [readable](const std::string& weights) -> Result<CheckpointModel> {
    if (!readable) return NotFound(weights.substr(3) + "/config.json: cannot open");
    CheckpointModel m;
    m.source = "/ckpt/config.json";
    m.hidden = 2880;
    m.intermediate = 2880;
    m.experts = 128;
    m.top_k = 4;
    m.layers = 36;
    m.activation_alpha = 1.702f;
    m.activation_clamp = 7.0f;
    m.activation_up_offset = 1.0f;
    m.moe_layer_ids = {0, 1};
    m.source_keys = {{"hidden", "hidden_size"}, {"clamp", "swiglu_limit"}};
    return m;
  };
}

const char kHfConfig[] = R"({"model": {"weights": "hf:/ckpt"}, "parallel": {"ranks": 2}})";

TEST(ConfigCheckpoint, KeysLeftOutComeFromTheCheckpoint) {
  Result<Config> config = ParseConfig(kHfConfig, "test", {}, FakeCheckpoint());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const ModelConfig& m = config->model;
  EXPECT_EQ(m.hidden, 2880);
  EXPECT_EQ(m.experts, 128);
  EXPECT_EQ(m.layers, 36);
  EXPECT_FLOAT_EQ(m.activation_alpha, 1.702f);
  ASSERT_TRUE(m.activation_clamp.has_value());
  EXPECT_FLOAT_EQ(*m.activation_clamp, 7.0f);
  EXPECT_FLOAT_EQ(m.activation_up_offset, 1.0f);
  EXPECT_THAT(m.moe_layer_ids, ElementsAre(0, 1));
  EXPECT_THAT(config->ToJson(), HasSubstr("\"up_offset\": 1"));
}

TEST(ConfigCheckpoint, KeysGivenMustAgreeAndTheErrorNamesBoth) {
  Result<Config> agree =
      ParseConfig(kHfConfig, "test", {"model.hidden=2880", "model.top_k=4"}, FakeCheckpoint());
  EXPECT_TRUE(agree.ok()) << agree.status().ToString();
  Result<Config> hidden = ParseConfig(kHfConfig, "test", {"model.hidden=2048"}, FakeCheckpoint());
  ASSERT_FALSE(hidden.ok());
  EXPECT_THAT(hidden.status().message(),
              HasSubstr("model.hidden: expected 2880 (hidden_size in /ckpt/config.json), or "
                        "leave the key out, got 2048"));
  Result<Config> clamp =
      ParseConfig(kHfConfig, "test", {"model.activation.clamp=null"}, FakeCheckpoint());
  ASSERT_FALSE(clamp.ok());
  EXPECT_THAT(clamp.status().message(),
              HasSubstr("model.activation.clamp: expected 7 (swiglu_limit in "
                        "/ckpt/config.json), or leave the key out, got null"));
}

TEST(ConfigCheckpoint, AnUnreadableCheckpointIsAProblemOfModelWeights) {
  Result<Config> config = ParseConfig(kHfConfig, "test", {}, FakeCheckpoint(false));
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("model.weights: /ckpt/config.json: cannot open"));
  // Without a reader, "hf:DIR" needs the shape keys like any other weights.
  Result<Config> no_reader = ParseConfig(kHfConfig, "test");
  ASSERT_FALSE(no_reader.ok());
  EXPECT_THAT(no_reader.status().message(), HasSubstr("model.hidden"));
}

}  // namespace
}  // namespace gcmoe::config
