// `gcmoe config validate | show | default`, run as the binary runs them, output captured.
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tools/commands.h"

namespace gcmoe::tools {
namespace {

using ::testing::HasSubstr;

struct CommandResult {
  int exit_code;
  std::string out;
  std::string err;
};

CommandResult RunConfig(std::vector<std::string> args) {
  args.insert(args.begin(), "config");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const int rc = RunConfigCommand(static_cast<int>(args.size()), argv.data());
  std::string out = ::testing::internal::GetCapturedStdout();
  std::string err = ::testing::internal::GetCapturedStderr();
  return {rc, out, err};
}

std::string Example(const std::string& name) {
  return std::string(GCMOE_CONFIG_EXAMPLES_DIR) + "/" + name;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigCommand, ValidatePrintsASummaryForAValidFile) {
  const std::string path = Example("tiny-cpu.json");
  const CommandResult r = RunConfig({"validate", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, path +
                       ": ok (2 ranks, cpu backend, H=256 I=128 E=16 top-4, 2 layers, "
                       "shared expert I_s=128, max 2048 tokens, balancer off, weights "
                       "synthetic:1, digest " +
                       config::DefaultConfig().Digest() + ")\n");
  EXPECT_EQ(r.err, "");
}

TEST(ConfigCommand, ValidateReportsEveryProblemAndFails) {
  const std::string path = WriteTemp("two_problems.json", R"({
    "model": {"hidden": 100, "intermediate": 128, "experts": 16, "top_k": 4, "layers": 1,
              "weights": "synthetic:1"},
    "server": {"listen": "localhost"}
  })");
  const CommandResult r = RunConfig({"validate", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, path +
                       ": invalid (2 problems)\n"
                       "  model.hidden: expected a positive multiple of 32 up to 1048576, got 100\n"
                       "  server.listen: expected host:port, got \"localhost\"\n");
}

TEST(ConfigCommand, ValidateAppliesOverridesAndChecksEveryFile) {
  const std::string good = Example("tiny-cpu.json");
  const std::string balanced = Example("tiny-cpu-balanced.json");
  const CommandResult r =
      RunConfig({"validate", good, balanced, "--set", "parallel.ranks=3", "--set=model.top_k=17"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err,
              HasSubstr(good + ": invalid (1 problem)\n"
                               "  model.top_k: expected at most model.experts (16), got 17\n"));
  EXPECT_THAT(r.err, HasSubstr(balanced + ": invalid (1 problem)\n"));

  const CommandResult ok = RunConfig({"validate", balanced, "--set", "parallel.ranks=3"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr(": ok (3 ranks, cpu backend"));
  EXPECT_THAT(ok.out, HasSubstr("balancer on (ring)"));
}

TEST(ConfigCommand, ValidateSplitRefusesAnyPortForTheRankAttachAndNoSecret) {
  // The examples serve with `gcmoe serve`, whose ranks learn the bound port and the attach
  // secret from it; split units start ranks apart, and they only have the config.
  const std::string path = Example("tiny-cpu.json");
  const CommandResult r = RunConfig({"validate", "--split", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, path +
                       ": invalid (2 problems)\n"
                       "  server.rank_listen: expected a fixed port in split mode (ranks started "
                       "apart read it from the config to attach), e.g. \"127.0.0.1:50052\", "
                       "got \"127.0.0.1:0\" (port 0: any free port)\n"
                       "  server.rank_secret_file: expected the attach secret's file in split "
                       "mode (the coordinator and every rank read it; only `gcmoe serve` makes "
                       "one of its own), e.g. \"/etc/gcmoe/rank.secret\", got \"\"\n");
  EXPECT_EQ(RunConfig({"validate", path}).exit_code, 0);

  const std::string secret = "server.rank_secret_file=/etc/gcmoe/rank.secret";
  const CommandResult wildcard = RunConfig({"validate", "--split", path, "--set",
                                            "server.rank_listen=0.0.0.0:50052", "--set", secret});
  EXPECT_EQ(wildcard.exit_code, 1);
  EXPECT_THAT(wildcard.err, HasSubstr("server.coordinator: expected the host:port ranks dial "
                                      "in split mode when server.rank_listen is a wildcard "
                                      "address (0.0.0.0:50052), got \"\""));
  const CommandResult fixed = RunConfig({"validate", "--split", path, "--set",
                                         "server.rank_listen=127.0.0.1:50052", "--set", secret});
  EXPECT_EQ(fixed.exit_code, 0) << fixed.err;
}

TEST(ConfigCommand, ValidateNamesAnUnreadableFile) {
  const CommandResult r = RunConfig({"validate", Example("missing.json")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot read config file"));
  EXPECT_THAT(r.err, HasSubstr("missing.json"));
}

TEST(ConfigCommand, ValidateWithoutAFileIsAUsageError) {
  const CommandResult r = RunConfig({"validate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("expected at least one FILE"));
}

TEST(ConfigCommand, ShowPrintsCanonicalJsonWithOverrides) {
  const CommandResult r = RunConfig({"show", "--set", "parallel.ranks=4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json shown = nlohmann::json::parse(r.out);
  EXPECT_EQ(shown["parallel"]["ranks"], 4);
  EXPECT_EQ(shown["server"]["max_queue"], 64);  // a default the file does not set
  Result<config::Config> expected =
      config::ParseConfig(config::DefaultConfigText(), "x", {"parallel.ranks=4"});
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(r.out, expected->ToJson() + "\n");
}

TEST(ConfigCommand, ShowReadsAFileAndReportsProblems) {
  const CommandResult file = RunConfig({"show", "--config", Example("glm-5.2-ep8-rank.json")});
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_EQ(nlohmann::json::parse(file.out)["model"]["hidden"], 6144);

  const CommandResult bad = RunConfig({"show", "--set", "engine.backend=tpu"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "");
  EXPECT_EQ(bad.err,
            "<embedded default>: invalid (1 problem)\n"
            "  engine.backend: expected \"cpu\" or \"cuda\", got \"tpu\"\n");
}

TEST(ConfigCommand, DefaultPrintsTheEmbeddedText) {
  const CommandResult r = RunConfig({"default"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, config::DefaultConfigText());
}

TEST(ConfigCommand, HelpAndUnknownCommands) {
  const CommandResult group = RunConfig({"--help"});
  EXPECT_EQ(group.exit_code, 0);
  EXPECT_THAT(group.out, HasSubstr("validate FILE..."));
  for (const char* command : {"validate", "show", "default"}) {
    const CommandResult help = RunConfig({command, "--help"});
    EXPECT_EQ(help.exit_code, 0) << command;
    EXPECT_THAT(help.out, HasSubstr(std::string("usage: gcmoe config ") + command)) << command;
  }
  EXPECT_EQ(RunConfig({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(RunConfig({"show", "--no-such-flag"}).exit_code, 2);
  EXPECT_EQ(RunConfig({}).exit_code, 2);
}

}  // namespace
}  // namespace gcmoe::tools
