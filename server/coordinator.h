// The coordinator: which rank processes are attached and ready, and the execution of Forward
// steps across them, one step at a time in arrival order.
//
// Membership: a rank attaches (Register), and once all P ranks are attached the coordinator
// starts an epoch: it sends Setup (every rank's transport name) and the service is SERVING when
// all P answer Ready for that epoch. A rank that disconnects makes the service NOT_SERVING at
// once and fails the step in flight with UNAVAILABLE; when it is back, a new epoch starts.
// Any failed step also ends with a new epoch, after every surviving rank has reported: Setup
// zeroes the ranks' exchange signals, so an aborted step leaves nothing stale behind.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "gcmoe/internal/v1/rank.pb.h"
#include "gcmoe/v1/moe.pb.h"
#include "server/balance_planner.h"
#include "server/forward_validation.h"
#include "server/rank_session.h"
#include "server/service_stats.h"

namespace gcmoe::server {

struct CoordinatorOptions {
  int world_size = 1;
  int hidden = 0;
  int experts = 0;
  std::string config_digest;
  int max_queue = 64;           // Forward calls allowed to wait behind the step in flight
  int step_timeout_ms = 60000;  // a step not answered by every rank by then fails
  int exchange_timeout_ms = 2000;
  bool balancer_enabled = false;
  // The ranks join an NCCL communicator each epoch (the CUDA backend's engine.exchange
  // "nccl"): every Setup carries a fresh unique id whose bootstrap root is this process.
  bool nccl_bootstrap = false;
};

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;

  // `planner` owns the placement and the pass count the ranks use.
  Coordinator(const CoordinatorOptions& options, std::unique_ptr<BalancePlanner> planner,
              ServiceStats* stats);
  ~Coordinator();

  // Each callback is called with the current state whenever serving may have changed (health,
  // serve's start-up wait). Callbacks run outside the coordinator's lock, one at a time.
  void AddServingCallback(std::function<void(bool)> callback);

  // RankControl side, from each attached rank's stream handler (after its attach proof).
  // CheckHello: the Hello fits this service (world size, rank index, config digest); the
  // messages name neither the coordinator's config nor its digest. Register checks it too, and
  // refuses with UNAVAILABLE while another session holds the rank.
  Status CheckHello(const gcmoe::internal::v1::Hello& hello) const;
  Status Register(const std::shared_ptr<RankSession>& session);
  void OnMessage(const std::shared_ptr<RankSession>& session,
                 const gcmoe::internal::v1::RankMessage& message);
  void Unregister(const std::shared_ptr<RankSession>& session);

  // MoeService side: runs one validated Forward. Blocks until it completes or fails.
  Status Forward(const gcmoe::v1::ForwardRequest& request, const ValidatedForward& validated,
                 Clock::time_point deadline, const std::function<bool()>& cancelled,
                 gcmoe::v1::ForwardResponse* response);

  bool serving() const;
  // Per-rank readiness and restart counts.
  void FillRankStats(gcmoe::v1::Stats* stats) const;

  // Refuses new Forward calls and waits (up to `timeout`) for those queued or in flight.
  void Drain(Clock::duration timeout);
  // Tells every attached rank to exit.
  void ShutdownRanks(const std::string& reason);

 private:
  struct Slot {
    std::shared_ptr<RankSession> session;
    bool ready = false;
    uint64_t registrations = 0;
  };
  struct InFlight {
    uint64_t generation = 0;
    bool active = false;
    bool failed = false;
    Status failure;
    std::vector<bool> reported;  // [P] result received, or the rank is gone
    int pending = 0;
    std::vector<gcmoe::internal::v1::StepResult> results;  // [P]
  };
  using Outbox = std::vector<std::pair<std::shared_ptr<RankSession>,
                                       gcmoe::internal::v1::CoordinatorMessage>>;

  bool AllAttachedLocked() const;
  int ReadyCountLocked() const;
  // Starts a new epoch when every rank is attached and no step is in flight.
  void MaybeStartEpochLocked(Outbox* outbox);
  void FailInFlightLocked(Status failure);
  void SetServingLocked(bool serving);
  void Deliver(Outbox* outbox);
  void NotifyServing();
  Status RunStep(const gcmoe::v1::ForwardRequest& request, const ValidatedForward& validated,
                 gcmoe::v1::ForwardResponse* response, StepRecord* record);
  // Finishes a failed step's bookkeeping once every surviving rank has reported.
  void MaybeFinishFailedStepLocked(Outbox* outbox);
  void WatchdogLoop();
  void ReleaseTurnLocked();

  const CoordinatorOptions options_;
  ServiceStats* stats_;
  std::unique_ptr<BalancePlanner> planner_;  // guarded by mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  uint64_t epoch_ = 0;
  bool epoch_pending_ = false;  // Setup sent, waiting for Ready
  bool serving_ = false;
  // A new epoch the coordinator chose (a refitted placement), not a failure: calls wait for it
  // instead of failing, and health stays SERVING.
  bool reconfiguring_ = false;
  bool draining_ = false;
  uint64_t generation_ = 0;
  InFlight in_flight_;
  Clock::time_point abort_deadline_{};  // a failed step's survivors must report by then
  bool stop_ = false;
  std::thread watchdog_;
  // FIFO admission of Forward calls: a ticket each, served in order.
  uint64_t next_ticket_ = 0;
  uint64_t now_serving_ = 0;
  std::set<uint64_t> abandoned_;  // tickets whose callers gave up (deadline, cancel)
  int waiting_ = 0;

  std::mutex notify_mu_;  // serializes serving callbacks so the last one reflects the state
  std::vector<std::function<void(bool)>> on_serving_;
};

}  // namespace gcmoe::server
