#include "engine/shm_exchange.h"

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include <spdlog/spdlog.h>

namespace gcmoe::engine {
namespace {

constexpr uint64_t kMagic = 0x65786f6d63672e31ull;  // "1.gcmoex"
constexpr uint32_t kVersion = 1;

size_t AlignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Spins briefly (steps are short), then yields, then sleeps, checking the deadline and the
// abort generation as it goes. `what` names the wait in the error: which signal of which rank.
template <typename Ready>
Status WaitUntil(Ready ready, uint64_t generation, const WaitLimits& limits,
                 const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(limits.timeout_ms);
  for (uint64_t spin = 0;; ++spin) {
    if (ready()) return Status::Ok();
    if ((spin & 63) == 0) {
      if (limits.abort_generation != nullptr &&
          limits.abort_generation->load(std::memory_order_acquire) >= generation) {
        return Aborted("step " + std::to_string(generation) + " aborted while waiting for " + what);
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        return Unavailable("timed out after " + std::to_string(limits.timeout_ms) +
                           " ms waiting for " + what + " (generation " +
                           std::to_string(generation) + ")");
      }
      const auto waited = now - start;
      if (waited > std::chrono::milliseconds(2)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (waited > std::chrono::microseconds(200)) {
        std::this_thread::yield();
      }
    }
  }
}

// Segments of a service's ranks, "gcmoe-<hex>-r<digits>" (SegmentName of an instance, which
// is hex), and nothing else.
bool IsServiceSegmentName(std::string_view name) {
  constexpr std::string_view kPrefix = "gcmoe-";
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  name.remove_prefix(kPrefix.size());
  const size_t rank_at = name.find("-r");
  return rank_at != std::string_view::npos && IsLowerHex(name.substr(0, rank_at)) &&
         IsDecimal(name.substr(rank_at + 2));
}

}  // namespace

ExchangeLayout ExchangeLayout::For(const ExchangeShape& shape) {
  ExchangeLayout l;
  l.shape = shape;
  const size_t cap = static_cast<size_t>(shape.capacity);
  const size_t h = static_cast<size_t>(shape.hidden);
  const size_t k = static_cast<size_t>(shape.top_k);
  size_t at = AlignUp(sizeof(SegmentView::Header));
  l.x_offset = at;
  at = AlignUp(at + cap * h);
  l.scales_offset = at;
  at = AlignUp(at + cap * (h / 32));
  l.ids_offset = at;
  at = AlignUp(at + cap * k * sizeof(int32_t));
  l.weights_offset = at;
  at = AlignUp(at + cap * k * sizeof(float));
  l.combine_offset = at;
  at = AlignUp(at + cap * (k + 1) * h * sizeof(uint16_t));
  l.total_bytes = at;
  return l;
}

int SegmentView::num_tokens() const { return header->num_tokens.load(std::memory_order_relaxed); }

std::string ShmExchange::SegmentName(const std::string& instance, int rank) {
  return "/gcmoe-" + instance + "-r" + std::to_string(rank);
}

ShmExchange::ShmExchange(std::string instance, int rank, const ExchangeLayout& layout)
    : instance_(std::move(instance)),
      name_(SegmentName(instance_, rank)),
      rank_(rank),
      layout_(layout) {}

Result<std::unique_ptr<ShmExchange>> ShmExchange::Create(const std::string& instance, int rank,
                                                         const ExchangeShape& shape) {
  if (shape.hidden <= 0 || shape.hidden % 32 != 0 || shape.top_k <= 0 || shape.capacity <= 0 ||
      shape.world_size <= 0 || rank < 0 || rank >= shape.world_size) {
    return InvalidArgument("exchange: bad shape or rank");
  }
  const std::string name = SegmentName(instance, rank);
  if (name.size() > 200 || instance.find('/') != std::string::npos) {
    return InvalidArgument("exchange: instance name \"" + instance + "\" is not usable");
  }
  std::unique_ptr<ShmExchange> ex(new ShmExchange(instance, rank, ExchangeLayout::For(shape)));
  // A segment left behind by an earlier incarnation of this rank (killed before it could
  // unlink) is replaced, never reused: its signals belong to another life. Those of services
  // that died whole (every rank SIGKILLed) have names nobody will use again: removed too.
  shm_unlink(name.c_str());
  for (const StaleSegment& stale : SweepStaleSharedMemory(IsServiceSegmentName)) {
    spdlog::info("exchange: removed {} ({} bytes), left by a rank that died without removing it",
                 stale.name, stale.bytes);
  }
  GCMOE_ASSIGN_OR_RETURN(ex->own_, SharedMemory::Create(name, ex->layout_.total_bytes));
  void* addr = ex->own_->data();
  auto* header = new (addr) SegmentView::Header{};
  header->magic = kMagic;
  header->version = kVersion;
  header->rank = rank;
  header->shape = shape;
  header->data_ready.store(0, std::memory_order_relaxed);
  header->combine_arrivals[0].store(0, std::memory_order_relaxed);
  header->combine_arrivals[1].store(0, std::memory_order_relaxed);
  header->num_tokens.store(0, std::memory_order_relaxed);
  ex->views_.assign(shape.world_size, SegmentView{});
  ex->views_[rank] = SegmentView{header, static_cast<uint8_t*>(addr), &ex->layout_};
  ex->peer_maps_.resize(shape.world_size);
  return ex;
}

ShmExchange::~ShmExchange() {
  UnmapPeers();
  own_.reset();  // unmaps and unlinks
}

void ShmExchange::UnmapPeers() {
  for (int r = 0; r < static_cast<int>(peer_maps_.size()); ++r) {
    peer_maps_[r].reset();
    if (r != rank_) views_[r] = SegmentView{};
  }
  connected_ = false;
}

Status ShmExchange::Connect(std::span<const std::string> peer_names) {
  const int world = world_size();
  if (static_cast<int>(peer_names.size()) != world) {
    return InvalidArgument("exchange: expected " + std::to_string(world) + " peer names, got " +
                           std::to_string(peer_names.size()));
  }
  if (peer_names[rank_] != name_) {
    return InvalidArgument("exchange: rank " + std::to_string(rank_) + " is listed as \"" +
                           peer_names[rank_] + "\", expected its own segment \"" + name_ + "\"");
  }
  for (int r = 0; r < world; ++r) {
    if (peer_names[r] != SegmentName(instance_, r)) {
      return FailedPrecondition("exchange: rank " + std::to_string(r) + " is listed as \"" +
                                peer_names[r] + "\", expected this service's segment \"" +
                                SegmentName(instance_, r) + "\"");
    }
  }
  UnmapPeers();
  for (int r = 0; r < world; ++r) {
    if (r == rank_) continue;
    const std::string& peer = peer_names[r];
    Result<std::unique_ptr<SharedMemory>> mapped = SharedMemory::Open(peer, layout_.total_bytes);
    if (!mapped.ok()) {
      UnmapPeers();
      if (mapped.status().code() == StatusCode::kFailedPrecondition) {
        return FailedPrecondition("exchange: rank " + std::to_string(r) + "'s segment " + peer +
                                  " has another size: its model or capacity differs");
      }
      return Unavailable("exchange: rank " + std::to_string(r) +
                         "'s segment: " + mapped.status().message());
    }
    peer_maps_[r] = std::move(*mapped);
    void* addr = peer_maps_[r]->data();
    auto* header = static_cast<SegmentView::Header*>(addr);
    if (header->magic != kMagic || header->version != kVersion || header->rank != r ||
        !(header->shape == layout_.shape)) {
      UnmapPeers();
      return FailedPrecondition("exchange: segment " + peer + " is not rank " + std::to_string(r) +
                                "'s segment of this service");
    }
    views_[r] = SegmentView{header, static_cast<uint8_t*>(addr), &layout_};
  }
  SegmentView::Header* own = self().header;
  own->combine_arrivals[0].store(0, std::memory_order_relaxed);
  own->combine_arrivals[1].store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  connected_ = true;
  return Status::Ok();
}

void ShmExchange::PublishInputs(uint64_t generation, int num_tokens) {
  SegmentView::Header* own = self().header;
  own->num_tokens.store(num_tokens, std::memory_order_relaxed);
  own->data_ready.store(generation, std::memory_order_release);
}

Status ShmExchange::WaitAllInputs(uint64_t generation, const WaitLimits& limits) const {
  for (int r = 0; r < world_size(); ++r) {
    if (r == rank_) continue;
    const SegmentView::Header* h = views_[r].header;
    GCMOE_RETURN_IF_ERROR(WaitUntil(
        [h, generation] { return h->data_ready.load(std::memory_order_acquire) >= generation; },
        generation, limits, "rank " + std::to_string(r) + "'s data-ready signal"));
  }
  return Status::Ok();
}

void ShmExchange::ArriveCombine(int src, uint64_t generation) {
  views_[src].header->combine_arrivals[generation & 1].fetch_add(1, std::memory_order_release);
}

Status ShmExchange::WaitCombineAndReset(uint64_t generation, const WaitLimits& limits) {
  std::atomic<uint64_t>& arrivals = self().header->combine_arrivals[generation & 1];
  const uint64_t expected = static_cast<uint64_t>(world_size());
  GCMOE_RETURN_IF_ERROR(WaitUntil(
      [&arrivals, expected] { return arrivals.load(std::memory_order_acquire) >= expected; },
      generation, limits, "combine arrivals from all ranks at rank " + std::to_string(rank_)));
  arrivals.store(0, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace gcmoe::engine
