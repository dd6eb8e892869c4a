// `gcmoe coordinator`: the coordinator alone; rank processes are started elsewhere (systemd,
// Kubernetes) and attach to server.rank_listen.
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>

#include <spdlog/spdlog.h>

#include "common/flags.h"
#include "server/command_config.h"
#include "server/commands.h"
#include "server/coordinator_server.h"
#include "server/logging.h"
#include "server/signals.h"

namespace gcmoe::server {

int RunCoordinatorCommand(int argc, char** argv) {
  BlockTerminationSignals();
  std::string config_path;
  std::vector<std::string> overrides;
  std::string listen;
  std::string rank_listen;
  int drain_ms = 10000;
  std::string address_file;
  Flags flags("gcmoe coordinator",
              "Runs the coordinator: the public gRPC API and the endpoint rank processes attach\n"
              "to. Start one `gcmoe rank --rank N` per configured rank (systemd, Kubernetes).\n"
              "SIGTERM drains admitted calls, tells the ranks to exit and stops.");
  flags.String("config", &config_path, "config file (default: the embedded tiny CPU model)");
  flags.Repeated("set", &overrides, "override a config key, e.g. --set parallel.ranks=4");
  flags.String("listen", &listen, "public API address host:port (overrides server.listen)");
  flags.String("rank-listen", &rank_listen,
               "where ranks attach, host:port (overrides server.rank_listen)");
  flags.Int("drain-ms", &drain_ms, "on SIGTERM, how long admitted calls may take to finish");
  flags.String("address-file", &address_file,
               "once listening, write the bound API address and rank address to this file, "
               "one per line");
  if (int rc = flags.ParseOrExit(argc, argv); rc >= 0) return rc;
  if (!listen.empty()) overrides.push_back("server.listen=" + listen);
  if (!rank_listen.empty()) overrides.push_back("server.rank_listen=" + rank_listen);

  auto config = LoadConfigOrReport("coordinator", config_path, overrides);
  if (!config) return 1;
  if (Status s = SetupLogging(config->logging, "coordinator"); !s.ok()) {
    std::fprintf(stderr, "gcmoe coordinator: %s\n", s.message().c_str());
    return 1;
  }
  auto server = CoordinatorServer::Start(*config);
  if (!server.ok()) {
    spdlog::error("{}", server.status().message());
    return 1;
  }
  if (!address_file.empty()) {
    // Written whole under a temporary name, then renamed: a reader never sees half a file.
    const std::string tmp = address_file + ".tmp";
    std::ofstream(tmp) << (*server)->public_address() << "\n" << (*server)->rank_address() << "\n";
    std::rename(tmp.c_str(), address_file.c_str());
  }
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  TerminationSignalWatcher watcher([&](int signo) {
    spdlog::info("coordinator: signal {} received, shutting down", signo);
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stop; });
  }
  (*server)->Shutdown(std::chrono::milliseconds(drain_ms));
  if (!address_file.empty()) std::remove(address_file.c_str());
  return 0;
}

}  // namespace gcmoe::server
