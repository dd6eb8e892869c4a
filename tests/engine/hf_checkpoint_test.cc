// The Hugging Face checkpoint reader (engine/hf_checkpoint.h) on config.json and index texts of
// the four families, as their published configs spell the keys, and on the files of a
// checkpoint directory. Refusals name the file and the key, and sizes beyond the reader's
// bounds are refused before anything is allocated for them.
#include "engine/hf_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace gcmoe::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kDir[] = "ckpt";

// config.json of each family, without the closing brace: a test appends keys.
const std::string kGptOss =
    R"({"model_type": "gpt_oss", "hidden_size": 160, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_local_experts": 8, "num_experts_per_tok": 4,
        "experts_per_token": 4, "head_dim": 64)";
const std::string kQwen =
    R"({"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 192,
        "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_experts": 8,
        "num_experts_per_tok": 2, "mlp_only_layers": [1])";
const std::string kMixtral =
    R"({"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2)";
const std::string kDeepSeek =
    R"({"model_type": "deepseek_v3", "hidden_size": 192, "intermediate_size": 256,
        "moe_intermediate_size": 64, "num_hidden_layers": 3, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1)";

Result<HfCheckpoint> Parse(const std::string& config,
                           std::optional<std::string> index = std::nullopt) {
  return ParseHfCheckpoint(kDir, config, index);
}

TEST(HfCheckpointTest, GptOssShapeAndActivation) {
  auto c = Parse(kGptOss + R"(, "swiglu_limit": 7.0})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c.value().family, HfFamily::kGptOss);
  EXPECT_EQ(c.value().hidden, 160);
  EXPECT_EQ(c.value().intermediate, 96);
  EXPECT_EQ(c.value().experts, 8);
  EXPECT_EQ(c.value().top_k, 4);
  EXPECT_THAT(c.value().moe_layer_ids, ElementsAre(0, 1));
  EXPECT_EQ(c.value().activation_clamp, 7.0f);
  EXPECT_EQ(c.value().activation_alpha, 1.702f);
  EXPECT_EQ(c.value().activation_up_offset, 1.0f);
  // [E, 2I, H/32, 16] MXFP4 blocks of the fused gate_up projection.
  const auto tensors = c.value().LayerTensors(1);
  ASSERT_EQ(tensors.size(), 6u);
  EXPECT_EQ(tensors[0].name, "model.layers.1.mlp.experts.gate_up_proj_blocks");
  EXPECT_THAT(tensors[0].shape, ElementsAre(8, 192, 5, 16));
}

TEST(HfCheckpointTest, QwenSkipsDenseLayers) {
  auto c = Parse(kQwen + "}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT(c.value().moe_layer_ids, ElementsAre(0, 2));
  EXPECT_EQ(c.value().intermediate, 64);  // moe_intermediate_size, not intermediate_size
  EXPECT_EQ(c.value().source_keys.at("intermediate"), "moe_intermediate_size");
  // Every second layer, from the second: (l + 1) % step == 0.
  auto stepped = Parse(R"({"model_type": "qwen3_moe", "hidden_size": 128,
      "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_experts": 8,
      "num_experts_per_tok": 2, "decoder_sparse_step": 2})");
  ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
  EXPECT_THAT(stepped.value().moe_layer_ids, ElementsAre(1, 3));
}

TEST(HfCheckpointTest, DeepSeekSharedExpertAndFp8Blocks) {
  auto c = Parse(kDeepSeek + R"(, "n_shared_experts": 1, "quantization_config":
      {"quant_method": "fp8", "weight_block_size": [128, 128]}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT(c.value().moe_layer_ids, ElementsAre(1, 2));
  EXPECT_EQ(c.value().shared_intermediate, 64);
  EXPECT_TRUE(c.value().fp8_blocks);
  // 8 routed experts and the shared one, 3 matrices each, each with its block scales.
  const auto tensors = c.value().LayerTensors(0);
  ASSERT_EQ(tensors.size(), 9u * 3 * 2);
  EXPECT_EQ(tensors[1].name, "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv");
  EXPECT_THAT(tensors[1].shape, ElementsAre(1, 2));  // [64, 192] in 128x128 blocks
  EXPECT_EQ(tensors.back().name, "model.layers.1.mlp.shared_experts.down_proj.weight_scale_inv");
}

TEST(HfCheckpointTest, MixtralIndexMapsTensorsToShards) {
  const std::string name = "model.layers.1.block_sparse_moe.experts.3.w2.weight";
  auto c = Parse(kMixtral + "}", R"({"metadata": {"total_size": 1}, "weight_map": {")" + name +
                                     R"(": "model-00002-of-00002.safetensors",
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c.value().ShardOf(name), "model-00002-of-00002.safetensors");
  EXPECT_EQ(c.value().ShardOf("model.layers.0.block_sparse_moe.experts.0.w1.weight"), "");
  EXPECT_THAT(c.value().ShardFiles(),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  EXPECT_EQ(c.value().ExpertTensor(1, 3, "down"), name);
}

struct Refusal {
  std::string config;
  std::string message;  // what follows "ckpt/config.json: "
};

// Each config fails one check.
TEST(HfCheckpointTest, RefusalsNameTheFileAndTheKey) {
  const Refusal cases[] = {
      {R"({"model_type": "llama"})", "model_type \"llama\" is not served"},
      {kMixtral + R"(, "hidden_size": 100})", "hidden_size is 100, gcmoe serves multiples of 32"},
      {kMixtral + R"(, "num_experts_per_tok": 5})", "num_experts_per_tok 5 exceeds the 4 experts"},
      {kQwen + R"(, "num_hidden_layers": "3"})", "num_hidden_layers is \"3\", expected an integer"},
      {kQwen + R"(, "mlp_only_layers": [0, 1, 2]})", "no layer of the model has experts"},
      {kGptOss + R"(, "swiglu_limit": -1})", "swiglu_limit is -1, expected a positive number"},
      {kGptOss + "}", "swiglu_limit is missing"},
      {kDeepSeek + R"(, "first_k_dense_replace": 3})", "no layer of the model has experts"},
      {kDeepSeek + R"(, "quantization_config": {"quant_method": "awq"}})",
       "quantization_config.quant_method is \"awq\", not served"},
      {kDeepSeek + R"(, "quantization_config": {"quant_method": "fp8",
           "weight_block_size": [64, 64]}})",
       "quantization_config.weight_block_size is [64,64], expected [128, 128]"},
  };
  for (const Refusal& r : cases) {
    auto c = Parse(r.config);
    ASSERT_FALSE(c.ok()) << r.config;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), StartsWith("ckpt/config.json: " + r.message));
  }
}

// A quant_method of another JSON type is an error, not nlohmann's type_error thrown out of the
// reader.
TEST(HfCheckpointTest, QuantMethodOfAnotherTypeIsAnError) {
  for (const char* method : {"1", "null", "[\"fp8\"]", "{}"}) {
    auto c = Parse(kDeepSeek + R"(, "quantization_config": {"quant_method": )" + method + "}}");
    ASSERT_FALSE(c.ok()) << method;
    EXPECT_THAT(c.status().message(),
                StartsWith("ckpt/config.json: quantization_config.quant_method is "));
  }
}

// The reader lists every MoE layer and LayerTensors every expert's tensors, and I_s is
// n_shared_experts x moe_intermediate_size in an int: each size has a bound, refused by key.
TEST(HfCheckpointTest, SizesBeyondTheBoundsAreRefusedByKey) {
  const Refusal cases[] = {
      {kMixtral + R"(, "num_hidden_layers": 2147483647})",
       "num_hidden_layers is 2147483647, expected an integer in 1..65536"},
      {kDeepSeek + R"(, "n_shared_experts": 2147483647})",
       "n_shared_experts is 2147483647, expected an integer in 0..16384"},  // 2^20 / I = 64
      {kMixtral + R"(, "num_local_experts": 65537})",
       "num_local_experts is 65537, expected an integer in 1..65536"},
      {kMixtral + R"(, "hidden_size": 1073741824})",
       "hidden_size is 1073741824, expected an integer in 1..1048576"},
      {kQwen + R"(, "moe_intermediate_size": 1048608})",
       "moe_intermediate_size is 1048608, expected an integer in 1..1048576"},
  };
  for (const Refusal& r : cases) {
    auto c = Parse(r.config);
    ASSERT_FALSE(c.ok()) << r.config;
    EXPECT_THAT(c.status().message(), StartsWith("ckpt/config.json: " + r.message));
  }
  // The bounds themselves are served.
  auto widest = Parse(kMixtral + R"(, "num_local_experts": 65536, "hidden_size": 1048576,
      "intermediate_size": 1048576, "num_hidden_layers": 65536})");
  ASSERT_TRUE(widest.ok()) << widest.status().ToString();
  EXPECT_EQ(widest.value().moe_layer_ids.size(), 65536u);
  EXPECT_EQ(widest.value().moe_layer_ids.back(), 65535);
  auto shared = Parse(kDeepSeek + R"(, "n_shared_experts": 16384})");
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared.value().shared_intermediate, 1 << 20);
}

// The clamp is served as a float: a limit that rounds to 0 (1e-50) or does not convert (1e300,
// undefined in C++) is refused, not kept as a clamp of 0 or infinity.
TEST(HfCheckpointTest, SwigluLimitMustBeAPositiveFloat) {
  for (const char* limit : {"1e-50", "1e300", "0", "\"7\""}) {
    auto c = Parse(kGptOss + R"(, "swiglu_limit": )" + limit + "}");
    ASSERT_FALSE(c.ok()) << limit;
    EXPECT_THAT(c.status().message(), StartsWith("ckpt/config.json: swiglu_limit is "));
  }
  auto smallest = Parse(kGptOss + R"(, "swiglu_limit": 1e-40})");  // a float subnormal
  ASSERT_TRUE(smallest.ok()) << smallest.status().ToString();
  EXPECT_GT(*smallest.value().activation_clamp, 0.0f);
}

// A layer index beyond int is refused, not truncated (4294967297 would make model layer 1
// dense).
TEST(HfCheckpointTest, LayerIndicesBeyondIntAreRefused) {
  for (const char* layers : {"[4294967297]", "[-1]", "[1.0]"}) {
    auto c = Parse(kQwen + R"(, "mlp_only_layers": )" + layers + "}");
    ASSERT_FALSE(c.ok()) << layers;
    EXPECT_THAT(c.status().message(), StartsWith("ckpt/config.json: mlp_only_layers holds "));
  }
}

TEST(HfCheckpointTest, IndexRefusalsNameTheIndex) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"metadata": {}})", "no weight_map object"},
      {R"({"weight_map": {}})", "weight_map is empty"},
      {R"({"weight_map": {"a": "../x.safetensors"}})",
       "weight_map[\"a\"] is not a file name in the checkpoint directory"},
      {R"({"weight_map": {"a": 1}})", "weight_map[\"a\"] is not a file name"},
      {R"({"weight_map": )", "not valid JSON"},
  };
  for (const auto& [index, message] : cases) {
    auto c = Parse(kMixtral + "}", index);
    ASSERT_FALSE(c.ok()) << index;
    EXPECT_THAT(c.status().message(), StartsWith("ckpt/model.safetensors.index.json: " + message));
  }
}

class HfCheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "gcmoe_hf_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string dir_;
};

TEST_F(HfCheckpointDirTest, ReadsConfigAndIndexFromTheDirectory) {
  auto missing = ReadHfCheckpoint(dir_);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), StartsWith(dir_ + "/config.json: cannot open"));

  Write("config.json", kMixtral + "}");
  auto unsharded = ReadHfCheckpoint(dir_);
  ASSERT_TRUE(unsharded.ok()) << unsharded.status().ToString();
  EXPECT_FALSE(unsharded.value().sharded());
  EXPECT_EQ(unsharded.value().ShardOf("anything"), "model.safetensors");

  Write("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors"}})");
  auto sharded = ReadHfCheckpoint(dir_);
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  EXPECT_EQ(sharded.value().dir, dir_);
  EXPECT_EQ(sharded.value().ShardOf("a"), "s1.safetensors");

  Write("model.safetensors.index.json", "[]");
  auto bad = ReadHfCheckpoint(dir_);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr(dir_ + "/model.safetensors.index.json: not a JSON object"));
}

}  // namespace
}  // namespace gcmoe::engine
