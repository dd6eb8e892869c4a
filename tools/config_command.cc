// `gcmoe config validate | show | default`: check config files, print the effective config with
// every default filled in, print the embedded default.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/flags.h"
#include "config/config.h"
#include "server/command_config.h"
#include "tools/commands.h"

namespace gcmoe::tools {
namespace {

constexpr const char* kSetHelp =
    "override a key: key.path=value, the value read as JSON, else as a string";

void PrintGroupUsage(FILE* out) {
  std::fputs(
      "usage: gcmoe config COMMAND [flags]   (gcmoe config COMMAND --help for its flags)\n"
      "\n"
      "Config files: check them, print them with every default filled in, print the default.\n"
      "\n"
      "commands:\n"
      "  validate FILE...  check config files: \"FILE: ok (...)\" or every problem (exit 1)\n"
      "  show              print the effective config (--config FILE or the embedded default,\n"
      "                    then --set overrides) as canonical JSON with every default\n"
      "  default           print the embedded default config (config/examples/tiny-cpu.json)\n",
      out);
}

// "2 ranks, cpu backend, H=256 I=128 E=16 top-4, 2 layers, shared expert I_s=128, ..."
std::string Summary(const config::Config& c) {
  const config::ModelConfig& m = c.model;
  std::string s =
      std::to_string(c.parallel.ranks) + (c.parallel.ranks == 1 ? " rank, " : " ranks, ");
  s += c.engine.backend + " backend, H=" + std::to_string(m.hidden) +
       " I=" + std::to_string(m.intermediate) + " E=" + std::to_string(m.experts) + " top-" +
       std::to_string(m.top_k) + ", " + std::to_string(m.layers) +
       (m.layers == 1 ? " layer, " : " layers, ");
  s += m.shared_intermediate > 0 ? "shared expert I_s=" + std::to_string(m.shared_intermediate)
                                 : std::string("no shared expert");
  s += ", max " + std::to_string(c.max_tokens()) + " tokens, balancer ";
  s += c.balancer.enabled ? "on (" + c.balancer.topology + ")" : std::string("off");
  s += ", weights " + m.weights + ", digest " + c.Digest();
  return s;
}

// Prints "NAME: invalid (N problems)" and one indented line per problem.
void PrintProblems(const std::string& name, const Status& status) {
  std::vector<std::string> lines;
  size_t start = 0;
  const std::string& message = status.message();
  while (start <= message.size()) {
    const size_t end = message.find('\n', start);
    lines.push_back(message.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (status.code() != StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), status.message().c_str());
    return;
  }
  std::fprintf(stderr, "%s: invalid (%zu problem%s)\n", name.c_str(), lines.size(),
               lines.size() == 1 ? "" : "s");
  for (const std::string& line : lines) std::fprintf(stderr, "  %s\n", line.c_str());
}

int RunValidate(int argc, char** argv) {
  std::vector<std::string> overrides;
  bool split = false;
  Flags flags("gcmoe config validate",
              "Checks config files: prints \"FILE: ok (summary)\" for a valid one and every\n"
              "problem of an invalid one, each with its JSON path and the value expected.\n"
              "Exit status 0 when every file is valid, 1 otherwise.");
  flags.Repeated("set", &overrides, kSetHelp);
  flags.Bool("split", &split,
             "also check the config for split mode (`gcmoe coordinator` and `gcmoe rank` as\n"
             "separate units): ranks need a fixed server.rank_listen port to attach to, and\n"
             "the coordinator and the ranks a server.rank_secret_file");
  flags.Positional("FILE...", "config files to check");
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  if (flags.positional().empty()) {
    std::fprintf(stderr, "gcmoe config validate: expected at least one FILE\n\n%s",
                 flags.Usage().c_str());
    return 2;
  }
  int exit_code = 0;
  for (const std::string& path : flags.positional()) {
    Result<config::Config> config =
        config::LoadConfigFile(path, overrides, server::HfCheckpointReader());
    if (config.ok() && split) {
      if (Status s = config::CheckSplitMode(*config); !s.ok()) config = s;
    }
    if (config.ok()) {
      std::printf("%s: ok (%s)\n", path.c_str(), Summary(*config).c_str());
    } else {
      PrintProblems(path, config.status());
      exit_code = 1;
    }
  }
  return exit_code;
}

int RunShow(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  Flags flags("gcmoe config show",
              "Prints the effective config as canonical JSON with every default filled in: the\n"
              "file given with --config (else the embedded default), then the --set overrides.");
  flags.String("config", &path, "config file (default: the embedded default)");
  flags.Repeated("set", &overrides, kSetHelp);
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "gcmoe config show: unexpected argument \"%s\" (use --config FILE)\n",
                 flags.positional().front().c_str());
    return 2;
  }
  Result<config::Config> config =
      path.empty() ? config::ParseConfig(config::DefaultConfigText(), "<embedded default>",
                                         overrides, server::HfCheckpointReader())
                   : config::LoadConfigFile(path, overrides, server::HfCheckpointReader());
  if (!config.ok()) {
    PrintProblems(path.empty() ? "<embedded default>" : path, config.status());
    return 1;
  }
  std::printf("%s\n", config->ToJson().c_str());
  return 0;
}

int RunDefault(int argc, char** argv) {
  Flags flags("gcmoe config default",
              "Prints the embedded default config, the text of config/examples/tiny-cpu.json\n"
              "as compiled into this binary: a starting point for your own file.");
  if (int rc = flags.ParseOrExit(argc, argv, 2); rc >= 0) return rc;
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "gcmoe config default: takes no arguments\n");
    return 2;
  }
  std::fputs(config::DefaultConfigText().c_str(), stdout);
  return 0;
}

}  // namespace

int RunConfigCommand(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintGroupUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "validate") return RunValidate(argc, argv);
  if (command == "show") return RunShow(argc, argv);
  if (command == "default") return RunDefault(argc, argv);
  std::fprintf(stderr, "gcmoe config: unknown command \"%s\"\n\n", command.c_str());
  PrintGroupUsage(stderr);
  return 2;
}

}  // namespace gcmoe::tools
