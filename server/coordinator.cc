#include "server/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "engine/nccl_comm.h"

namespace gcmoe::server {
namespace {

namespace internal = gcmoe::internal::v1;

// The host's monotonic clock, as the ranks stamp their StepResults with it.
int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Coordinator::Clock::now().time_since_epoch())
      .count();
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Calls can share a step when the ranks would run them the same way.
bool Mergeable(const gcmoe::v1::ForwardRequest& a, const ValidatedForward& va,
               const gcmoe::v1::ForwardRequest& b, const ValidatedForward& vb) {
  return a.layer() == b.layer() && va.hidden_dtype == vb.hidden_dtype &&
         va.output_fp32 == vb.output_fp32;
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options, std::unique_ptr<BalancePlanner> planner,
                         ServiceStats* stats)
    : options_(options),
      stats_(stats),
      planner_(std::move(planner)),
      slots_(options.world_size),
      host_(HostName()) {
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (Slot& slot : slots_) StopResultReader(&slot);
  }
  cv_.notify_all();
  work_cv_.notify_all();
  watchdog_.join();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return result_readers_ == 0; });
}

void Coordinator::StopResultReader(Slot* slot) {
  if (slot->io_stop) slot->io_stop->store(true);
  if (slot->io) slot->io->Wake(RankIo::kToCoordinator);
  slot->io_stop.reset();
}

void Coordinator::StartResultReader(const std::shared_ptr<RankSession>& session,
                                    const std::shared_ptr<RankIo>& io,
                                    const std::shared_ptr<std::atomic<bool>>& stop) {
  ++result_readers_;  // under mu_
  std::thread([this, session, io, stop] {
    uint32_t seen = io->sequence(RankIo::kToCoordinator);
    std::string bytes;
    internal::RankMessage message;
    while (!stop->load()) {
      if (!io->Wait(RankIo::kToCoordinator, &seen, options_.spin, std::chrono::milliseconds(100),
                    &bytes)) {
        continue;
      }
      if (stop->load()) break;
      if (!message.mutable_step_result()->ParseFromString(bytes)) {
        spdlog::error("{}: an unreadable step result in its I/O region", session->Describe());
        continue;
      }
      OnMessage(session, message);
    }
    std::lock_guard<std::mutex> lock(mu_);
    --result_readers_;
    cv_.notify_all();
  }).detach();
}

void Coordinator::AddServingCallback(std::function<void(bool)> callback) {
  std::lock_guard<std::mutex> lock(notify_mu_);
  on_serving_.push_back(std::move(callback));
}

bool Coordinator::serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return (serving_ || reconfiguring_) && !draining_;
}

int Coordinator::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pending_.size());
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
  if (draining_ || !AllAttachedLocked() || !in_flight_.empty()) return;
  ++epoch_;
  epoch_pending_ = true;
  epoch_wanted_ = false;
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
      spdlog::error("epoch {}: no NCCL unique id for the ranks: {}", epoch_,
                    id.status().ToString());
    }
  }
  for (const auto& [id, region] : device_regions_) *setup->add_device_regions() = region;
  for (Slot& slot : slots_) {
    slot.ready = false;
    if (slot.io) {
      setup->set_io_region(slot.io->name());
      setup->set_io_slots(static_cast<uint32_t>(slot.io->layout().slots));
      setup->set_io_bytes(slot.io->bytes());
    } else {
      setup->clear_io_region();
      setup->clear_io_slots();
      setup->clear_io_bytes();
    }
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
  // A rank on this host gets its shards through shared memory; one elsewhere in its messages.
  std::shared_ptr<RankIo> io;
  if (options_.shared_memory_io && session->hello().host() == host_) {
    Result<std::unique_ptr<RankIo>> created = RankIo::Create(
        session->rank(), RankIoLayout::For(options_.max_tokens_per_rank, options_.hidden,
                                           options_.top_k, RankIo::kSlots));
    if (created.ok()) {
      io = std::move(*created);
    } else {
      spdlog::warn("{}: no shared-memory I/O region ({}); its tensors go inline",
                   session->Describe(), created.status().ToString());
    }
  }
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
    StopResultReader(&slot);
    slot.session = session;
    slot.ready = false;
    slot.io = std::move(io);
    if (slot.io) {
      slot.io_stop = std::make_shared<std::atomic<bool>>(false);
      StartResultReader(session, slot.io, slot.io_stop);
    }
    ++slot.registrations;
    reconfiguring_ = false;
    SetServingLocked(false);
    spdlog::info("{} attached (transport {}, {}){}", session->Describe(), session->transport_name(),
                 slot.io ? "I/O through " + slot.io->name() : std::string("I/O inline"),
                 slot.registrations > 1 ? " after a restart" : "");
    MaybeFinishFailedStepsLocked(&outbox);
    MaybeStartEpochLocked(&outbox);
  }
  cv_.notify_all();
  work_cv_.notify_all();
  Deliver(&outbox);
  NotifyServing();
  return Status::Ok();
}

void Coordinator::FailInFlightLocked(uint64_t generation, Status failure) {
  bool any = false;
  for (auto& [g, step] : in_flight_) {
    // A step with every result in has completed (its leader may be assembling it).
    if (step.failed || step.pending == 0) continue;
    step.failed = true;
    step.Settle();
    step.failure = g == generation
                       ? failure
                       : Unavailable("step " + std::to_string(g) + " was abandoned with step " +
                                     std::to_string(generation) + ": " + failure.message());
    any = true;
  }
  if (!any) return;
  // No step may start until a new epoch has reset the ranks' exchange.
  SetServingLocked(false);
  epoch_wanted_ = true;
  // Set with the failure, under the same lock: the watchdog must never see a failed step with
  // the deadline of an earlier one (it cut a healthy survivor off at once when it did).
  abort_deadline_ = Clock::now() + std::chrono::milliseconds(options_.exchange_timeout_ms + 2000);
}

void Coordinator::MaybeFinishFailedStepsLocked(Outbox* outbox) {
  std::vector<uint64_t> over;
  for (const auto& [g, step] : in_flight_) {
    if (step.failed && step.pending == 0 && step.leader_gone) over.push_back(g);
  }
  for (uint64_t g : over) EndStepLocked(g, outbox);
}

void Coordinator::EndStepLocked(uint64_t generation, Outbox* outbox) {
  in_flight_.erase(generation);
  if (in_flight_.empty() && epoch_wanted_) MaybeStartEpochLocked(outbox);
  WakeNextLeaderLocked();
  cv_.notify_all();  // a drain may be waiting for the steps in flight
}

int Coordinator::PipelineDepthLocked() const {
  const bool all_local =
      std::all_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.io != nullptr; });
  return all_local ? std::min(options_.max_steps_in_flight, RankIo::kSlots) : 1;
}

bool Coordinator::CanLeadLocked(const Call* call) const {
  // Steps end in any order (each leader finishes its own), so a place in the pipeline is not
  // enough: the next step's I/O slot must not be one an older step in flight still reads its
  // outputs from (or its ranks still write to).
  const uint64_t next_slot = (generation_ + 1) % RankIo::kSlots;
  return !sending_ && !pending_.empty() && pending_.front() == call &&
         static_cast<int>(in_flight_.size()) < PipelineDepthLocked() &&
         std::none_of(in_flight_.begin(), in_flight_.end(), [next_slot](const auto& step) {
           return step.first % RankIo::kSlots == next_slot;
         });
}

void Coordinator::WakeNextLeaderLocked() {
  if (!pending_.empty()) pending_.front()->done.notify_one();
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
      if (ready.has_gpu_memory()) slots_[r].gpu_memory = ready.gpu_memory();
      if (!ready.error().empty()) {
        spdlog::error("{} could not connect for epoch {}: {}", session->Describe(), epoch_,
                      ready.error());
        outbox.clear();
        session->Cancel();  // it re-attaches (or is restarted) and a new epoch retries
      } else {
        if (!ready.io_error().empty() && slots_[r].io) {
          // It serves, with its tensors inline (from the next step: none is in flight now).
          spdlog::warn("{} cannot map its I/O region ({}); its tensors go inline",
                       session->Describe(), ready.io_error());
          StopResultReader(&slots_[r]);
          slots_[r].io.reset();
        }
        // A registration this restarted rank could not open again: calls naming it fail, and
        // a registration still being opened learns it.
        for (const internal::RegionOpened& lost : ready.unopened_regions()) {
          if (device_regions_.erase(lost.id()) > 0) {
            spdlog::error("registered GPU memory {} is lost: {} could not open it again: {}",
                          lost.id(), session->Describe(), lost.error());
            lost_regions_[lost.id()] = session->Describe() + ": " + lost.error();
          }
        }
        for (auto& [id, opening] : openings_) {
          if (opening.answered[r]) continue;
          opening.answered[r] = true;
          for (const internal::RegionOpened& lost : ready.unopened_regions()) {
            if (lost.id() == id && opening.failure.ok()) {
              opening.failure = Status(static_cast<StatusCode>(lost.code()), lost.error());
            }
          }
        }
        slots_[r].ready = true;
        if (ReadyCountLocked() == options_.world_size) {
          epoch_pending_ = false;
          reconfiguring_ = false;
          SetServingLocked(true);
        }
      }
    } else if (message.has_region_opened()) {
      const internal::RegionOpened& opened = message.region_opened();
      auto it = openings_.find(opened.id());
      if (it != openings_.end() && !it->second.answered[r]) {
        it->second.answered[r] = true;
        if (!opened.error().empty() && it->second.failure.ok()) {
          it->second.failure = Status(static_cast<StatusCode>(opened.code()), opened.error());
        }
      }
    } else if (message.has_step_result()) {
      const internal::StepResult& result = message.step_result();
      if (result.has_gpu_memory()) slots_[r].gpu_memory = result.gpu_memory();
      auto it = in_flight_.find(result.generation());
      if (it != in_flight_.end() && !it->second.reported[r]) {
        InFlight& step = it->second;
        step.results[r] = result;
        step.arrived_ns[r] = MonotonicNs();
        step.reported[r] = true;
        --step.pending;
        step.Settle();
        if (result.code() != 0) {
          FailInFlightLocked(result.generation(),
                             Status(static_cast<StatusCode>(result.code()),
                                    session->Describe() + ": " + result.message()));
        }
        MaybeFinishFailedStepsLocked(&outbox);
      }
    }
  }
  cv_.notify_all();
  work_cv_.notify_all();
  Deliver(&outbox);
  NotifyServing();
}

Result<uint64_t> Coordinator::OpenDeviceRegion(internal::DeviceRegion region,
                                               Clock::duration timeout) {
  const int P = options_.world_size;
  Outbox outbox;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!serving_) {
      return Unavailable(
          "cuda_ipc: the service is not serving (its ranks are not all ready); "
          "register again once it is");
    }
    for (int r = 0; r < P; ++r) {
      if (slots_[r].session->hello().host() != host_) {
        return FailedPrecondition("cuda_ipc: rank " + std::to_string(r) + " runs on " +
                                  slots_[r].session->hello().host() +
                                  ", not on the coordinator's host; GPU memory is served only "
                                  "when every rank runs beside the coordinator");
      }
    }
    id = ++last_region_id_;
    region.set_id(id);
    // Listed at once, so that a rank restarting meanwhile opens it with its Setup.
    device_regions_[id] = region;
    openings_[id].answered.assign(P, false);
    internal::CoordinatorMessage message;
    *message.mutable_open_region() = region;
    for (int r = 0; r < P; ++r) outbox.emplace_back(slots_[r].session, message);
  }
  Deliver(&outbox);
  Status failure;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Opening& opening = openings_.at(id);
    const bool all = cv_.wait_for(lock, timeout, [&opening] {
      return std::all_of(opening.answered.begin(), opening.answered.end(),
                         [](bool a) { return a; });
    });
    failure = opening.failure;
    if (!all && failure.ok()) {
      failure = Unavailable(
          "cuda_ipc: not every rank opened the memory within " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
          " ms");
    }
    openings_.erase(id);
    if (failure.ok() && device_regions_.count(id) == 0) {
      failure = Unavailable("cuda_ipc: a rank restarted and could not open the memory: " +
                            lost_regions_[id]);
    }
  }
  if (!failure.ok()) {
    CloseDeviceRegion(id);  // on the ranks that did open it
    return failure;
  }
  return id;
}

void Coordinator::CloseDeviceRegion(uint64_t id) {
  Outbox outbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_regions_.erase(id);
    lost_regions_.erase(id);
    internal::CoordinatorMessage message;
    message.mutable_close_region()->set_id(id);
    for (const Slot& slot : slots_) {
      if (slot.session) outbox.emplace_back(slot.session, message);
    }
  }
  Deliver(&outbox);
}

void Coordinator::Unregister(const std::shared_ptr<RankSession>& session) {
  Outbox outbox;
  const int r = session->rank();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[r].session == session) {
      slots_[r].session.reset();
      slots_[r].ready = false;
      slots_[r].gpu_memory.reset();
      StopResultReader(&slots_[r]);
      slots_[r].io.reset();  // a step still using it holds its own reference
      reconfiguring_ = false;
      spdlog::warn("{} disconnected", session->Describe());
      SetServingLocked(false);
      // Every step in flight loses this rank's result; the oldest it owed names the failure.
      uint64_t first_owed = 0;
      for (auto& [g, step] : in_flight_) {
        if (step.reported[r]) continue;
        step.reported[r] = true;
        --step.pending;
        step.Settle();
        if (first_owed == 0) first_owed = g;
      }
      if (first_owed != 0) {
        FailInFlightLocked(first_owed,
                           Unavailable(session->Describe() + " disconnected during step " +
                                       std::to_string(first_owed)));
      }
      MaybeFinishFailedStepsLocked(&outbox);
    }
  }
  cv_.notify_all();
  work_cv_.notify_all();
  Deliver(&outbox);
  NotifyServing();
}

Status Coordinator::Forward(const gcmoe::v1::ForwardRequest& request,
                            const ValidatedForward& validated, Clock::time_point deadline,
                            const std::function<bool()>& cancelled,
                            gcmoe::v1::ForwardResponse* response) {
  Call call;
  call.request = &request;
  call.validated = &validated;
  call.response = response;
  call.arrived = Clock::now();
  call.deadline = deadline;
  std::unique_lock<std::mutex> lock(mu_);
  if (draining_) return Unavailable("the service is shutting down");
  if (static_cast<int>(pending_.size()) >= options_.max_queue) {
    return ResourceExhausted("the request queue is full (" + std::to_string(pending_.size()) +
                             " calls waiting; server.max_queue)");
  }
  pending_.push_back(&call);
  work_cv_.notify_all();  // a leader waiting out the batch window takes it in
  // Synchronous gRPC has no cancellation callback, so a waiting call looks at its own
  // cancellation now and then; nothing else wakes it but its own answer or its turn to lead.
  constexpr auto kCancelPoll = std::chrono::milliseconds(100);
  for (;;) {
    if (call.state == Call::State::kDone) return call.status;
    if (call.state == Call::State::kRunning) {
      // In a step, which reads the request: the call waits for its end (bounded by
      // server.step_timeout_ms), whatever its deadline.
      call.done.wait(lock, [&call] { return call.state == Call::State::kDone; });
      continue;
    }
    if (CanLeadLocked(&call)) {
      LeadStepLocked(lock, &call);
      continue;
    }
    call.done.wait_until(lock, std::min(deadline, Clock::now() + kCancelPoll));
    if (call.state != Call::State::kWaiting || CanLeadLocked(&call)) continue;
    const bool expired = Clock::now() >= deadline;
    if (expired || cancelled()) {
      pending_.erase(std::find(pending_.begin(), pending_.end(), &call));
      WakeNextLeaderLocked();
      cv_.notify_all();  // a drain may be waiting for the queue to empty
      if (expired) {
        return DeadlineExceeded("the deadline passed while the call waited for earlier steps");
      }
      return Aborted("the call was cancelled while it waited for earlier steps");
    }
  }
}

std::vector<Coordinator::Call*> Coordinator::TakeBatchLocked() {
  std::vector<Call*> batch;
  Call* first = pending_.front();
  const int max_tokens = options_.world_size * options_.max_tokens_per_rank;
  int tokens = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Call* call = *it;
    // The oldest call always runs; the others join it when they can merge with it.
    const bool fits = call == first || (static_cast<int>(batch.size()) < options_.max_batch_calls &&
                                        tokens + call->validated->num_tokens <= max_tokens &&
                                        Mergeable(*first->request, *first->validated,
                                                  *call->request, *call->validated));
    if (!fits) {
      ++it;
      continue;
    }
    tokens += call->validated->num_tokens;
    call->state = Call::State::kRunning;
    batch.push_back(call);
    it = pending_.erase(it);
  }
  return batch;
}

void Coordinator::LeadStepLocked(std::unique_lock<std::mutex>& lock, Call* self) {
  sending_ = true;
  // A planned new epoch (a refitted placement) is waited out, not failed.
  while (reconfiguring_ && !serving_ && Clock::now() < self->deadline) {
    work_cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  if (options_.batch_window.count() > 0) {
    // Give calls arriving within the window a place in this step.
    work_cv_.wait_until(lock, self->arrived + options_.batch_window, [this] {
      return static_cast<int>(pending_.size()) >= options_.max_batch_calls;
    });
  }
  std::vector<Call*> batch = TakeBatchLocked();  // `self` is the oldest: it is in the batch
  // A call whose deadline passed while it waited is answered so, not run; so is one whose GPU
  // memory a restarted rank could not reopen.
  const auto now = Clock::now();
  std::vector<Call*> live;
  for (Call* call : batch) {
    call->status = now >= call->deadline
                       ? DeadlineExceeded(
                             "the deadline passed while the call waited for earlier "
                             "steps")
                       : DeviceMemoryOpenLocked(*call->validated);
    if (call->status.ok()) {
      live.push_back(call);
    } else {
      call->state = Call::State::kDone;
      call->done.notify_one();
    }
  }
  // Calls admitted before a drain began still run: draining refuses only new admissions.
  Status status;
  if (!serving_ || live.empty()) {
    if (!live.empty()) status = NotServingLocked();
    sending_ = false;
  } else {
    lock.unlock();
    Result<SentStep> sent = SendStep(live);
    lock.lock();
    // The next oldest call may lead the next step while this one runs.
    sending_ = false;
    WakeNextLeaderLocked();
    if (sent.ok()) {
      lock.unlock();
      PrepareOutputs(live, options_.hidden);  // while the ranks run the step
      status = FinishStep(live, *sent);
      lock.lock();
    } else {
      status = sent.status();
    }
  }
  for (Call* call : live) {
    if (!status.ok()) call->status = status;  // else its own (FinishStep), OK unless refused
    call->state = Call::State::kDone;
    call->done.notify_one();
  }
  cv_.notify_all();  // a drain may be waiting for the step
  WakeNextLeaderLocked();
}

Status Coordinator::DeviceMemoryOpenLocked(const ValidatedForward& validated) const {
  const ForwardBytes& b = validated.bytes;
  for (const auto& [field, device] :
       {std::pair{"hidden.region", b.hidden_device}, std::pair{"output_region", b.output_device}}) {
    if (device.region == 0 || device_regions_.count(device.region) > 0) continue;
    const auto lost = lost_regions_.find(device.region);
    return FailedPrecondition(std::string(field) +
                              ": the registered GPU memory is no longer open on every rank (" +
                              (lost == lost_regions_.end() ? std::string("closed") : lost->second) +
                              "); unregister it and register it again");
  }
  return Status::Ok();
}

Status Coordinator::NotServingLocked() const {
  return Unavailable(std::to_string(ReadyCountLocked()) + " of " +
                     std::to_string(options_.world_size) +
                     " rank(s) ready; the service is not serving");
}

void Coordinator::WatchdogLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    if (Clock::now() < abort_deadline_) continue;
    // Ranks that neither reported nor disconnected after an abort are stuck: cut them off so
    // they re-attach (or are restarted) and a new epoch can start.
    std::vector<bool> cut(options_.world_size, false);
    for (const auto& [g, step] : in_flight_) {
      if (!step.failed || step.pending == 0) continue;
      for (int r = 0; r < options_.world_size; ++r) {
        if (step.reported[r] || !slots_[r].session || cut[r]) continue;
        spdlog::error("{} did not leave aborted step {}; disconnecting it",
                      slots_[r].session->Describe(), g);
        slots_[r].session->Cancel();
        cut[r] = true;
      }
    }
    if (std::find(cut.begin(), cut.end(), true) != cut.end()) {
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
    if (slots_[r].gpu_memory) *rank->mutable_gpu_memory() = *slots_[r].gpu_memory;
  }
}

void Coordinator::Drain(Clock::duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  spdlog::info("draining: refusing new calls, finishing {} admitted and {} step(s) in flight",
               pending_.size(), in_flight_.size());
  const auto deadline = Clock::now() + timeout;
  cv_.wait_until(lock, deadline,
                 [this] { return pending_.empty() && !sending_ && in_flight_.empty(); });
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
