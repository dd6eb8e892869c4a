// Rules that relate keys to each other. Each names the key it blames and states the rule.
#include <string>

#include "config/schema.h"

namespace gcmoe::config::internal {
namespace {

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

// True when none of the paths failed its own per-key check.
bool AllValid(const Problems& problems, std::initializer_list<const char*> paths) {
  for (const char* path : paths) {
    if (problems.Failed(path)) return false;
  }
  return true;
}

void CheckModelAndParallel(const Config& c, Problems* p) {
  const ModelConfig& m = c.model;
  if (AllValid(*p, {"model.top_k", "model.experts"}) && m.top_k > m.experts) {
    p->Expected("model.top_k", "at most model.experts (" + std::to_string(m.experts) + ")",
                std::to_string(m.top_k));
  }
  // Every rank hosts at least one expert (expert parallelism).
  if (AllValid(*p, {"model.experts", "parallel.ranks"}) && m.experts < c.parallel.ranks) {
    p->Expected("model.experts",
                "at least parallel.ranks (" + std::to_string(c.parallel.ranks) + ")",
                std::to_string(m.experts));
  }
  if (AllValid(*p, {"parallel.devices", "parallel.ranks"}) && !c.parallel.devices.empty() &&
      static_cast<int>(c.parallel.devices.size()) != c.parallel.ranks) {
    p->Expected(
        "parallel.devices",
        "one GPU index per rank (parallel.ranks = " + std::to_string(c.parallel.ranks) + ")",
        std::to_string(c.parallel.devices.size()) + " entries");
  }
}

void CheckBalancer(const Config& c, Problems* p) {
  const BalancerConfig& b = c.balancer;
  // The placement keys must agree whether or not the balancer is on: a "file" placement with
  // no file is a broken config even while it is switched off.
  if (AllValid(*p, {"balancer.placement", "balancer.placement_file"}) && b.placement == "file" &&
      b.placement_file.empty()) {
    p->Expected("balancer.placement_file", "a file path when balancer.placement is \"file\"",
                Quote(b.placement_file));
  }
  if (AllValid(*p, {"balancer.placement", "balancer.refit_steps"}) && b.placement == "observed" &&
      b.refit_steps <= 0) {
    p->Expected("balancer.refit_steps",
                "a positive integer when balancer.placement is \"observed\"",
                std::to_string(b.refit_steps));
  }

  // The topology and the replica count only bind when the balancer runs: the single-rank GPU
  // configs keep the default "ring" with the balancer off.
  if (!AllValid(*p, {"balancer.enabled", "parallel.ranks"}) || !b.enabled) return;
  const int ranks = c.parallel.ranks;
  if (ranks < 2) {
    p->Expected("balancer.enabled",
                "false with parallel.ranks = 1 (one rank has nothing to "
                "balance)",
                "true");
    return;
  }
  if (AllValid(*p, {"balancer.topology"})) {
    int a = 0;
    int bdim = 0;
    if (b.topology == "cube" && ranks != 8) {
      p->Expected("balancer.topology",
                  "\"ring\" or \"torus:AxB\" for parallel.ranks = " + std::to_string(ranks) +
                      " (\"cube\" needs exactly 8)",
                  Quote(b.topology));
    } else if (b.topology.rfind("torus:", 0) == 0 && ParseTopology(b.topology, &a, &bdim) &&
               a * bdim != ranks) {
      p->Expected("balancer.topology",
                  "\"torus:AxB\" with A*B = parallel.ranks (" + std::to_string(ranks) + ")",
                  Quote(b.topology) + " (" + std::to_string(a * bdim) + " ranks)");
    }
  }
  // Each rank replicates D of its own experts, so it must host at least D.
  if (AllValid(*p, {"balancer.replicas_per_rank", "model.experts"})) {
    const int experts_per_rank = (c.model.experts + ranks - 1) / ranks;
    if (b.replicas_per_rank > experts_per_rank) {
      p->Expected("balancer.replicas_per_rank",
                  "at most the experts per rank (model.experts / parallel.ranks = " +
                      std::to_string(experts_per_rank) + ")",
                  std::to_string(b.replicas_per_rank));
    }
  }
}

void CheckServerSecurity(const Config& c, Problems* p) {
  const TlsConfig& tls = c.server.tls;
  if (AllValid(*p, {"server.tls.cert", "server.tls.key"}) && tls.cert.empty() != tls.key.empty()) {
    const char* missing = tls.cert.empty() ? "server.tls.cert" : "server.tls.key";
    p->Expected(missing, "a PEM file path: server.tls.cert and server.tls.key go together", "\"\"");
  }
  if (AllValid(*p, {"server.tls.client_ca", "server.tls.cert"}) && !tls.client_ca.empty() &&
      tls.cert.empty()) {
    p->Expected("server.tls.client_ca",
                "\"\" without server.tls.cert and server.tls.key (mTLS needs TLS)",
                Quote(tls.client_ca));
  }
  const RankTlsConfig& rank = c.server.rank_tls;
  const int set = !rank.cert.empty() + !rank.key.empty() + !rank.ca.empty();
  if (AllValid(*p, {"server.rank_tls.cert", "server.rank_tls.key", "server.rank_tls.ca"}) &&
      set != 0 && set != 3) {
    const char* missing = rank.cert.empty()  ? "server.rank_tls.cert"
                          : rank.key.empty() ? "server.rank_tls.key"
                                             : "server.rank_tls.ca";
    p->Expected(missing,
                "a PEM file path: server.rank_tls.cert, key and ca go together (mutual TLS)",
                "\"\"");
  }
}

}  // namespace

void CheckCrossFieldRules(const Config& config, Problems* problems) {
  CheckModelAndParallel(config, problems);
  CheckBalancer(config, problems);
  CheckServerSecurity(config, problems);
}

}  // namespace gcmoe::config::internal

namespace gcmoe::config {

Status CheckSplitMode(const Config& config) {
  internal::Problems problems;
  const std::string& rank_listen = config.server.rank_listen;
  const size_t colon = rank_listen.rfind(':');
  const std::string host = rank_listen.substr(0, colon);
  if (rank_listen.substr(colon + 1) == "0") {
    problems.Expected("server.rank_listen",
                      "a fixed port in split mode (ranks started apart read it from the config "
                      "to attach), e.g. \"127.0.0.1:50052\"",
                      "\"" + rank_listen + "\" (port 0: any free port)");
  }
  if (config.server.coordinator.empty() &&
      (host == "0.0.0.0" || host == "[::]" || host == "[0:0:0:0:0:0:0:0]")) {
    problems.Expected("server.coordinator",
                      "the host:port ranks dial in split mode when server.rank_listen is a "
                      "wildcard address (" +
                          rank_listen + ")",
                      "\"\"");
  }
  if (config.server.rank_secret_file.empty()) {
    problems.Expected("server.rank_secret_file",
                      "the attach secret's file in split mode (the coordinator and every rank "
                      "read it; only `gcmoe serve` makes one of its own), e.g. "
                      "\"/etc/gcmoe/rank.secret\"",
                      "\"\"");
  }
  return problems.ToStatus();
}

}  // namespace gcmoe::config
