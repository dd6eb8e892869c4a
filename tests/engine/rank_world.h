// P rank engines in one test process, each stepping on its own thread over the real exchange
// (shared memory on the CPU backend; peer access or NCCL on the CUDA backend, rank r on GPU r):
// the multi-rank engine without the gRPC layers around it.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace gcmoe::engine::testing_util {

// One whole Forward's inputs before sharding, FP32 activations.
struct GlobalRequest {
  int num_tokens = 0;
  int layer = 0;
  std::vector<float> hidden;     // [T, H]
  std::vector<int32_t> ids;      // [T, k]
  std::vector<float> weights;    // [T, k]
  DType dtype = DType::kFP32;    // how the shards carry the activations
  std::vector<uint8_t> fp8;      // [T, H] with kFP8E4M3
  std::vector<uint8_t> scales;   // [T, H/32] with kFP8E4M3
  bool output_fp32 = true;
};

enum class Routing {
  kRandom,          // distinct random experts per token
  kUnusedSlots,     // as kRandom, about a fifth of the slots -1, some tokens with none used
  kOneHotExpert,    // every token's first slot is the same expert
};

GlobalRequest MakeRequest(const ModelSpec& spec, int num_tokens, Routing routing, uint64_t seed);
// Converts the activations to the shards' dtype (BF16 bits, or E4M3 + scales).
void SetDType(GlobalRequest* request, DType dtype);

struct WorldOptions {
  int world_size = 1;
  int capacity = 1024;  // tokens per rank
  int threads = 1;      // CPU threads per rank
  int exchange_timeout_ms = 5000;
  std::string backend = "cpu";     // "cpu" | "cuda" (rank r on device r)
  std::string exchange = "gcmoe";  // cuda: "gcmoe" | "nccl"
  // Relief over a placement that replicates each rank's first expert on its ring neighbour
  // (else every expert has one copy and nothing is balanced).
  bool relief = false;
};

class RankWorld {
 public:
  static Result<std::unique_ptr<RankWorld>> Create(const ModelSpec& spec,
                                                   const WorldOptions& options);

  // Shards the request over the ranks, steps every rank on its own thread and returns the
  // concatenated outputs (bytes of FP32 or BF16), or the first rank's error.
  Result<std::vector<uint8_t>> Forward(const GlobalRequest& request);
  // Steps only the given ranks (the others stay idle): for abort and timeout tests.
  std::vector<Status> StepSome(const GlobalRequest& request, const std::vector<int>& ranks);

  Engine& engine(int rank) { return *engines_[rank]; }
  // The statistics of rank r's last step.
  const StepStats& last_stats(int rank) const { return stats_[rank]; }
  Status Reconnect();  // a new epoch, as after a failed step
  uint64_t next_generation() const { return generation_ + 1; }

 private:
  RankWorld() = default;
  std::vector<Status> Step(const GlobalRequest& request, const std::vector<int>& ranks,
                           std::vector<std::vector<uint8_t>>* outputs);

  ModelSpec spec_;
  WorldOptions options_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<StepStats> stats_;
  uint64_t generation_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace gcmoe::engine::testing_util
