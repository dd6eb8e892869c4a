// The coordinator: which rank processes are attached and ready, and the execution of Forward
// steps across them in arrival order, up to server.max_steps_in_flight at a time.
//
// Admission: each Forward call waits on its own condition (no shared wake-ups). The thread of
// the oldest waiting call leads the next step when no other leader is sending one and fewer
// steps than the pipeline depth are in flight: it merges into its step the other waiting calls
// for the same layer and dtypes, up to server.max_batch_calls calls and parallel.ranks x
// engine.max_tokens_per_rank tokens (optionally after waiting server.batch_window_us for more),
// sends it, and then wakes the next oldest call to lead while it waits for its own results. A
// lone call thus runs on its own thread with no hand-off. The numerics are row-independent, so
// each caller gets the same bytes as it would alone.
//
// Pipelined steps: with every rank on this host (RankIo regions), step N+1 is sent while step N
// runs, into the other I/O slot and the next doorbell message, so a rank starts it the moment N
// is done instead of after N's round trip through the coordinator; N's outputs are assembled
// meanwhile. Ranks run steps in generation order, and a step's exchange begins with a barrier on
// every rank's inputs, so a rank one step ahead of a peer waits for it. Otherwise (a rank
// elsewhere, a message too large for the doorbell) a step is sent once those before it are done,
// which keeps every rank's steps in generation order.
//
// Data path: a rank on this host gets its shard through a RankIo region (shared memory) the
// coordinator writes straight from the requests, and writes its output there, from where each
// caller's response is assembled; a rank elsewhere gets tensors in its Step messages.
//
// Membership: a rank attaches (Register), and once all P ranks are attached the coordinator
// starts an epoch: it sends Setup (every rank's transport name) and the service is SERVING when
// all P answer Ready for that epoch. A rank that disconnects makes the service NOT_SERVING at
// once and fails the step in flight with UNAVAILABLE; when it is back, a new epoch starts.
// Any failed step fails every step in flight with it and ends with a new epoch, after every
// surviving rank has reported each of them: Setup zeroes the ranks' exchange signals, so an
// aborted step leaves nothing stale behind.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "gcmoe/internal/v1/rank.pb.h"
#include "gcmoe/v1/moe.pb.h"
#include "server/balance_planner.h"
#include "server/forward_validation.h"
#include "server/parallel_bytes.h"
#include "server/rank_io.h"
#include "server/rank_session.h"
#include "server/service_stats.h"

namespace gcmoe::server {

struct CoordinatorOptions {
  int world_size = 1;
  int hidden = 0;
  int experts = 0;
  int top_k = 0;
  int max_tokens_per_rank = 0;
  std::string config_digest;
  int max_queue = 64;           // Forward calls allowed to wait behind the step in flight
  int step_timeout_ms = 60000;  // a step not answered by every rank by then fails
  int exchange_timeout_ms = 2000;
  bool balancer_enabled = false;
  // The ranks join an NCCL communicator each epoch (the CUDA backend's engine.exchange
  // "nccl"): every Setup carries a fresh unique id whose bootstrap root is this process.
  bool nccl_bootstrap = false;
  // Ranks on this host get a RankIo region (server.rank_io "auto").
  bool shared_memory_io = true;
  // The ranks' GPUs upload the activations from their RankIo regions by DMA (the cuda backend):
  // the coordinator writes those around its cache (Stores::kStreaming).
  bool rank_io_uploaded = false;
  std::chrono::microseconds batch_window{0};  // server.batch_window_us
  int max_batch_calls = 64;                   // server.max_batch_calls
  int max_steps_in_flight = 2;                // server.max_steps_in_flight
  std::chrono::microseconds spin{0};          // from server.spin_wait (HotPathSpinBudget)
  // Shares the copies of a step's large shards and outputs (server.copy_threads); null: the
  // leader's thread does them alone.
  engine::ThreadPool* copy_pool = nullptr;
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

  // MoeService side: runs one validated Forward, alone or merged with other calls. Blocks until
  // it completes or fails; `request` and `validated` must stay valid until then.
  Status Forward(const gcmoe::v1::ForwardRequest& request, const ValidatedForward& validated,
                 Clock::time_point deadline, const std::function<bool()>& cancelled,
                 gcmoe::v1::ForwardResponse* response);

  // Registered GPU memory (RegisterMemory's cuda_ipc): every rank opens `region` (whose id this
  // sets) before this returns its id; on the first rank's error (INVALID_ARGUMENT naming the
  // field for a handle, device or size that does not fit) the others close it again.
  // FAILED_PRECONDITION unless every rank runs on this host; UNAVAILABLE while the service is not
  // serving or when a rank does not answer within `timeout`.
  Result<uint64_t> OpenDeviceRegion(gcmoe::internal::v1::DeviceRegion region,
                                    Clock::duration timeout);
  // The registration of region `id` is gone and no call uses it: every rank closes it.
  void CloseDeviceRegion(uint64_t id);

  bool serving() const;
  // Forward calls waiting behind the steps in flight.
  int queue_depth() const;
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
    std::shared_ptr<RankIo> io;  // this session's region; null: inline tensors
    // Stops the thread that reads this session's results from its region's doorbell.
    std::shared_ptr<std::atomic<bool>> io_stop;
    // The session's latest report of its GPU's memory (Ready, then sampled step results).
    std::optional<gcmoe::v1::GpuMemory> gpu_memory;
  };
  // A step from its generation until it is over: on success once its leader has assembled its
  // outputs (its I/O slot is free again), on failure once every rank has reported or been cut
  // off and its leader has left.
  struct InFlight {
    bool failed = false;
    Status failure;
    bool leader_gone = false;    // failed, and its leader no longer reads this
    bool on_stream = false;      // sent on a control stream to some rank
    std::vector<bool> reported;  // [P] result received, or the rank is gone
    int pending = 0;
    std::vector<gcmoe::internal::v1::StepResult> results;  // [P]
    std::vector<int64_t> arrived_ns;                       // [P] when each result came
    // pending == 0 || failed, readable without the lock (its leader spins on it first).
    std::atomic<bool> settled{false};
    void Settle() {
      if (pending == 0 || failed) settled.store(true, std::memory_order_release);
    }
  };
  // One Forward call, from admission until its caller has its answer.
  struct Call {
    const gcmoe::v1::ForwardRequest* request = nullptr;
    const ValidatedForward* validated = nullptr;
    gcmoe::v1::ForwardResponse* response = nullptr;
    Clock::time_point arrived;
    Clock::time_point deadline;
    enum class State { kWaiting, kRunning, kDone } state = State::kWaiting;
    Status status;
    std::condition_variable done;  // the caller waits on its own condition
  };
  // The rows of one rank's shard that one call holds: call rows [call_row, call_row + rows) are
  // shard rows [shard_row, shard_row + rows).
  struct Piece {
    int call = 0;
    int64_t call_row = 0;
    int64_t shard_row = 0;
    int64_t rows = 0;
  };
  using Outbox =
      std::vector<std::pair<std::shared_ptr<RankSession>, gcmoe::internal::v1::CoordinatorMessage>>;

  bool AllAttachedLocked() const;
  int ReadyCountLocked() const;
  // Starts a new epoch when every rank is attached and no step is in flight.
  void MaybeStartEpochLocked(Outbox* outbox);
  // Fails every step in flight that has not completed: `generation`'s with `failure`, the others
  // as abandoned because of it.
  void FailInFlightLocked(uint64_t generation, Status failure);
  // Steps in flight at most: RankIo::kSlots (bounded by server.max_steps_in_flight) when every
  // rank has a RankIo region, else 1.
  int PipelineDepthLocked() const;
  // Whether waiting `call` may lead the next step now: it is the oldest, no leader is sending,
  // the pipeline has a place, and the next generation's I/O slot is free (steps can end out of
  // order, and an older step in flight may still be reading its outputs from that slot).
  bool CanLeadLocked(const Call* call) const;
  // Wakes the oldest waiting call, which leads the next step if it can.
  void WakeNextLeaderLocked();
  // A step is over: frees its place, and starts a wanted epoch once nothing is in flight.
  void EndStepLocked(uint64_t generation, Outbox* outbox);
  void SetServingLocked(bool serving);
  void Deliver(Outbox* outbox);
  void NotifyServing();
  // Runs the next step, for the oldest waiting call (`self`, whose caller's thread runs it: no
  // hand-off to another thread when calls do not queue) and the calls merged with it; then
  // wakes the next oldest to lead the step after.
  void LeadStepLocked(std::unique_lock<std::mutex>& lock, Call* self);
  // Takes the calls of the next step out of pending_ (the oldest and those it can merge).
  std::vector<Call*> TakeBatchLocked();
  // A step sent to the ranks, as its leader finishes it.
  struct SentStep {
    uint64_t generation = 0;
    int io_slot = 0;
    Clock::time_point start;
    int64_t sent_ns = 0;
    int steps_in_flight = 0;                             // this one included, as it was sent
    std::vector<int> tokens_per_rank;                    // [P]
    std::vector<std::vector<Piece>> pieces;              // [P] each rank's shard, by call
    std::vector<int64_t> counts;                         // [P, E] of the step
    std::vector<std::shared_ptr<RankSession>> sessions;  // [P] as of the send
    std::vector<std::shared_ptr<RankIo>> ios;            // [P] as of the send
  };
  // Sends one step for `calls` (the caller holds sending_, so steps go out in generation order).
  // An error means no rank was sent anything.
  Result<SentStep> SendStep(const std::vector<Call*>& calls);
  // Waits for a sent step's results and fills each call's response; the status is every
  // call's, but for a call whose values in GPU memory a rank refused, which gets that error in
  // its Call::status. Ends the step's InFlight.
  Status FinishStep(const std::vector<Call*>& calls, const SentStep& sent);
  Status NotServingLocked() const;
  // FAILED_PRECONDITION when the call's GPU memory is no longer open on every rank.
  Status DeviceMemoryOpenLocked(const ValidatedForward& validated) const;
  // Describes one rank's shard of the step in its Step message and lists the copies that put
  // its bytes into the message or its RankIo slot.
  void WriteShard(const std::vector<Call*>& calls, const std::vector<Piece>& pieces, RankIo* io,
                  int io_slot, gcmoe::internal::v1::Step* step,
                  std::vector<ByteCopy>* copies) const;
  // Gives each call's response its output's dtype and shape and, when the output goes in the
  // response, its bytes (zeroed: std::string can only grow that way, about 0.2 ms at T = 256,
  // which the leader spends while the step runs).
  static void PrepareOutputs(const std::vector<Call*>& calls, int hidden);
  // Copies each call's rows of the ranks' outputs into its response (or its output region) and
  // checks them on the way: a call whose output is not finite gets INVALID_ARGUMENT naming the
  // element in its Call::status (DESIGN.md §4), the others are unaffected.
  Status AssembleOutputs(const std::vector<Call*>& calls,
                         const std::vector<std::vector<Piece>>& pieces,
                         const std::vector<std::shared_ptr<RankIo>>& ios, int io_slot,
                         const std::vector<gcmoe::internal::v1::StepResult>& results,
                         uint64_t generation);
  // Ends each failed step whose ranks have all reported and whose leader has left.
  void MaybeFinishFailedStepsLocked(Outbox* outbox);
  void WatchdogLoop();
  // Reads `session`'s step results from its region's doorbell until *stop, handing each to
  // OnMessage as if it had come on the control stream.
  void StartResultReader(const std::shared_ptr<RankSession>& session,
                         const std::shared_ptr<RankIo>& io,
                         const std::shared_ptr<std::atomic<bool>>& stop);
  static void StopResultReader(Slot* slot);

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
  // A new epoch must start once no step is in flight (after a failure, or a refitted placement).
  bool epoch_wanted_ = false;
  uint64_t generation_ = 0;
  std::map<uint64_t, InFlight> in_flight_;  // by generation, oldest first
  Clock::time_point abort_deadline_{};      // a failed step's survivors must report by then
  bool stop_ = false;
  std::thread watchdog_;
  std::string host_;  // this host's name: ranks with the same one get a RankIo region
  // Admitted calls not yet in a step, oldest first.
  std::deque<Call*> pending_;
  bool sending_ = false;             // a leader is forming or sending a step
  std::condition_variable work_cv_;  // the leader: a call arrived, or the state changed
  // cuda_ipc registrations (OpenDeviceRegion) every rank holds open; each Setup lists them, so a
  // restarted rank opens them again before it is Ready.
  std::map<uint64_t, gcmoe::internal::v1::DeviceRegion> device_regions_;
  // Those a restarted rank could not open again: why, by id (calls naming them fail).
  std::map<uint64_t, std::string> lost_regions_;
  // OpenDeviceRegion calls waiting for the ranks: which have answered, and the first failure.
  struct Opening {
    std::vector<bool> answered;  // [P]
    Status failure;
  };
  std::map<uint64_t, Opening> openings_;
  uint64_t last_region_id_ = 0;
  int result_readers_ = 0;           // StartResultReader threads still running (guarded by mu_)

  std::mutex notify_mu_;  // serializes serving callbacks so the last one reflects the state
  std::vector<std::function<void(bool)>> on_serving_;
};

}  // namespace gcmoe::server
