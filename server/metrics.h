// The Prometheus metrics of the coordinator, served as text on
// http://server.metrics_listen/metrics.
//
// Counters and histograms are recorded where a call ends, at the public API's edge
// (server/moe_service.cc), from what the call returned; state that lives elsewhere (queue depth,
// rank readiness, restarts and GPU memory) is read when Prometheus scrapes, so the coordinator's hot path
// carries no metrics code. README "Operating it" lists every metric.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "gcmoe/v1/moe.pb.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace gcmoe::server {

// What a scrape reads from the coordinator at that moment.
struct ServiceState {
  bool serving = false;
  int queue_depth = 0;                      // Forward calls waiting behind the step in flight
  // Readiness, restarts and GPU memory (where the rank has a GPU), one per rank.
  std::vector<gcmoe::v1::RankStats> ranks;
};

class Metrics {
 public:
  // Serves /metrics on `listen` (host:port, port 0 picks a free one); "" records without
  // serving. UNAVAILABLE, naming server.metrics_listen, when the address cannot be bound.
  static Result<std::unique_ptr<Metrics>> Start(const std::string& listen, int world_size);
  ~Metrics();

  // host:port actually bound; "" when not serving.
  const std::string& address() const { return address_; }

  // Reads the coordinator's state at each scrape; set once, before the first scrape matters.
  void SetStateSource(std::function<ServiceState()> source);

  // One finished call of the public API: its method ("Forward"), its status code name ("OK",
  // "INVALID_ARGUMENT") and its time from arrival to answer at the edge.
  void RecordCall(std::string_view method, std::string_view code, double seconds);
  // A Forward step that ran: queue wait, engine time, tokens, per-rank loads, the balancer's
  // solve time, from the response's ForwardStats.
  void RecordStep(const gcmoe::v1::ForwardStats& stats, int num_tokens);
  // One stage of the Forward data path (e.g. "decode", "exchange", "assemble"): the hook for a
  // per-stage breakdown, exported as gcmoe_forward_stage_seconds{stage="..."}.
  void RecordStage(std::string_view stage, double seconds);

  // Calls being handled at the edge now; pair every CallStarted with one CallFinished.
  void CallStarted();
  void CallFinished();

 private:
  class Families;
  class StateCollector;
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  std::shared_ptr<StateCollector> state_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace gcmoe::server
