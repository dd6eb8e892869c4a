// The coordinator's step execution: one step for a batch of calls, from each rank's shard to
// each caller's response (server/coordinator.h has the protocol; coordinator.cc membership and
// admission).
#include <algorithm>
#include <atomic>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/spin_wait.h"
#include "server/coordinator.h"

namespace gcmoe::server {
namespace {

namespace internal = gcmoe::internal::v1;

int64_t Nanos(Coordinator::Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
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

}  // namespace

void Coordinator::WriteShard(const std::vector<Call*>& calls, const std::vector<Piece>& pieces,
                             RankIo* io, int io_slot, internal::Step* step,
                             std::vector<ByteCopy>* copies) const {
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
    // No activations travel when every row's are in GPU memory.
    const bool device_hidden = std::all_of(pieces.begin(), pieces.end(), [&calls](const Piece& p) {
      return calls[p.call]->validated->bytes.hidden_device.region != 0;
    });
    dst_hidden = device_hidden ? nullptr : sized(step->mutable_hidden(), rb.hidden);
    if (fp8) dst_scales = sized(step->mutable_hidden_scales(), rb.scales);
    dst_ids = sized(step->mutable_topk_ids(), rb.ids);
    dst_weights = sized(step->mutable_topk_weights(), rb.weights);
  }
  // The rank's GPU uploads the activations straight from its region; its CPU reads the rest.
  const Stores uploaded =
      io != nullptr && options_.rank_io_uploaded ? Stores::kStreaming : Stores::kCached;
  // From each call's validated bytes (its message's, or a registered region's) straight into
  // the slot or the message (by the caller, which runs every rank's copies together).
  for (const Piece& p : pieces) {
    const ForwardBytes& b = calls[p.call]->validated->bytes;
    auto copy = [&p, copies](uint8_t* dst, const TensorBytes& src, size_t row_bytes,
                             Stores stores = Stores::kCached) {
      copies->push_back(ByteCopy{dst + p.shard_row * row_bytes, src.data + p.call_row * row_bytes,
                                 p.rows * row_bytes, stores});
    };
    // GPU memory: the rank reads and writes the piece's rows there.
    auto span = [&p](internal::DeviceSpan* span, const DeviceBytes& device, size_t row_bytes) {
      span->set_region(device.region);
      span->set_offset(device.offset + p.call_row * row_bytes);
      span->set_byte_size(p.rows * row_bytes);
    };
    if (b.on_device()) {
      internal::DeviceRows* rows = step->add_device_rows();
      rows->set_shard_row(static_cast<uint64_t>(p.shard_row));
      rows->set_rows(static_cast<uint64_t>(p.rows));
      rows->set_call_row(static_cast<uint64_t>(p.call_row));
      if (b.hidden_device.region != 0) span(rows->mutable_hidden(), b.hidden_device, rb.hidden);
      if (b.output_device.region != 0) {
        span(rows->mutable_output(), b.output_device,
             static_cast<size_t>(H) * (calls[p.call]->validated->output_fp32 ? 4 : 2));
      }
    }
    if (b.hidden_device.region == 0) copy(dst_hidden, b.hidden, rb.hidden, uploaded);
    if (fp8) copy(dst_scales, b.hidden_scales, rb.scales, uploaded);
    copy(dst_ids, b.topk_ids, rb.ids);
    copy(dst_weights, b.topk_weights, rb.weights);
  }
}

void Coordinator::PrepareOutputs(const std::vector<Call*>& calls, int hidden) {
  const bool fp32 = calls.front()->validated->output_fp32;
  const size_t row_bytes = static_cast<size_t>(hidden) * (fp32 ? 4 : 2);
  for (Call* call : calls) {
    gcmoe::v1::Tensor* output = call->response->mutable_output();
    output->set_dtype(fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    output->add_shape(call->validated->num_tokens);
    output->add_shape(hidden);
    const ForwardBytes& b = call->validated->bytes;
    if (b.output != nullptr || b.output_device.region != 0) continue;  // not in the response
    output->mutable_data()->resize(static_cast<size_t>(call->validated->num_tokens) * row_bytes);
  }
}

Status Coordinator::AssembleOutputs(const std::vector<Call*>& calls,
                                    const std::vector<std::vector<Piece>>& pieces,
                                    const std::vector<std::shared_ptr<RankIo>>& ios, int io_slot,
                                    const std::vector<internal::StepResult>& results,
                                    uint64_t generation) {
  const bool fp32 = calls.front()->validated->output_fp32;
  const gcmoe::v1::DType dtype = fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16;
  const size_t row_bytes = static_cast<size_t>(options_.hidden) * (fp32 ? 4 : 2);
  // Each call's rows go to its output region (validated to hold exactly [T, H]) or into its
  // response (sized by PrepareOutputs).
  std::vector<uint8_t*> outputs(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    const ForwardBytes& b = calls[i]->validated->bytes;
    if (b.output != nullptr) {
      outputs[i] = b.output;
    } else if (b.output_device.region == 0) {  // else the ranks wrote it
      outputs[i] =
          reinterpret_cast<uint8_t*>(calls[i]->response->mutable_output()->mutable_data()->data());
    }
  }
  std::vector<ByteCopy> copies;
  std::vector<int> copy_call;  // [copies] the call each copy writes
  for (size_t r = 0; r < pieces.size(); ++r) {
    // A rank whose rows all went to GPU memory sent none back.
    if (std::none_of(pieces[r].begin(), pieces[r].end(),
                     [&outputs](const Piece& p) { return outputs[p.call] != nullptr; })) {
      continue;
    }
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
      if (outputs[p.call] == nullptr) continue;
      copies.push_back(ByteCopy{outputs[p.call] + p.call_row * row_bytes,
                                src + p.shard_row * row_bytes, p.rows * row_bytes});
      copy_call.push_back(p.call);
    }
  }
  // Each piece is checked as it is copied, while its bytes are in cache; a call with a bad value
  // is scanned again in order to name its first one.
  std::vector<std::atomic<bool>> overflowed(calls.size());  // false
  RunCopies(options_.copy_pool, copies, fp32 ? 4 : 2,
            [&](size_t copy, const uint8_t* dst, size_t bytes) {
              if (!OutputFinite(dtype, dst, bytes)) {
                overflowed[copy_call[copy]].store(true, std::memory_order_relaxed);
              }
            });
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!overflowed[i].load() || !calls[i]->status.ok()) continue;
    calls[i]->status = ValidateForwardOutput(
        dtype, outputs[i], static_cast<size_t>(calls[i]->validated->num_tokens) * row_bytes,
        options_.hidden);
  }
  return Status::Ok();
}

Result<Coordinator::SentStep> Coordinator::SendStep(const std::vector<Call*>& calls) {
  const int P = options_.world_size;
  const int E = options_.experts;
  SentStep sent;
  sent.start = Clock::now();
  // The step's tokens are the calls' tokens in order, split into P contiguous shards.
  int total = 0;
  for (const Call* c : calls) total += c->validated->num_tokens;
  sent.tokens_per_rank =
      calls.size() == 1 ? calls.front()->validated->tokens_per_rank : ShardSizes(total, P);
  const std::vector<int>& tokens_per_rank = sent.tokens_per_rank;
  std::vector<std::vector<Piece>>& pieces = sent.pieces;
  pieces.resize(P);
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
  if (calls.size() > 1) {
    sent.counts.assign(static_cast<size_t>(P) * E, 0);
    for (int r = 0; r < P; ++r) {
      for (const Piece& p : pieces[r]) {
        // The validated ids: a region's were copied out before validation
        // (server/forward_regions.h), so every one is in range.
        const int k = static_cast<int>(calls[p.call]->request->topk_ids().shape(1));
        const uint8_t* data = calls[p.call]->validated->bytes.topk_ids.data;
        for (int64_t t = p.call_row; t < p.call_row + p.rows; ++t) {
          for (int j = 0; j < k; ++j) {
            int32_t e;
            std::memcpy(&e, data + sizeof(e) * (t * k + j), sizeof(e));
            if (e >= 0) ++sent.counts[static_cast<size_t>(r) * E + e];
          }
        }
      }
    }
  } else {
    sent.counts = calls.front()->validated->counts;
  }

  sent.sessions.resize(P);
  sent.ios.resize(P);
  uint64_t epoch;
  int passes;
  uint64_t placement_version;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A failure since the leader looked leaves the ranks' exchange to be reset by a new epoch.
    if (!serving_) return NotServingLocked();
    // GPU memory every rank must still hold open (LeadStepLocked took out the calls whose
    // memory was lost before; this is one lost since).
    for (const Call* call : calls) GCMOE_RETURN_IF_ERROR(DeviceMemoryOpenLocked(*call->validated));
    sent.generation = ++generation_;
    epoch = epoch_;
    passes = planner_->passes();
    placement_version = planner_->placement_version();
    InFlight& step = in_flight_[sent.generation];
    step.reported.assign(P, false);
    step.pending = P;
    step.results.resize(P);
    step.arrived_ns.assign(P, 0);
    sent.steps_in_flight = static_cast<int>(in_flight_.size());
    for (int r = 0; r < P; ++r) {
      sent.sessions[r] = slots_[r].session;
      sent.ios[r] = slots_[r].io;
    }
  }
  const uint64_t generation = sent.generation;
  // Steps in flight together use different slots: at most RankIo::kSlots are (PipelineDepth).
  sent.io_slot = static_cast<int>(generation % RankIo::kSlots);
  const gcmoe::v1::ForwardRequest& first = *calls.front()->request;
  const bool output_fp32 = calls.front()->validated->output_fp32;
  std::vector<internal::CoordinatorMessage> messages(P);
  std::vector<ByteCopy> copies;
  bool all_doorbell = true;
  for (int r = 0; r < P; ++r) {
    internal::Step* step = messages[r].mutable_step();
    step->set_generation(generation);
    step->set_epoch(epoch);
    step->set_layer(first.layer());
    WriteShard(calls, pieces[r], sent.ios[r].get(), sent.io_slot, step, &copies);
    step->set_output_dtype(output_fp32 ? gcmoe::v1::FP32 : gcmoe::v1::BF16);
    for (int t : tokens_per_rank) step->add_tokens_per_rank(static_cast<uint32_t>(t));
    step->mutable_counts()->Assign(sent.counts.begin(), sent.counts.end());
    // The rank logs the step under one id: its first call's (server/request_id.h).
    step->set_request_id(calls.front()->validated->request_id);
    step->set_relief_passes(static_cast<uint32_t>(passes));
    step->set_placement_version(placement_version);
    all_doorbell = all_doorbell && sent.ios[r] && sent.sessions[r] &&
                   step->ByteSizeLong() <= RankIoLayout::kMessageBytes;
  }
  RunCopies(options_.copy_pool, copies, 64);
  // A rank reads its doorbell and its control stream on different threads, so a step on one
  // could overtake a step on the other: a step that goes on a control stream, or follows one
  // still in flight, goes once the steps before it are over.
  bool abandoned = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    in_flight_.at(generation).on_stream = !all_doorbell;
    const bool after_stream =
        std::any_of(in_flight_.begin(), in_flight_.find(generation),
                    [](const auto& earlier) { return earlier.second.on_stream; });
    if (!all_doorbell || after_stream) {
      cv_.wait(lock, [this, generation] { return in_flight_.begin()->first == generation; });
      abandoned = in_flight_.at(generation).failed;
    }
  }
  for (int r = 0; r < P; ++r) {
    // A rank with a region gets the step through its doorbell, else on its control stream.
    const bool posted = !abandoned && sent.sessions[r] && sent.ios[r] &&
                        sent.ios[r]->Post(RankIo::kToRank, messages[r].step().SerializeAsString());
    if (!posted && (abandoned || !sent.sessions[r] || !sent.sessions[r]->Send(messages[r]))) {
      std::lock_guard<std::mutex> lock(mu_);
      InFlight& step = in_flight_.at(generation);
      if (!step.reported[r]) {
        step.reported[r] = true;
        --step.pending;
        step.Settle();
      }
      if (!abandoned) {
        FailInFlightLocked(
            generation, Unavailable("rank " + std::to_string(r) + "'s control stream is closed"));
      }
    }
  }
  sent.sent_ns = Nanos(sent.start.time_since_epoch());
  return sent;
}

Status Coordinator::FinishStep(const std::vector<Call*>& calls, const SentStep& sent) {
  const int P = options_.world_size;
  const int E = options_.experts;
  const uint64_t generation = sent.generation;
  const std::vector<std::shared_ptr<RankSession>>& sessions = sent.sessions;
  const std::vector<int64_t>& counts = sent.counts;

  std::unique_lock<std::mutex> lock(mu_);
  // The entry stays until this leader is done with it.
  InFlight& step = in_flight_.at(generation);
  const auto step_deadline = Clock::now() + std::chrono::milliseconds(options_.step_timeout_ms);
  if (!step.settled.load(std::memory_order_acquire)) {
    // A short step's results come within the spin: no wake-up from sleep for them.
    lock.unlock();
    SpinUntil([&step] { return step.settled.load(std::memory_order_acquire); }, options_.spin);
    lock.lock();
  }
  cv_.wait_until(lock, step_deadline, [&step] { return step.pending == 0 || step.failed; });
  if (!step.failed && step.pending > 0) {
    std::string missing;
    for (int r = 0; r < P; ++r) {
      if (!step.reported[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    FailInFlightLocked(generation, Unavailable("step " + std::to_string(generation) + ": rank(s) " +
                                               missing + " did not answer within " +
                                               std::to_string(options_.step_timeout_ms) + " ms"));
  }
  if (step.failed) {
    const Status failure = step.failure;
    // The step is over for the callers; the ranks still in it are told to give up, and the
    // bookkeeping (a new epoch) finishes once they have all reported or been cut off (by the
    // deadline FailInFlightLocked set).
    std::vector<std::shared_ptr<RankSession>> survivors;
    for (int r = 0; r < P; ++r) {
      if (!step.reported[r] && sessions[r]) survivors.push_back(sessions[r]);
    }
    step.leader_gone = true;
    Outbox outbox;
    MaybeFinishFailedStepsLocked(&outbox);  // `step` may be gone from here on
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
  // The InFlight stays until the outputs are read: its I/O slot is not reused before.
  const std::vector<internal::StepResult> results = std::move(step.results);
  const std::vector<int64_t> arrived_ns = std::move(step.arrived_ns);
  int64_t slowest_ns = 0;
  for (const internal::StepResult& r : results) slowest_ns = std::max(slowest_ns, r.engine_ns());
  std::vector<int64_t> expert_tokens(E, 0);
  for (size_t i = 0; i < counts.size(); ++i) expert_tokens[i % E] += counts[i];
  Outbox outbox;
  if (planner_->Observe(expert_tokens, slowest_ns)) {
    // The ranks load the new placement's weights in a new epoch; calls wait meanwhile.
    // (It starts once no step is in flight; no step starts before.)
    reconfiguring_ = true;
    serving_ = false;
    epoch_wanted_ = true;
  }
  lock.unlock();

  Status status = Status::Ok();
  for (int r = 1; r < P && status.ok(); ++r) {
    if (results[r].load_after().size() != results[0].load_after().size() ||
        !std::equal(results[r].load_after().begin(), results[r].load_after().end(),
                    results[0].load_after().begin())) {
      spdlog::error("step {}: rank {} computed another split than rank 0", generation, r);
      status = Internal("step " + std::to_string(generation) + ": ranks disagree on the split");
    }
  }
  const auto assemble_start = Clock::now();
  if (status.ok()) {
    status = AssembleOutputs(calls, sent.pieces, sent.ios, sent.io_slot, results, generation);
  }
  // Values the ranks found bad in GPU memory: their calls' errors, as host bytes would have
  // been; the step itself completed, and the other calls succeed. A call's rows on a lower rank
  // come first in the call, so its first error is the one it gets.
  for (int r = 0; r < P && status.ok(); ++r) {
    if (results[r].value_errors().empty()) continue;
    std::vector<int> range_call;  // Step.device_rows[i]'s call, as WriteShard numbered them
    for (const Piece& p : sent.pieces[r]) {
      if (calls[p.call]->validated->bytes.on_device()) range_call.push_back(p.call);
    }
    for (const internal::ValueError& error : results[r].value_errors()) {
      if (error.range() >= range_call.size()) {
        status =
            Internal("step " + std::to_string(generation) + ": rank " + std::to_string(r) +
                     " reported a value error for GPU-memory range " +
                     std::to_string(error.range()) + " of " + std::to_string(range_call.size()));
        break;
      }
      Call* call = calls[range_call[error.range()]];
      if (call->status.ok()) call->status = InvalidArgument(error.message());
    }
  }
  const auto assembled = Clock::now();
  lock.lock();
  EndStepLocked(generation, &outbox);
  lock.unlock();
  Deliver(&outbox);
  GCMOE_RETURN_IF_ERROR(status);

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
          std::max(step_stats.to_ranks_ns(), result.received_ns() - sent.sent_ns));
      step_stats.set_from_ranks_ns(
          std::max(step_stats.from_ranks_ns(), arrived_ns[r] - result.replied_ns()));
    }
    gcmoe::v1::RankStepStats* rank = step_stats.add_ranks();
    rank->set_rank(r);
    rank->set_tokens(sent.tokens_per_rank[r]);
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
  step_stats.set_steps_in_flight(static_cast<uint32_t>(sent.steps_in_flight));
  step_stats.set_shared_memory_io(
      std::all_of(sent.ios.begin(), sent.ios.end(), [](const auto& io) { return io != nullptr; }));

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
    if (!call->status.ok()) continue;  // refused values: the caller gets no output or stats
    gcmoe::v1::ForwardStats* stats = call->response->mutable_stats();
    *stats = step_stats;
    stats->set_queue_ns(Nanos(sent.start - call->arrived));
    stats->set_total_ns(Nanos(end - call->arrived));
    record.total_ns = stats->total_ns();
    record.tokens = call->validated->num_tokens;
    stats_->RecordSuccess(record);
  }
  return Status::Ok();
}

}  // namespace gcmoe::server
