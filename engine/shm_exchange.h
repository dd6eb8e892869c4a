// The rank transport on one host: every rank owns one POSIX shared-memory segment that each peer
// maps. Its layout mirrors the GPU engine's workspace (DESIGN.md §1, §6):
//   - source-side token buffers (E4M3 rows, UE8M0 scales, top-k ids and weights) that the ranks
//     computing a token's experts pull from ("dispatch" is a read of the source's segment);
//   - a combine buffer [capacity, k+1, H] of BF16 partials that computing ranks scatter into
//     (slot k holds the shared expert's partial);
//   - signals: a generation-tagged data-ready flag (the tag-1 barrier) and combine-arrival
//     counters double-buffered by the generation's parity.
//
// Ordering invariants (one step of generation g; P ranks):
//   1. A source writes its token buffers, then stores data_ready = g (release). A peer reads them
//      only after loading data_ready >= g (acquire).
//   2. A computing rank writes every partial it owes source s, then adds 1 to s's
//      combine_arrivals[g & 1] (release). s reduces only after loading P arrivals (acquire).
//   3. s resets its own combine_arrivals[g & 1] after the reduction. That is safe without a
//      trailing barrier: the next user of that parity is step g+2, and no rank can reach the
//      data-ready barrier of g+2 before s has published g+2, which s does after finishing g;
//      producers of step g+1 use the other parity.
//   4. A source overwrites its token buffers for g+1 only after it saw all P arrivals of g, and
//      each peer arrives only after its last read of those buffers.
//   5. Connect() (a new epoch, no step in flight anywhere) zeroes this rank's own counters, so a
//      step aborted half-way leaves no stale arrivals behind.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/shared_memory.h"
#include "common/status.h"

namespace gcmoe::engine {

struct ExchangeShape {
  int hidden = 0;
  int top_k = 0;
  int capacity = 0;  // tokens per source rank
  int world_size = 0;
  bool operator==(const ExchangeShape&) const = default;
};

// Byte offsets of each region inside a segment (every region 64-byte aligned).
struct ExchangeLayout {
  ExchangeShape shape;
  size_t x_offset = 0;        // [capacity, H] E4M3
  size_t scales_offset = 0;   // [capacity, H/32] UE8M0
  size_t ids_offset = 0;      // [capacity, k] int32
  size_t weights_offset = 0;  // [capacity, k] float
  size_t combine_offset = 0;  // [capacity, k+1, H] BF16 bits
  size_t total_bytes = 0;

  static ExchangeLayout For(const ExchangeShape& shape);
};

// One rank's segment as seen through a mapping (its own or a peer's).
struct SegmentView {
  struct Header;
  Header* header = nullptr;
  uint8_t* base = nullptr;
  const ExchangeLayout* layout = nullptr;

  uint8_t* x() const { return base + layout->x_offset; }
  uint8_t* scales() const { return base + layout->scales_offset; }
  int32_t* ids() const { return reinterpret_cast<int32_t*>(base + layout->ids_offset); }
  float* weights() const { return reinterpret_cast<float*>(base + layout->weights_offset); }
  uint16_t* combine() const { return reinterpret_cast<uint16_t*>(base + layout->combine_offset); }
  int num_tokens() const;  // the source's T_r of the published step (valid after data-ready)
};

struct SegmentView::Header {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  ExchangeShape shape;
  alignas(64) std::atomic<uint64_t> data_ready;           // generation whose inputs are published
  alignas(64) std::atomic<uint64_t> combine_arrivals[2];  // arrivals, by generation parity
  alignas(64) std::atomic<int32_t> num_tokens;            // written before data_ready
};

// What a wait gives up on: a deadline, or an abort of this generation.
struct WaitLimits {
  int64_t timeout_ms = 2000;
  const std::atomic<uint64_t>* abort_generation = nullptr;  // abort when >= the step's generation
};

class ShmExchange {
 public:
  // "/gcmoe-<instance>-r<rank>": the only names a rank of `instance` creates or maps.
  static std::string SegmentName(const std::string& instance, int rank);

  // Creates (replacing any stale one of the same name) this rank's segment
  // SegmentName(instance, rank), mode 0600: only the service's user may map it. The segment is
  // unlinked when the object is destroyed.
  static Result<std::unique_ptr<ShmExchange>> Create(const std::string& instance, int rank,
                                                     const ExchangeShape& shape);
  ~ShmExchange();
  ShmExchange(const ShmExchange&) = delete;
  ShmExchange& operator=(const ShmExchange&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int world_size() const { return layout_.shape.world_size; }
  const ExchangeLayout& layout() const { return layout_; }

  // Maps every peer's segment (peer_names indexed by rank; this rank's own entry must be its
  // name) and zeroes this rank's signals. Call only when no step is in flight on any rank.
  // Every name must be SegmentName(this instance, its rank): a rank maps no other memory,
  // whatever it is told.
  Status Connect(std::span<const std::string> peer_names);
  bool connected() const { return connected_; }

  SegmentView self() const { return views_[rank_]; }
  SegmentView peer(int rank) const { return views_[rank]; }

  // Tag-1 barrier: publish this rank's inputs for `generation`, then wait for every peer's.
  void PublishInputs(uint64_t generation, int num_tokens);
  Status WaitAllInputs(uint64_t generation, const WaitLimits& limits) const;

  // Combine: tell source `src` that this rank's partials for it are written; wait until every
  // rank has arrived at this rank's counter, then reset it for generation + 2.
  void ArriveCombine(int src, uint64_t generation);
  Status WaitCombineAndReset(uint64_t generation, const WaitLimits& limits);

 private:
  ShmExchange(std::string instance, int rank, const ExchangeLayout& layout);
  void UnmapPeers();

  std::string instance_;
  std::string name_;
  int rank_ = 0;
  ExchangeLayout layout_;
  std::unique_ptr<SharedMemory> own_;
  std::vector<std::unique_ptr<SharedMemory>> peer_maps_;  // [P]; own rank's entry stays empty
  std::vector<SegmentView> views_;                        // [P]
  bool connected_ = false;
};

}  // namespace gcmoe::engine
