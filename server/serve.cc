// `gcmoe serve`: the quick start. Runs the coordinator in this process and one rank process per
// configured rank as children, restarting a rank that dies; SIGTERM drains and stops them all.
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>

#include <spdlog/spdlog.h>

#include "common/flags.h"
#include "server/attach_secret.h"
#include "server/command_config.h"
#include "server/commands.h"
#include "server/coordinator_server.h"
#include "server/logging.h"
#include "server/rank_supervisor.h"
#include "server/signals.h"
#include "server/systemd_notify.h"

namespace gcmoe::server {

int RunServeCommand(int argc, char** argv) {
  BlockTerminationSignals();
  std::string config_path;
  std::vector<std::string> overrides;
  std::string listen;
  int ranks = 0;
  std::string address_file;
  int drain_ms = 10000;
  Flags flags("gcmoe serve",
              "Starts the service: the coordinator (public gRPC API, health, reflection) and\n"
              "one rank process per configured rank, restarted if one dies. With no --config\n"
              "it serves the embedded default: a small synthetic model on the CPU backend,\n"
              "2 ranks, on 127.0.0.1:50051. SIGTERM or Ctrl-C drains and stops.");
  flags.String("config", &config_path, "config file (default: the embedded tiny CPU model)");
  flags.Repeated("set", &overrides, "override a config key, e.g. --set engine.threads=2");
  flags.String("listen", &listen, "public API address host:port (overrides server.listen)");
  flags.Int("ranks", &ranks, "number of rank processes; 0 keeps the config's parallel.ranks");
  flags.String("address-file", &address_file,
               "write the bound API address to this file once serving (for scripts, tests);\n"
               "a second line holds the bound metrics address when server.metrics_listen is set");
  flags.Int("drain-ms", &drain_ms, "on SIGTERM, how long admitted calls may take to finish");
  if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;
  if (!listen.empty()) overrides.push_back("server.listen=" + listen);
  if (ranks > 0) overrides.push_back("parallel.ranks=" + std::to_string(ranks));

  auto config = LoadConfigOrReport("serve", config_path, overrides);
  if (!config) return 1;
  if (Status s = SetupLogging(config->logging, "serve"); !s.ok()) {
    std::fprintf(stderr, "gcmoe serve: %s\n", s.message().c_str());
    return 1;
  }
  // Without a configured attach secret, serve makes one for this run: the coordinator and the
  // ranks it spawns read it from a file only this user can open, never from a command line.
  std::unique_ptr<PrivateSecretFile> secret_file;
  if (config->server.rank_secret_file.empty()) {
    auto created = PrivateSecretFile::Create();
    if (!created.ok()) {
      spdlog::error("serve: {}", created.status().message());
      return 1;
    }
    secret_file = std::move(created).value();
    config->server.rank_secret_file = secret_file->path();
    overrides.push_back("server.rank_secret_file=" + secret_file->path());
  }
  spdlog::info("gcmoe serve: config {} (H={} I={} E={} top-{} layers={} shared={} weights={})",
               config->source, config->model.hidden, config->model.intermediate,
               config->model.experts, config->model.top_k, config->model.layers,
               config->model.shared_intermediate, config->model.weights);
  auto server = CoordinatorServer::Start(*config);
  if (!server.ok()) {
    spdlog::error("{}", server.status().message());
    return 1;
  }

  // Ranks get exactly this command's config inputs, so their digest matches the coordinator's.
  std::vector<std::vector<std::string>> rank_args;
  for (int r = 0; r < config->parallel.ranks; ++r) {
    std::vector<std::string> args = {"rank", "--rank", std::to_string(r), "--coordinator",
                                     (*server)->rank_address(), "--exit-with-coordinator"};
    if (!config_path.empty()) {
      args.push_back("--config");
      args.push_back(config_path);
    }
    for (const std::string& o : overrides) {
      args.push_back("--set");
      args.push_back(o);
    }
    rank_args.push_back(std::move(args));
  }
  RankSupervisor supervisor(SelfExecutable(), rank_args, config->parallel.restart_ranks,
                            std::chrono::milliseconds(config->parallel.restart_backoff_ms));

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool serving = false;
  TerminationSignalWatcher watcher([&](int signo) {
    spdlog::info("serve: signal {} received, shutting down", signo);
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  });
  CoordinatorServer* coordinator_server = server->get();
  WatchReloadSignal([coordinator_server] { (void)coordinator_server->Reload(); });
  // A keep-alive only while the coordinator answers: a deadlock in it stops them.
  SystemdWatchdog watchdog([coordinator_server] {
    (void)coordinator_server->coordinator().serving();
    return true;
  });
  (*server)->coordinator().AddServingCallback([&](bool now_serving) {
    std::lock_guard<std::mutex> lock(mu);
    serving = now_serving;
    cv.notify_all();
  });
  if (Status s = supervisor.StartAll(); !s.ok()) {
    spdlog::error("cannot start the ranks: {}", s.message());
    (*server)->Shutdown(std::chrono::milliseconds(0));
    return 1;
  }

  int exit_code = 0;
  bool announced = false;
  const auto startup_deadline = std::chrono::steady_clock::now() +
                                std::chrono::milliseconds(config->server.startup_timeout_ms);
  NotifySystemd("STATUS=loading the ranks");
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (serving && !announced) {
        announced = true;
        spdlog::info("serving on {} with {} rank(s), {} backend",
                     (*server)->public_address(), config->parallel.ranks,
                     config->engine.backend);
        if (!address_file.empty()) {
          // Written whole under a temporary name, then renamed: readers never see half a file.
          const std::string tmp = address_file + ".tmp";
          {
            std::ofstream out(tmp);
            out << (*server)->public_address() << "\n";
            if (!(*server)->metrics_address().empty()) {
              out << (*server)->metrics_address() << "\n";
            }
          }
          std::rename(tmp.c_str(), address_file.c_str());
        }
        // systemd's Type=notify: the unit is active once every rank is ready, not before.
        NotifySystemd("READY=1\nSTATUS=serving on " + (*server)->public_address() + " with " +
                      std::to_string(config->parallel.ranks) + " rank(s)");
      }
      if (Status fatal = supervisor.fatal(); !fatal.ok()) {
        spdlog::error("serve: {}", fatal.message());
        exit_code = 1;
        break;
      }
      if (!announced && std::chrono::steady_clock::now() >= startup_deadline) {
        spdlog::error("serve: the ranks were not ready within {} ms (server.startup_timeout_ms)",
                      config->server.startup_timeout_ms);
        exit_code = 1;
        break;
      }
    }
  }
  // A rank that exits on the coordinator's Shutdown is done, not dead: restarting it would only
  // have it refused by a coordinator that is going away.
  supervisor.StopRestarts();
  NotifySystemd("STOPPING=1\nSTATUS=draining");
  (*server)->Shutdown(std::chrono::milliseconds(exit_code == 0 ? drain_ms : 0));
  supervisor.StopAll(std::chrono::milliseconds(5000));
  if (!address_file.empty()) unlink(address_file.c_str());
  return exit_code;
}

}  // namespace gcmoe::server
