#include "server/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "engine/nccl_comm.h"

namespace gcmoe::server {
namespace {

namespace internal = gcmoe::internal::v1;

int64_t Nanos(Coordinator::Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// The host's monotonic clock, as the ranks stamp their StepResults with it.
int64_t MonotonicNs() { return Nanos(Coordinator::Clock::now().time_since_epoch()); }

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// The bytes of one row of each tensor a shard carries.
struct RowBytes {
  size_t hidden = 0;
  size_t scales = 0;  // FP8 hidden only
  size_t ids = 0;
  size_t weights = 0;
};

RowBytes RowBytesOf(const ValidatedForward& validated, int hidden, int top_k) {
  RowBytes b;
  b.hidden = static_cast<size_t>(hidden) * engine::DTypeBytes(validated.hidden_dtype);
  b.scales = validated.hidden_dtype == engine::DType::kFP8E4M3 ? hidden / 32 : 0;
  b.ids = static_cast<size_t>(top_k) * sizeof(int32_t);
  b.weights = static_cast<size_t>(top_k) * sizeof(float);
  return b;
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
      if (!io->Wait(RankIo::kToCoordinator, &seen, std::chrono::milliseconds(100), &bytes)) {
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
      spdlog::error("epoch {}: no NCCL unique id for the ranks: {}", epoch_,
                    id.status().ToString());
    }
  }
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

Status Coordinator::Register(const std::shared_ptr<RankSession>& session) {
  const internal::Hello& hello = session->hello();
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
  if (hello.config_digest() != options_.config_digest) {
    return FailedPrecondition("rank " + std::to_string(hello.rank()) + "'s configuration (" +
                              hello.config_digest() + ") differs from the coordinator's (" +
                              options_.config_digest +
                              "): model, parallel, engine and balancer sections must match");
  }
  // A rank on this host gets its shards through shared memory; one elsewhere in its messages.
  std::shared_ptr<RankIo> io;
  if (options_.shared_memory_io && hello.host() == host_) {
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
  std::shared_ptr<RankSession> replaced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return Unavailable("the coordinator is shutting down");
    Slot& slot = slots_[session->rank()];
    if (slot.session) {
      // The process this replaces may be gone without its stream having noticed yet.
      replaced = slot.session;
      spdlog::warn("{} replaces {}", session->Describe(), replaced->Describe());
      if (in_flight_.active && !in_flight_.reported[session->rank()]) {
        in_flight_.reported[session->rank()] = true;
        --in_flight_.pending;
        FailInFlightLocked(Unavailable(replaced->Describe() + " was replaced during step " +
                                       std::to_string(in_flight_.generation)));
      }
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
    MaybeFinishFailedStepLocked(&outbox);
    MaybeStartEpochLocked(&outbox);
  }
  cv_.notify_all();
  work_cv_.notify_all();
  if (replaced) replaced->Cancel();
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
    if (slots_[r].session != session) return;  // a replaced session's late words
    if (message.has_ready()) {
      const internal::Ready& ready = message.ready();
      if (ready.epoch() != epoch_) return;
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
        in_flight_.arrived_ns[r] = MonotonicNs();
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
  work_cv_.notify_all();
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
      StopResultReader(&slots_[r]);
      slots_[r].io.reset();  // a step still using it holds its own reference
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
    if (!stepping_ && pending_.front() == &call) {
      LeadStepLocked(lock, &call);
      continue;
    }
    call.done.wait_until(lock, std::min(deadline, Clock::now() + kCancelPoll));
    if (call.state != Call::State::kWaiting || (!stepping_ && pending_.front() == &call)) continue;
    const bool expired = Clock::now() >= deadline;
    if (expired || cancelled()) {
      pending_.erase(std::find(pending_.begin(), pending_.end(), &call));
      if (!stepping_ && !pending_.empty()) pending_.front()->done.notify_one();
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
    const bool fits =
        static_cast<int>(batch.size()) < options_.max_batch_calls &&
        tokens + call->validated->num_tokens <= max_tokens &&
        Mergeable(*first->request, *first->validated, *call->request, *call->validated);
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
  stepping_ = true;
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
  // A call whose deadline passed while it waited is answered so, not run.
  const auto now = Clock::now();
  std::vector<Call*> live;
  for (Call* call : batch) {
    if (now >= call->deadline) {
      call->status =
          DeadlineExceeded("the deadline passed while the call waited for earlier steps");
      call->state = Call::State::kDone;
      call->done.notify_one();
    } else {
      live.push_back(call);
    }
  }
  // Calls admitted before a drain began still run: draining refuses only new admissions.
  Status status;
  if (!serving_) {
    status = Unavailable(std::to_string(ReadyCountLocked()) + " of " +
                         std::to_string(options_.world_size) +
                         " rank(s) ready; the service is not serving");
  } else if (!live.empty()) {
    lock.unlock();
    status = RunStep(live);
    lock.lock();
  }
  for (Call* call : live) {
    call->status = status;
    call->state = Call::State::kDone;
    call->done.notify_one();
  }
  stepping_ = false;
  cv_.notify_all();  // a drain may be waiting for the step
  // The next oldest call leads the next step.
  if (!pending_.empty()) pending_.front()->done.notify_one();
}

void Coordinator::WriteShard(const std::vector<Call*>& calls, const std::vector<Piece>& pieces,
                             RankIo* io, int io_slot, internal::Step* step) {
  const ValidatedForward& v = *calls.front()->validated;
  const gcmoe::v1::ForwardRequest& first = *calls.front()->request;
  const int H = static_cast<int>(first.hidden().shape(1));
  const int k = static_cast<int>(first.topk_ids().shape(1));
  const RowBytes rb = RowBytesOf(v, H, k);
  int64_t rows = 0;
  for (const Piece& p : pieces) rows = std::max(rows, p.shard_row + p.rows);
  const bool fp8 = rb.scales > 0;
  // Tensors carry dtype and shape; their bytes go to the RankIo slot when there is one.
  auto describe = [rows](gcmoe::v1::Tensor* t, gcmoe::v1::DType dtype, int64_t cols) {
    t->set_dtype(dtype);
    t->add_shape(rows);
    t->add_shape(cols);
  };
  describe(step->mutable_hidden(), first.hidden().dtype(), H);
  if (fp8) describe(step->mutable_hidden_scales(), gcmoe::v1::UE8M0, H / 32);
  describe(step->mutable_topk_ids(), gcmoe::v1::INT32, k);
  describe(step->mutable_topk_weights(), gcmoe::v1::FP32, k);
  uint8_t* dst_hidden;
  uint8_t* dst_scales = nullptr;
  uint8_t* dst_ids;
  uint8_t* dst_weights;
  if (io != nullptr) {
    step->set_io(true);
    step->set_io_slot(static_cast<uint32_t>(io_slot));
    dst_hidden = io->hidden(io_slot);
    dst_scales = io->scales(io_slot);
    dst_ids = io->ids(io_slot);
    dst_weights = io->weights(io_slot);
  } else {
    auto sized = [rows](gcmoe::v1::Tensor* t, size_t row_bytes) {
      std::string* data = t->mutable_data();
      data->resize(static_cast<size_t>(rows) * row_bytes);
      return reinterpret_cast<uint8_t*>(data->data());
    };
    dst_hidden = sized(step->mutable_hidden(), rb.hidden);
    if (fp8) dst_scales = sized(step->mutable_hidden_scales(), rb.scales);
    dst_ids = sized(step->mutable_topk_ids(), rb.ids);
    dst_weights = sized(step->mutable_topk_weights(), rb.weights);
  }
  for (const Piece& p : pieces) {
    const gcmoe::v1::ForwardRequest& r = *calls[p.call]->request;
    auto copy = [&p](uint8_t* dst, const std::string& src, size_t row_bytes) {
      std::memcpy(dst + p.shard_row * row_bytes, src.data() + p.call_row * row_bytes,
                  p.rows * row_bytes);
    };
    copy(dst_hidden, r.hidden().data(), rb.hidden);
    if (fp8) copy(dst_scales, r.hidden_scales().data(), rb.scales);
    copy(dst_ids, r.topk_ids().data(), rb.ids);
    copy(dst_weights, r.topk_weights().data(), rb.weights);
  }
}

Status Coordinator::AssembleOutputs(const std::vector<Call*>& calls,
                                    const std::vector<std::vector<Piece>>& pieces,
                                    const std::vector<std::shared_ptr<RankIo>>& ios, int io_slot,
                                    const std::vector<internal::StepResult>& results,
                                    uint64_t generation) {
  const bool fp32 = calls.front()->validated->output_fp32;
  const size_t row_bytes = static_cast<size_t>(options_.hidden) * (fp32 ? 4 : 2);
  std::vector<uint8_t*> outputs(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    gcmoe::v1::Tensor* output = calls[i]->response->mutable_output();
    output->set_dtype(fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    output->add_shape(calls[i]->validated->num_tokens);
    output->add_shape(options_.hidden);
    std::string* data = output->mutable_data();
    data->resize(static_cast<size_t>(calls[i]->validated->num_tokens) * row_bytes);
    outputs[i] = reinterpret_cast<uint8_t*>(data->data());
  }
  for (size_t r = 0; r < pieces.size(); ++r) {
    const uint8_t* src;
    if (ios[r]) {
      src = ios[r]->output(io_slot);
    } else {
      int64_t rows = 0;
      for (const Piece& p : pieces[r]) rows += p.rows;
      const std::string& data = results[r].output().data();
      if (data.size() != static_cast<size_t>(rows) * row_bytes) {
        return Internal("step " + std::to_string(generation) + ": rank " + std::to_string(r) +
                        " returned " + std::to_string(data.size()) + " output bytes, expected " +
                        std::to_string(rows * row_bytes));
      }
      src = reinterpret_cast<const uint8_t*>(data.data());
    }
    for (const Piece& p : pieces[r]) {
      std::memcpy(outputs[p.call] + p.call_row * row_bytes, src + p.shard_row * row_bytes,
                  p.rows * row_bytes);
    }
  }
  return Status::Ok();
}

Status Coordinator::RunStep(const std::vector<Call*>& calls) {
  const int P = options_.world_size;
  const int E = options_.experts;
  const auto step_start = Clock::now();
  // The step's tokens are the calls' tokens in order, split into P contiguous shards.
  int total = 0;
  for (const Call* c : calls) total += c->validated->num_tokens;
  const std::vector<int> tokens_per_rank =
      calls.size() == 1 ? calls.front()->validated->tokens_per_rank : ShardSizes(total, P);
  std::vector<std::vector<Piece>> pieces(P);
  {
    int r = 0;
    int64_t shard_begin = 0;
    int64_t global = 0;
    for (int i = 0; i < static_cast<int>(calls.size()); ++i) {
      const int64_t n = calls[i]->validated->num_tokens;
      int64_t row = 0;
      while (row < n) {
        while (global >= shard_begin + tokens_per_rank[r]) shard_begin += tokens_per_rank[r++];
        const int64_t take = std::min(n - row, shard_begin + tokens_per_rank[r] - global);
        pieces[r].push_back(Piece{i, row, global - shard_begin, take});
        row += take;
        global += take;
      }
    }
  }
  // C[src][expert] of the merged step (a call alone brings its own from validation).
  std::vector<int64_t> merged_counts;
  if (calls.size() > 1) {
    merged_counts.assign(static_cast<size_t>(P) * E, 0);
    for (int r = 0; r < P; ++r) {
      for (const Piece& p : pieces[r]) {
        const gcmoe::v1::Tensor& ids = calls[p.call]->request->topk_ids();
        const int k = static_cast<int>(ids.shape(1));
        const auto* data = reinterpret_cast<const int32_t*>(ids.data().data());
        for (int64_t t = p.call_row; t < p.call_row + p.rows; ++t) {
          for (int j = 0; j < k; ++j) {
            int32_t e;
            std::memcpy(&e, data + t * k + j, sizeof(e));
            if (e >= 0) ++merged_counts[static_cast<size_t>(r) * E + e];
          }
        }
      }
    }
  }
  const std::vector<int64_t>& counts =
      calls.size() == 1 ? calls.front()->validated->counts : merged_counts;

  std::vector<std::shared_ptr<RankSession>> sessions(P);
  std::vector<std::shared_ptr<RankIo>> ios(P);
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
    in_flight_.arrived_ns.assign(P, 0);
    for (int r = 0; r < P; ++r) {
      sessions[r] = slots_[r].session;
      ios[r] = slots_[r].io;
    }
  }
  const int io_slot = static_cast<int>(generation % RankIo::kSlots);
  const gcmoe::v1::ForwardRequest& first = *calls.front()->request;
  const bool output_fp32 = calls.front()->validated->output_fp32;
  for (int r = 0; r < P; ++r) {
    internal::CoordinatorMessage message;
    internal::Step* step = message.mutable_step();
    step->set_generation(generation);
    step->set_epoch(epoch);
    step->set_layer(first.layer());
    WriteShard(calls, pieces[r], ios[r].get(), io_slot, step);
    step->set_output_dtype(output_fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    for (int t : tokens_per_rank) step->add_tokens_per_rank(static_cast<uint32_t>(t));
    step->mutable_counts()->Assign(counts.begin(), counts.end());
    step->set_request_id(first.request_id());
    step->set_relief_passes(static_cast<uint32_t>(passes));
    step->set_placement_version(placement_version);
    // A rank with a region gets the step through its doorbell, else on its control stream.
    const bool posted =
        sessions[r] && ios[r] && ios[r]->Post(RankIo::kToRank, message.step().SerializeAsString());
    if (!posted && (!sessions[r] || !sessions[r]->Send(message))) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!in_flight_.reported[r]) {
        in_flight_.reported[r] = true;
        --in_flight_.pending;
      }
      FailInFlightLocked(Unavailable("rank " + std::to_string(r) + "'s control stream is closed"));
    }
  }
  const int64_t sent_ns = Nanos(step_start.time_since_epoch());

  std::unique_lock<std::mutex> lock(mu_);
  const auto step_deadline = Clock::now() + std::chrono::milliseconds(options_.step_timeout_ms);
  cv_.wait_until(lock, step_deadline,
                 [this] { return in_flight_.pending == 0 || in_flight_.failed; });
  if (!in_flight_.failed && in_flight_.pending > 0) {
    std::string missing;
    for (int r = 0; r < P; ++r) {
      if (!in_flight_.reported[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    FailInFlightLocked(Unavailable("step " + std::to_string(generation) + ": rank(s) " + missing +
                                   " did not answer within " +
                                   std::to_string(options_.step_timeout_ms) + " ms"));
  }
  if (in_flight_.failed) {
    const Status failure = in_flight_.failure;
    // The step is over for the callers; the ranks still in it are told to give up, and the
    // bookkeeping (a new epoch) finishes once they have all reported or been cut off.
    abort_deadline_ = Clock::now() + std::chrono::milliseconds(options_.exchange_timeout_ms + 2000);
    SetServingLocked(false);
    std::vector<std::shared_ptr<RankSession>> survivors;
    for (int r = 0; r < P; ++r) {
      if (!in_flight_.reported[r] && sessions[r]) survivors.push_back(sessions[r]);
    }
    Outbox outbox;
    MaybeFinishFailedStepLocked(&outbox);
    lock.unlock();
    spdlog::warn("step {} ({} call(s)) failed: {}", generation, calls.size(), failure.ToString());
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

  // Success: each call's output from the ranks' shards, and the stats.
  const std::vector<internal::StepResult> results = std::move(in_flight_.results);
  const std::vector<int64_t> arrived_ns = std::move(in_flight_.arrived_ns);
  in_flight_.active = false;
  int64_t slowest_ns = 0;
  for (const internal::StepResult& r : results) slowest_ns = std::max(slowest_ns, r.engine_ns());
  std::vector<int64_t> expert_tokens(E, 0);
  for (size_t i = 0; i < counts.size(); ++i) expert_tokens[i % E] += counts[i];
  Outbox outbox;
  if (planner_->Observe(expert_tokens, slowest_ns)) {
    // The ranks load the new placement's weights in a new epoch; calls wait meanwhile.
    reconfiguring_ = true;
    serving_ = false;
    MaybeStartEpochLocked(&outbox);
  }
  lock.unlock();
  Deliver(&outbox);

  for (int r = 1; r < P; ++r) {
    if (results[r].load_after().size() != results[0].load_after().size() ||
        !std::equal(results[r].load_after().begin(), results[r].load_after().end(),
                    results[0].load_after().begin())) {
      spdlog::error("step {}: rank {} computed another split than rank 0", generation, r);
      return Internal("step " + std::to_string(generation) + ": ranks disagree on the split");
    }
  }
  const auto assemble_start = Clock::now();
  GCMOE_RETURN_IF_ERROR(AssembleOutputs(calls, pieces, ios, io_slot, results, generation));
  const auto assembled = Clock::now();

  // Stages: the per-rank ones are the largest over ranks. The ranks' stamps share this host's
  // monotonic clock only when they run here; for others the transfer stages stay 0.
  gcmoe::v1::ForwardStats step_stats;
  int64_t engine_ns = 0;
  for (int r = 0; r < P; ++r) {
    const internal::StepResult& result = results[r];
    engine_ns = std::max(engine_ns, result.engine_ns());
    step_stats.set_host_ns(std::max(step_stats.host_ns(), result.host_ns()));
    step_stats.set_h2d_ns(std::max(step_stats.h2d_ns(), result.h2d_ns()));
    step_stats.set_device_ns(std::max(step_stats.device_ns(), result.device_ns()));
    step_stats.set_d2h_ns(std::max(step_stats.d2h_ns(), result.d2h_ns()));
    if (sessions[r] && sessions[r]->hello().host() == host_) {
      step_stats.set_to_ranks_ns(
          std::max(step_stats.to_ranks_ns(), result.received_ns() - sent_ns));
      step_stats.set_from_ranks_ns(
          std::max(step_stats.from_ranks_ns(), arrived_ns[r] - result.replied_ns()));
    }
    gcmoe::v1::RankStepStats* rank = step_stats.add_ranks();
    rank->set_rank(r);
    rank->set_tokens(tokens_per_rank[r]);
    rank->set_assignments_computed(result.assignments_computed());
    rank->set_engine_ns(result.engine_ns());
    rank->set_host_ns(result.host_ns());
    rank->set_h2d_ns(result.h2d_ns());
    rank->set_device_ns(result.device_ns());
    rank->set_d2h_ns(result.d2h_ns());
  }
  const internal::StepResult& r0 = results[0];
  step_stats.mutable_load_before()->Assign(r0.load_before().begin(), r0.load_before().end());
  step_stats.mutable_load_after()->Assign(r0.load_after().begin(), r0.load_after().end());
  step_stats.set_relief_passes(r0.relief_passes());
  step_stats.set_relief_solve_ns(r0.relief_solve_ns());
  step_stats.set_engine_ns(engine_ns);
  step_stats.set_balancer_enabled(options_.balancer_enabled);
  step_stats.set_assemble_ns(Nanos(assembled - assemble_start));
  step_stats.set_batched_calls(static_cast<uint32_t>(calls.size()));
  step_stats.set_shared_memory_io(
      std::all_of(ios.begin(), ios.end(), [](const auto& io) { return io != nullptr; }));

  StepRecord record;
  record.engine_ns = engine_ns;
  record.load_before.assign(r0.load_before().begin(), r0.load_before().end());
  record.load_after.assign(r0.load_after().begin(), r0.load_after().end());
  record.passes = static_cast<int>(r0.relief_passes());
  record.solve_ns = r0.relief_solve_ns();
  for (const internal::StepResult& result : results) {
    record.rank_engine_ns.push_back(result.engine_ns());
  }
  const auto end = Clock::now();
  for (Call* call : calls) {
    gcmoe::v1::ForwardStats* stats = call->response->mutable_stats();
    *stats = step_stats;
    stats->set_queue_ns(Nanos(step_start - call->arrived));
    stats->set_total_ns(Nanos(end - call->arrived));
    record.total_ns = stats->total_ns();
    record.tokens = call->validated->num_tokens;
    stats_->RecordSuccess(record);
  }
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
  spdlog::info("draining: refusing new calls, finishing {} admitted",
               pending_.size() + (stepping_ ? 1 : 0));
  const auto deadline = Clock::now() + timeout;
  cv_.wait_until(lock, deadline,
                 [this] { return pending_.empty() && !stepping_ && !in_flight_.active; });
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
