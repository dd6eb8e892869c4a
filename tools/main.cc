// gcmoe: MoE-layer inference service. One binary, one subcommand per role or tool.
#include <cstdio>
#include <cstring>
#include <string>

#include <openssl/crypto.h>

#include "client/command.h"
#include "server/commands.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"serve", gcmoe::server::RunServeCommand,
     "run the coordinator and spawn its local rank processes (the quick start)"},
    {"coordinator", gcmoe::server::RunCoordinatorCommand,
     "run the coordinator only; ranks attach to it (systemd, Kubernetes)"},
    {"rank", gcmoe::server::RunRankCommand, "run one rank process that attaches to a coordinator"},
    {"client", gcmoe::client::RunClientCommand,
     "call a running service: forward | info | stats | health"},
    {"config", gcmoe::tools::RunConfigCommand,
     "config files: validate FILE | show | default"},
    {"balance", gcmoe::tools::RunBalanceCommand,
     "balancer tools: eplb (EPLB-compatible placement) | replay (routing traces)"},
    {"bench", gcmoe::tools::RunBenchCommand,
     "benchmarks: layer (GPU layer latency and floor) | ep (a layer over several GPUs)"},
    {"weights", gcmoe::tools::RunWeightsCommand,
     "weight files: export (synthetic to safetensors) | check FILE"},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "usage: gcmoe COMMAND [flags]   (gcmoe COMMAND --help for its flags)\n\n"
               "gcmoe serves the Mixture-of-Experts layers of a language model over gRPC.\n\n"
               "commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
}

}  // namespace

int main(int argc, char** argv) {
  // gRPC's threads outlive the objects that started them: a TLS handshake a rank began before
  // SIGTERM can still be running while the process exits. OpenSSL's exit handler would free
  // its state under that thread (a crash at exit), so OpenSSL keeps it until the process ends.
  // First, before anything initialises OpenSSL: only the first initialisation decides this.
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0) {
    std::printf("gcmoe %s\n", GCMOE_VERSION);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "gcmoe: unknown command \"%s\"\n\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
