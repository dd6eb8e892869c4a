// A rank's inputs and outputs in shared memory, for a rank on the coordinator's host: the
// coordinator creates the region (0600, a random name it hands only to that rank in Setup; the
// rank unlinks the name once it has mapped it, so nothing else can open it and nothing is left
// behind if either side dies) and writes each step's shard straight into a slot; the rank's
// engine reads the shard from there (the CUDA backend pins the region, so host-to-device is one
// DMA) and writes the output into the same slot, where the coordinator assembles the response.
//
// The region also carries the step's metadata and the rank's result (the doorbell): each
// direction is a ring of kMessageRing message areas with a sequence number the writer bumps and
// a futex the reader sleeps on, so a step reaches the rank and its result the coordinator in a
// few microseconds instead of through the gRPC control stream, which keeps membership, Setup,
// Abort and Shutdown. The ring lets the coordinator post the next step while the rank still
// runs the previous one (server.max_steps_in_flight); messages are read in the order posted.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/shared_memory.h"
#include "common/status.h"

namespace gcmoe::server {

// Where each tensor of a slot lives. Every slot holds a shard of up to `max_tokens` tokens in
// the widest dtype each tensor may have; every area starts on a 4 KiB boundary. The message
// areas (each direction's ring) come first.
struct RankIoLayout {
  static constexpr size_t kControlBytes = 4096;       // the two channels' headers
  static constexpr size_t kMessageBytes = 256 << 10;  // each message area
  static constexpr int kMessageRing = 2;              // message areas per direction

  int max_tokens = 0;
  int hidden = 0;
  int top_k = 0;
  int slots = 0;
  size_t hidden_bytes = 0;   // [max_tokens, H] FP32 at most
  size_t scales_bytes = 0;   // [max_tokens, H/32] UE8M0
  size_t ids_bytes = 0;      // [max_tokens, k] INT32
  size_t weights_bytes = 0;  // [max_tokens, k] FP32
  size_t output_bytes = 0;   // [max_tokens, H] FP32 at most
  size_t slot_bytes = 0;
  size_t total_bytes = 0;

  static RankIoLayout For(int max_tokens, int hidden, int top_k, int slots);

  static size_t message_offset(int channel, int index) {
    return kControlBytes + (static_cast<size_t>(channel) * kMessageRing + index) * kMessageBytes;
  }
  static size_t slots_offset() { return kControlBytes + 2 * kMessageRing * kMessageBytes; }
  size_t hidden_offset(int slot) const { return slots_offset() + slot * slot_bytes; }
  size_t scales_offset(int slot) const { return hidden_offset(slot) + hidden_bytes; }
  size_t ids_offset(int slot) const { return scales_offset(slot) + scales_bytes; }
  size_t weights_offset(int slot) const { return ids_offset(slot) + ids_bytes; }
  size_t output_offset(int slot) const { return weights_offset(slot) + weights_bytes; }
};

class RankIo {
 public:
  // Slots per region: the shards of up to kSlots steps in flight (a step's shard is written
  // while the previous step runs or its output is read).
  static constexpr int kSlots = 2;
  // Every region's name starts with this; a rank opens no other name.
  static constexpr const char* kNamePrefix = "gcmoe-io";
  // The doorbell's two directions.
  enum Channel { kToRank = 0, kToCoordinator = 1 };

  // Coordinator side: a new region for `rank`.
  static Result<std::unique_ptr<RankIo>> Create(int rank, const RankIoLayout& layout);
  // Rank side: maps the region the coordinator named, checking its name and size, and unlinks
  // the name.
  static Result<std::unique_ptr<RankIo>> Open(const std::string& name, const RankIoLayout& layout);

  const std::string& name() const { return memory_->name(); }
  const RankIoLayout& layout() const { return layout_; }
  uint8_t* base() const { return memory_->data(); }
  size_t bytes() const { return memory_->size(); }

  uint8_t* hidden(int slot) const { return base() + layout_.hidden_offset(slot); }
  uint8_t* scales(int slot) const { return base() + layout_.scales_offset(slot); }
  uint8_t* ids(int slot) const { return base() + layout_.ids_offset(slot); }
  uint8_t* weights(int slot) const { return base() + layout_.weights_offset(slot); }
  uint8_t* output(int slot) const { return base() + layout_.output_offset(slot); }

  // Writes `message` into the next area of `channel`'s ring and wakes its reader. False when it
  // does not fit (the caller then uses the control stream). One writer per channel, and a writer
  // has at most kMessageRing messages unanswered (a step per I/O slot; a result per step the
  // coordinator sent), so a message is never overwritten unread.
  bool Post(Channel channel, const std::string& message);
  // Waits up to `timeout` for the message after *seen, spinning for up to `spin` of it before it
  // sleeps (server.spin_wait); true with its bytes in *message and *seen advanced by one, so
  // every message is read once, in the order posted.
  bool Wait(Channel channel, uint32_t* seen, std::chrono::microseconds spin,
            std::chrono::milliseconds timeout, std::string* message);
  // Wakes `channel`'s reader without a message (it rechecks whatever made it stop).
  void Wake(Channel channel);
  // The sequence number of `channel`'s latest message (a new reader starts from it).
  uint32_t sequence(Channel channel) const;

 private:
  struct alignas(64) ChannelHeader {
    std::atomic<uint32_t> sequence;              // messages posted so far
    uint32_t bytes[RankIoLayout::kMessageRing];  // message `sequence` is in area sequence % ring
  };
  RankIo(std::unique_ptr<SharedMemory> memory, const RankIoLayout& layout)
      : memory_(std::move(memory)), layout_(layout) {}
  ChannelHeader* header(Channel channel) const {
    return reinterpret_cast<ChannelHeader*>(base()) + channel;
  }

  std::unique_ptr<SharedMemory> memory_;
  RankIoLayout layout_;
};

}  // namespace gcmoe::server
