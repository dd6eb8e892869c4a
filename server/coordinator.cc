#include "server/coordinator.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine/nccl_comm.h"

namespace gcmoe::server {
namespace {

namespace internal = gcmoe::internal::v1;

int64_t Nanos(Coordinator::Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// Copies rows [begin, begin + rows) of a row-major tensor into `out` (same dtype).
void SliceRows(const gcmoe::v1::Tensor& t, int64_t begin, int64_t rows, gcmoe::v1::Tensor* out) {
  out->set_dtype(t.dtype());
  out->add_shape(rows);
  out->add_shape(t.shape(1));
  const int64_t row_bytes = t.shape(0) > 0 ? static_cast<int64_t>(t.data().size()) / t.shape(0)
                                           : 0;
  out->set_data(t.data().substr(begin * row_bytes, rows * row_bytes));
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options,
                         std::unique_ptr<BalancePlanner> planner, ServiceStats* stats)
    : options_(options), stats_(stats), planner_(std::move(planner)), slots_(options.world_size) {
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

void Coordinator::AddServingCallback(std::function<void(bool)> callback) {
  std::lock_guard<std::mutex> lock(notify_mu_);
  on_serving_.push_back(std::move(callback));
}

bool Coordinator::serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return (serving_ || reconfiguring_) && !draining_;
}

bool Coordinator::AllAttachedLocked() const {
  return std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.session; });
}

int Coordinator::ReadyCountLocked() const {
  return static_cast<int>(std::count_if(slots_.begin(), slots_.end(),
                                        [](const Slot& s) { return s.session && s.ready; }));
}

void Coordinator::SetServingLocked(bool serving) {
  if (serving_ == serving) return;
  serving_ = serving;
  if (serving) {
    spdlog::info("serving: all {} rank(s) ready (epoch {})", options_.world_size, epoch_);
  } else {
    spdlog::warn("not serving: {} of {} rank(s) ready", ReadyCountLocked(), options_.world_size);
  }
}

// Health is set from the current state, never from the transition that triggered the call, so
// racing notifications still leave the last word to the latest state.
void Coordinator::NotifyServing() {
  std::lock_guard<std::mutex> lock(notify_mu_);
  bool healthy;
  {
    std::lock_guard<std::mutex> state(mu_);
    healthy = (serving_ || reconfiguring_) && !draining_;
  }
  for (const auto& callback : on_serving_) callback(healthy);
}

void Coordinator::Deliver(Outbox* outbox) {
  for (auto& [session, message] : *outbox) {
    if (!session->Send(message)) {
      spdlog::warn("{}: control stream closed; message not delivered", session->Describe());
    }
  }
  outbox->clear();
}

void Coordinator::MaybeStartEpochLocked(Outbox* outbox) {
  if (draining_ || !AllAttachedLocked() || in_flight_.active) return;
  ++epoch_;
  epoch_pending_ = true;
  internal::CoordinatorMessage message;
  internal::Setup* setup = message.mutable_setup();
  setup->set_epoch(epoch_);
  setup->set_first_generation(generation_);
  for (const Slot& slot : slots_) setup->add_peer_transport_names(slot.session->transport_name());
  internal::Placement* placement = setup->mutable_placement();
  placement->set_version(planner_->placement_version());
  placement->mutable_home()->Assign(planner_->placement().home.begin(),
                                    planner_->placement().home.end());
  placement->mutable_host()->Assign(planner_->placement().host.begin(),
                                    planner_->placement().host.end());
  if (options_.nccl_bootstrap) {
    // The ranks report it in their Ready (and the epoch is retried) if this failed.
    Result<std::string> id = engine::NewNcclUniqueId();
    if (id.ok()) {
      setup->set_nccl_unique_id(*id);
    } else {
      spdlog::error("epoch {}: no NCCL unique id for the ranks: {}", epoch_, id.status().ToString());
    }
  }
  for (Slot& slot : slots_) {
    slot.ready = false;
    outbox->emplace_back(slot.session, message);
  }
  spdlog::info("epoch {}: connecting {} rank(s)", epoch_, options_.world_size);
}

Status Coordinator::CheckHello(const internal::Hello& hello) const {
  if (hello.world_size() != static_cast<uint32_t>(options_.world_size)) {
    return FailedPrecondition("rank " + std::to_string(hello.rank()) + " was started for " +
                              std::to_string(hello.world_size()) +
                              " ranks; this coordinator serves " +
                              std::to_string(options_.world_size));
  }
  if (hello.rank() >= static_cast<uint32_t>(options_.world_size)) {
    return FailedPrecondition("rank " + std::to_string(hello.rank()) + " is out of range 0.." +
                              std::to_string(options_.world_size - 1));
  }
  // The message goes back to the rank: it names neither digest (the rank logs its own).
  if (hello.config_digest() != options_.config_digest) {
    return FailedPrecondition("rank " + std::to_string(hello.rank()) +
                              "'s configuration differs from the coordinator's: model, "
                              "parallel, engine and balancer sections must match");
  }
  return Status::Ok();
}

Status Coordinator::Register(const std::shared_ptr<RankSession>& session) {
  GCMOE_RETURN_IF_ERROR(CheckHello(session->hello()));
  Outbox outbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return Unavailable("the coordinator is shutting down");
    Slot& slot = slots_[session->rank()];
    if (slot.session) {
      // A live session is never replaced: a Hello alone proves nothing about the process that
      // holds the slot. A restarted rank gets in once its predecessor's stream has ended (at
      // once when that process died; keepalive finds a vanished host).
      return Unavailable("rank " + std::to_string(session->rank()) + " is attached already (" +
                         slot.session->Describe() +
                         "); a new process is admitted once that one's stream has closed");
    }
    slot.session = session;
    slot.ready = false;
    ++slot.registrations;
    reconfiguring_ = false;
    SetServingLocked(false);
    spdlog::info("{} attached (transport {}){}", session->Describe(), session->transport_name(),
                 slot.registrations > 1 ? " after a restart" : "");
    MaybeFinishFailedStepLocked(&outbox);
    MaybeStartEpochLocked(&outbox);
  }
  cv_.notify_all();
  Deliver(&outbox);
  NotifyServing();
  return Status::Ok();
}

void Coordinator::FailInFlightLocked(Status failure) {
  if (!in_flight_.active || in_flight_.failed) return;
  in_flight_.failed = true;
  in_flight_.failure = std::move(failure);
}

void Coordinator::MaybeFinishFailedStepLocked(Outbox* outbox) {
  if (!in_flight_.active || !in_flight_.failed || in_flight_.pending > 0) return;
  in_flight_.active = false;
  MaybeStartEpochLocked(outbox);
}

void Coordinator::OnMessage(const std::shared_ptr<RankSession>& session,
                            const internal::RankMessage& message) {
  Outbox outbox;
  const int r = session->rank();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[r].session != session) return;  // not (or no longer) the attached session
    if (message.has_ready()) {
      const internal::Ready& ready = message.ready();
      if (ready.epoch() != epoch_) return;
      if (!ready.error().empty()) {
        spdlog::error("{} could not connect for epoch {}: {}", session->Describe(), epoch_,
                      ready.error());
        outbox.clear();
        session->Cancel();  // it re-attaches (or is restarted) and a new epoch retries
      } else {
        slots_[r].ready = true;
        if (ReadyCountLocked() == options_.world_size) {
          epoch_pending_ = false;
          reconfiguring_ = false;
          SetServingLocked(true);
        }
      }
    } else if (message.has_step_result()) {
      const internal::StepResult& result = message.step_result();
      if (in_flight_.active && result.generation() == in_flight_.generation &&
          !in_flight_.reported[r]) {
        in_flight_.results[r] = result;
        in_flight_.reported[r] = true;
        --in_flight_.pending;
        if (result.code() != 0) {
          FailInFlightLocked(Status(static_cast<StatusCode>(result.code()),
                                    session->Describe() + ": " + result.message()));
        }
        MaybeFinishFailedStepLocked(&outbox);
      }
    }
  }
  cv_.notify_all();
  Deliver(&outbox);
  NotifyServing();
}

void Coordinator::Unregister(const std::shared_ptr<RankSession>& session) {
  Outbox outbox;
  const int r = session->rank();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[r].session == session) {
      slots_[r].session.reset();
      slots_[r].ready = false;
      reconfiguring_ = false;
      spdlog::warn("{} disconnected", session->Describe());
      SetServingLocked(false);
      if (in_flight_.active && !in_flight_.reported[r]) {
        in_flight_.reported[r] = true;
        --in_flight_.pending;
        FailInFlightLocked(Unavailable(session->Describe() + " disconnected during step " +
                                       std::to_string(in_flight_.generation)));
      }
      MaybeFinishFailedStepLocked(&outbox);
    }
  }
  cv_.notify_all();
  Deliver(&outbox);
  NotifyServing();
}

void Coordinator::ReleaseTurnLocked() {
  ++now_serving_;
  while (abandoned_.erase(now_serving_) > 0) ++now_serving_;
  cv_.notify_all();
}

Status Coordinator::Forward(const gcmoe::v1::ForwardRequest& request,
                            const ValidatedForward& validated, Clock::time_point deadline,
                            const std::function<bool()>& cancelled,
                            gcmoe::v1::ForwardResponse* response) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (draining_) return Unavailable("the service is shutting down");
  if (waiting_ >= options_.max_queue) {
    return ResourceExhausted("the request queue is full (" + std::to_string(waiting_) +
                             " calls waiting; server.max_queue)");
  }
  const uint64_t ticket = next_ticket_++;
  ++waiting_;
  while (now_serving_ != ticket) {
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (now_serving_ == ticket) break;
    const bool expired = Clock::now() >= deadline;
    if (expired || cancelled()) {
      --waiting_;
      abandoned_.insert(ticket);
      if (expired) {
        return DeadlineExceeded("the deadline passed while the call waited for earlier steps");
      }
      return Aborted("the call was cancelled while it waited for earlier steps");
    }
  }
  --waiting_;
  // A planned new epoch (a refitted placement) is waited out, not failed.
  while (reconfiguring_ && !serving_ && Clock::now() < deadline && !cancelled()) {
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  // Calls admitted before a drain began still run: draining refuses only new admissions.
  Status status;
  StepRecord record;
  if (Clock::now() >= deadline) {
    status = DeadlineExceeded("the deadline passed while the call waited for earlier steps");
  } else if (!serving_) {
    status = Unavailable(std::to_string(ReadyCountLocked()) + " of " +
                         std::to_string(options_.world_size) +
                         " rank(s) ready; the service is not serving");
  } else {
    lock.unlock();
    const auto step_start = Clock::now();
    status = RunStep(request, validated, response, &record);
    if (status.ok()) {
      gcmoe::v1::ForwardStats* stats = response->mutable_stats();
      stats->set_queue_ns(Nanos(step_start - start));
      stats->set_total_ns(Nanos(Clock::now() - start));
      record.total_ns = stats->total_ns();
      stats_->RecordSuccess(record);
    }
    lock.lock();
  }
  ReleaseTurnLocked();
  return status;
}

Status Coordinator::RunStep(const gcmoe::v1::ForwardRequest& request,
                            const ValidatedForward& validated,
                            gcmoe::v1::ForwardResponse* response, StepRecord* record) {
  const int P = options_.world_size;
  std::vector<std::shared_ptr<RankSession>> sessions(P);
  uint64_t generation;
  uint64_t epoch;
  int passes;
  uint64_t placement_version;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = ++generation_;
    epoch = epoch_;
    passes = planner_->passes();
    placement_version = planner_->placement_version();
    in_flight_ = InFlight{};
    in_flight_.generation = generation;
    in_flight_.active = true;
    in_flight_.reported.assign(P, false);
    in_flight_.pending = P;
    in_flight_.results.resize(P);
    for (int r = 0; r < P; ++r) sessions[r] = slots_[r].session;
  }

  // Shard by source rank: contiguous token ranges, with the count matrix every rank needs.
  int64_t begin = 0;
  for (int r = 0; r < P; ++r) {
    const int64_t rows = validated.tokens_per_rank[r];
    internal::CoordinatorMessage message;
    internal::Step* step = message.mutable_step();
    step->set_generation(generation);
    step->set_epoch(epoch);
    step->set_layer(request.layer());
    SliceRows(request.hidden(), begin, rows, step->mutable_hidden());
    if (request.hidden().dtype() == gcmoe::v1::FP8_E4M3) {
      SliceRows(request.hidden_scales(), begin, rows, step->mutable_hidden_scales());
    }
    SliceRows(request.topk_ids(), begin, rows, step->mutable_topk_ids());
    SliceRows(request.topk_weights(), begin, rows, step->mutable_topk_weights());
    step->set_output_dtype(validated.output_fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    for (int t : validated.tokens_per_rank) step->add_tokens_per_rank(static_cast<uint32_t>(t));
    for (int64_t c : validated.counts) step->add_counts(c);
    step->set_request_id(validated.request_id);
    step->set_relief_passes(static_cast<uint32_t>(passes));
    step->set_placement_version(placement_version);
    begin += rows;
    if (!sessions[r] || !sessions[r]->Send(message)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!in_flight_.reported[r]) {
        in_flight_.reported[r] = true;
        --in_flight_.pending;
      }
      FailInFlightLocked(Unavailable("rank " + std::to_string(r) + "'s control stream is closed"));
    }
  }

  std::unique_lock<std::mutex> lock(mu_);
  const auto step_deadline = Clock::now() + std::chrono::milliseconds(options_.step_timeout_ms);
  cv_.wait_until(lock, step_deadline,
                 [this] { return in_flight_.pending == 0 || in_flight_.failed; });
  if (!in_flight_.failed && in_flight_.pending > 0) {
    std::string missing;
    for (int r = 0; r < P; ++r) {
      if (!in_flight_.reported[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    FailInFlightLocked(Unavailable("step " + std::to_string(generation) + ": rank(s) " +
                                   missing + " did not answer within " +
                                   std::to_string(options_.step_timeout_ms) + " ms"));
  }
  if (in_flight_.failed) {
    const Status failure = in_flight_.failure;
    // The step is over for the caller; the ranks still in it are told to give up, and the
    // bookkeeping (a new epoch) finishes once they have all reported or been cut off.
    abort_deadline_ = Clock::now() + std::chrono::milliseconds(options_.exchange_timeout_ms +
                                                               2000);
    SetServingLocked(false);
    std::vector<std::shared_ptr<RankSession>> survivors;
    for (int r = 0; r < P; ++r) {
      if (!in_flight_.reported[r] && sessions[r]) survivors.push_back(sessions[r]);
    }
    Outbox outbox;
    MaybeFinishFailedStepLocked(&outbox);
    lock.unlock();
    spdlog::warn("step {} failed: {}", generation, failure.ToString());
    internal::CoordinatorMessage abort;
    abort.mutable_abort()->set_generation(generation);
    abort.mutable_abort()->set_reason(failure.message());
    for (const auto& s : survivors) s->Send(abort);
    Deliver(&outbox);
    NotifyServing();
    // A rank that died is an availability problem for the caller, whatever the survivors said.
    if (failure.code() == StatusCode::kAborted) return Unavailable(failure.message());
    return failure;
  }

  // Success: assemble the output in rank order and the stats.
  const std::vector<internal::StepResult> results = std::move(in_flight_.results);
  in_flight_.active = false;
  int64_t slowest_ns = 0;
  for (const internal::StepResult& r : results) slowest_ns = std::max(slowest_ns, r.engine_ns());
  std::vector<int64_t> expert_tokens(options_.experts, 0);
  for (size_t i = 0; i < validated.counts.size(); ++i) {
    expert_tokens[i % options_.experts] += validated.counts[i];
  }
  Outbox outbox;
  if (planner_->Observe(expert_tokens, slowest_ns)) {
    // The ranks load the new placement's weights in a new epoch; calls wait meanwhile.
    reconfiguring_ = true;
    serving_ = false;
    MaybeStartEpochLocked(&outbox);
  }
  lock.unlock();
  Deliver(&outbox);

  gcmoe::v1::Tensor* output = response->mutable_output();
  output->set_dtype(validated.output_fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
  output->add_shape(validated.num_tokens);
  output->add_shape(options_.hidden);
  std::string* data = output->mutable_data();
  const size_t expected =
      static_cast<size_t>(validated.num_tokens) * options_.hidden * (validated.output_fp32 ? 4 : 2);
  data->reserve(expected);
  gcmoe::v1::ForwardStats* stats = response->mutable_stats();
  int64_t engine_ns = 0;
  for (int r = 0; r < P; ++r) {
    const internal::StepResult& result = results[r];
    data->append(result.output().data());
    engine_ns = std::max(engine_ns, result.engine_ns());
    gcmoe::v1::RankStepStats* rank = stats->add_ranks();
    rank->set_rank(r);
    rank->set_tokens(validated.tokens_per_rank[r]);
    rank->set_assignments_computed(result.assignments_computed());
    rank->set_engine_ns(result.engine_ns());
    record->rank_engine_ns.push_back(result.engine_ns());
    if (r > 0 && (result.load_after().size() != results[0].load_after().size() ||
                  !std::equal(result.load_after().begin(), result.load_after().end(),
                              results[0].load_after().begin()))) {
      spdlog::error("step {}: rank {} computed another split than rank 0", generation, r);
      return Internal("step " + std::to_string(generation) + ": ranks disagree on the split");
    }
  }
  if (data->size() != expected) {
    return Internal("step " + std::to_string(generation) + ": the ranks returned " +
                    std::to_string(data->size()) + " output bytes, expected " +
                    std::to_string(expected));
  }
  const internal::StepResult& first = results[0];
  stats->mutable_load_before()->Assign(first.load_before().begin(), first.load_before().end());
  stats->mutable_load_after()->Assign(first.load_after().begin(), first.load_after().end());
  stats->set_relief_passes(first.relief_passes());
  stats->set_relief_solve_ns(first.relief_solve_ns());
  stats->set_engine_ns(engine_ns);
  stats->set_balancer_enabled(options_.balancer_enabled);
  record->engine_ns = engine_ns;
  record->tokens = validated.num_tokens;
  record->load_before.assign(first.load_before().begin(), first.load_before().end());
  record->load_after.assign(first.load_after().begin(), first.load_after().end());
  record->passes = static_cast<int>(first.relief_passes());
  record->solve_ns = first.relief_solve_ns();
  return Status::Ok();
}

void Coordinator::WatchdogLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    if (in_flight_.active && in_flight_.failed && in_flight_.pending > 0 &&
        Clock::now() >= abort_deadline_) {
      // Ranks that neither reported nor disconnected after an abort are stuck: cut them off
      // so they re-attach (or are restarted) and a new epoch can start.
      for (int r = 0; r < options_.world_size; ++r) {
        if (!in_flight_.reported[r] && slots_[r].session) {
          spdlog::error("{} did not leave aborted step {}; disconnecting it",
                        slots_[r].session->Describe(), in_flight_.generation);
          slots_[r].session->Cancel();
        }
      }
      abort_deadline_ = Clock::now() + std::chrono::seconds(5);
    }
  }
}

void Coordinator::FillRankStats(gcmoe::v1::Stats* stats) const {
  std::lock_guard<std::mutex> lock(mu_);
  stats->set_serving(serving_ && !draining_);
  for (int r = 0; r < options_.world_size && r < stats->ranks_size(); ++r) {
    gcmoe::v1::RankStats* rank = stats->mutable_ranks(r);
    rank->set_ready(slots_[r].session && slots_[r].ready);
    rank->set_restarts(slots_[r].registrations > 0 ? slots_[r].registrations - 1 : 0);
  }
}

void Coordinator::Drain(Clock::duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  spdlog::info("draining: refusing new calls, finishing {} admitted", next_ticket_ - now_serving_ - abandoned_.size());
  const auto deadline = Clock::now() + timeout;
  cv_.wait_until(lock, deadline, [this] {
    return next_ticket_ == now_serving_ + abandoned_.size() && !in_flight_.active;
  });
  lock.unlock();
  NotifyServing();
}

void Coordinator::ShutdownRanks(const std::string& reason) {
  Outbox outbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    internal::CoordinatorMessage message;
    message.mutable_shutdown()->set_reason(reason);
    for (const Slot& slot : slots_) {
      if (slot.session) outbox.emplace_back(slot.session, message);
    }
  }
  Deliver(&outbox);
}

}  // namespace gcmoe::server
