// `gcmoe rank`: one rank process. It loads its experts, attaches to the coordinator and serves
// steps; it survives a coordinator restart by re-attaching (unless --exit-with-coordinator).
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "common/flags.h"
#include "server/command_config.h"
#include "server/commands.h"
#include "server/logging.h"
#include "server/rank_exit_codes.h"
#include "server/rank_process.h"
#include "server/signals.h"
#include "server/systemd_notify.h"

namespace gcmoe::server {

int RunRankCommand(int argc, char** argv) {
  BlockTerminationSignals();
  std::string config_path;
  std::vector<std::string> overrides;
  int rank = -1;
  std::string coordinator;
  bool exit_with_coordinator = false;
  Flags flags("gcmoe rank",
              "Runs one rank process: loads the experts this rank holds, attaches to the\n"
              "coordinator and computes its share of every step. SIGTERM stops it.");
  flags.Int("rank", &rank, "this process's rank, 0 .. parallel.ranks-1 (required)");
  flags.String("config", &config_path, "config file (default: the embedded tiny CPU model)");
  flags.Repeated("set", &overrides, "override a config key, e.g. --set engine.threads=4");
  flags.String("coordinator", &coordinator,
               "coordinator address host:port (default: server.coordinator, else "
               "server.rank_listen)");
  flags.Bool("exit-with-coordinator", &exit_with_coordinator,
             "exit when the coordinator goes away (how `gcmoe serve` runs its ranks)");
  if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;
  if (exit_with_coordinator) prctl(PR_SET_PDEATHSIG, SIGTERM);

  auto config = LoadConfigOrReport("rank", config_path, overrides);
  if (!config) return kExitStartFailed;
  if (rank < 0 || rank >= config->parallel.ranks) {
    std::fprintf(stderr, "gcmoe rank: --rank %d, expected 0..%d (parallel.ranks = %d)\n", rank,
                 config->parallel.ranks - 1, config->parallel.ranks);
    return kExitUsage;
  }
  if (Status s = SetupLogging(config->logging, "rank " + std::to_string(rank)); !s.ok()) {
    std::fprintf(stderr, "gcmoe rank: %s\n", s.message().c_str());
    return kExitStartFailed;
  }
  if (coordinator.empty()) coordinator = config->server.coordinator;
  if (coordinator.empty()) coordinator = config->server.rank_listen;
  if (coordinator.empty() || coordinator.ends_with(":0")) {
    spdlog::error(
        "no coordinator address: pass --coordinator host:port or set "
        "server.coordinator");
    return kExitUsage;
  }

  RankProcessOptions options;
  options.config = *config;
  options.rank = rank;
  options.coordinator = coordinator;
  options.exit_with_coordinator = exit_with_coordinator;
  auto process = RankProcess::Create(options);
  if (!process.ok()) {
    spdlog::error("rank {} cannot start: {}", rank, process.status().ToString());
    return kExitStartFailed;
  }
  RankProcess* p = process->get();
  // Declared after the process, so it is stopped and joined before the process is destroyed.
  TerminationSignalWatcher watcher([p, rank](int signo) {
    spdlog::info("rank {}: signal {} received, stopping", rank, signo);
    p->Stop();
  });
  // The rank's main loop runs in Run(); a keep-alive thread shows the process is scheduled.
  SystemdWatchdog watchdog([] { return true; });
  return p->Run();
}

}  // namespace gcmoe::server
