#include "server/rank_io.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/spin_wait.h"

namespace gcmoe::server {
namespace {

// A region's name without its '/': "gcmoe-io-r<digits>-<16 hex digits>" (Create's names).
bool IsRegionName(std::string_view name) {
  const std::string prefix = std::string(RankIo::kNamePrefix) + "-r";
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  const size_t dash = name.find('-');
  return dash != std::string_view::npos && IsDecimal(name.substr(0, dash)) &&
         name.size() - dash - 1 == 16 && IsLowerHex(name.substr(dash + 1));
}

size_t Pages(size_t bytes) {
  constexpr size_t kPage = 4096;
  return (bytes + kPage - 1) / kPage * kPage;
}

// Futexes on a shared mapping: the process-shared (not FUTEX_PRIVATE) operations.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds timeout) {
  timespec ts{};
  ts.tv_sec = timeout.count() / 1000;
  ts.tv_nsec = (timeout.count() % 1000) * 1000000;
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

static_assert(std::atomic<uint32_t>::is_always_lock_free, "the doorbell needs lock-free atomics");
static_assert(RankIo::kSlots <= RankIoLayout::kMessageRing,
              "a step per slot may be in flight: the ring must hold that many messages");

RankIoLayout RankIoLayout::For(int max_tokens, int hidden, int top_k, int slots) {
  RankIoLayout l;
  l.max_tokens = max_tokens;
  l.hidden = hidden;
  l.top_k = top_k;
  l.slots = slots;
  const size_t T = static_cast<size_t>(max_tokens);
  l.hidden_bytes = Pages(T * hidden * 4);
  l.scales_bytes = Pages(T * (hidden / 32));
  l.ids_bytes = Pages(T * top_k * 4);
  l.weights_bytes = Pages(T * top_k * 4);
  l.output_bytes = Pages(T * hidden * 4);
  l.slot_bytes = l.hidden_bytes + l.scales_bytes + l.ids_bytes + l.weights_bytes + l.output_bytes;
  l.total_bytes = slots_offset() + l.slot_bytes * slots;
  return l;
}

Result<std::unique_ptr<RankIo>> RankIo::Create(int rank, const RankIoLayout& layout) {
  // A region whose rank never mapped it, of a coordinator that was killed before it could
  // remove it: nobody will open it again.
  for (const StaleSegment& stale : SweepStaleSharedMemory(IsRegionName)) {
    spdlog::info("rank I/O: removed {} ({} bytes), left by a coordinator that died", stale.name,
                 stale.bytes);
  }
  const std::string prefix = std::string(kNamePrefix) + "-r" + std::to_string(rank);
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory,
                         SharedMemory::Create(RandomSharedMemoryName(prefix), layout.total_bytes));
  // The region is zero-filled: both channels start at sequence 0 with no message.
  return std::unique_ptr<RankIo>(new RankIo(std::move(memory), layout));
}

Result<std::unique_ptr<RankIo>> RankIo::Open(const std::string& name, const RankIoLayout& layout) {
  const std::string expected = std::string("/") + kNamePrefix + "-";
  if (name.compare(0, expected.size(), expected) != 0 || name.find('/', 1) != std::string::npos) {
    return InvalidArgument("rank I/O: \"" + name + "\" is not a region the coordinator creates");
  }
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory,
                         SharedMemory::Open(name, layout.total_bytes));
  // Both sides have it mapped now: the name has served its purpose.
  shm_unlink(name.c_str());
  return std::unique_ptr<RankIo>(new RankIo(std::move(memory), layout));
}

bool RankIo::Post(Channel channel, const std::string& message) {
  if (message.size() > RankIoLayout::kMessageBytes) return false;
  ChannelHeader* h = header(channel);
  const uint32_t next = h->sequence.load(std::memory_order_relaxed) + 1;  // the only writer
  const int area = static_cast<int>(next % RankIoLayout::kMessageRing);
  std::memcpy(base() + RankIoLayout::message_offset(channel, area), message.data(), message.size());
  h->bytes[area] = static_cast<uint32_t>(message.size());
  h->sequence.store(next, std::memory_order_release);
  FutexWakeAll(&h->sequence);
  return true;
}

bool RankIo::Wait(Channel channel, uint32_t* seen, std::chrono::microseconds spin,
                  std::chrono::milliseconds timeout, std::string* message) {
  ChannelHeader* h = header(channel);
  uint32_t now = *seen;
  SpinUntil(
      [&] {
        now = h->sequence.load(std::memory_order_acquire);
        return now != *seen;
      },
      spin);
  if (now == *seen) {
    FutexWait(&h->sequence, now, timeout);
    now = h->sequence.load(std::memory_order_acquire);
    if (now == *seen) return false;
  }
  if (now - *seen > static_cast<uint32_t>(RankIoLayout::kMessageRing)) {
    // Only a writer that broke the ring's bound gets here: the oldest are overwritten.
    spdlog::error("rank I/O: {} message(s) on channel {} were overwritten unread",
                  now - *seen - RankIoLayout::kMessageRing, static_cast<int>(channel));
    *seen = now - RankIoLayout::kMessageRing;
  }
  ++*seen;
  const int area = static_cast<int>(*seen % RankIoLayout::kMessageRing);
  const uint32_t bytes = std::min<uint32_t>(h->bytes[area], RankIoLayout::kMessageBytes);
  message->assign(
      reinterpret_cast<const char*>(base() + RankIoLayout::message_offset(channel, area)), bytes);
  return true;
}

void RankIo::Wake(Channel channel) { FutexWakeAll(&header(channel)->sequence); }

uint32_t RankIo::sequence(Channel channel) const {
  return header(channel)->sequence.load(std::memory_order_acquire);
}

}  // namespace gcmoe::server
