#include "server/rank_io.h"

namespace gcmoe::server {
namespace {

size_t Pages(size_t bytes) {
  constexpr size_t kPage = 4096;
  return (bytes + kPage - 1) / kPage * kPage;
}

}  // namespace

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
  l.total_bytes = l.slot_bytes * slots;
  return l;
}

Result<std::unique_ptr<RankIo>> RankIo::Create(int rank, const RankIoLayout& layout) {
  const std::string prefix = std::string(kNamePrefix) + "-r" + std::to_string(rank);
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory,
                         SharedMemory::Create(RandomSharedMemoryName(prefix), layout.total_bytes));
  return std::unique_ptr<RankIo>(new RankIo(std::move(memory), layout));
}

Result<std::unique_ptr<RankIo>> RankIo::Open(const std::string& name, const RankIoLayout& layout) {
  const std::string expected = std::string("/") + kNamePrefix + "-";
  if (name.compare(0, expected.size(), expected) != 0 || name.find('/', 1) != std::string::npos) {
    return InvalidArgument("rank I/O: \"" + name + "\" is not a region the coordinator creates");
  }
  GCMOE_ASSIGN_OR_RETURN(std::unique_ptr<SharedMemory> memory,
                         SharedMemory::Open(name, layout.total_bytes));
  return std::unique_ptr<RankIo>(new RankIo(std::move(memory), layout));
}

}  // namespace gcmoe::server
