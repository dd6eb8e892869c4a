// The persistent role2 scheduler's task space, one definition for every role2 kernel.
//
// Task indices are handed out in this order: shared-expert W1 tiles, routed W1 tiles, shared W2
// tiles, routed W2 tiles. A W2 task waits for its block's W1 tiles, so every W1 task is handed
// out before any W2 task: a CTA never waits on work no CTA has taken.
#pragma once

#include <cstdint>

#include "kernels/layer_types.h"

namespace gcmoe::kernels {

struct Role2Task {
  TaskKind kind;
  int block;  // ring block (routed) or shared-expert block
  int tile;   // output tile within the block's GEMM
};

struct Role2TaskSpace {
  int n1;   // routed W1 tiles per block
  int n1s;  // shared W1 tiles per block
  int n2;   // W2 tiles per block (routed and shared)
  int64_t end_shared_w1;
  int64_t end_routed_w1;
  int64_t end_shared_w2;
  int64_t total;

  __device__ __forceinline__ Role2TaskSpace(int num_blocks, int num_shared_blocks, int n1_,
                                            int n1s_, int n2_)
      : n1(n1_), n1s(n1s_), n2(n2_) {
    end_shared_w1 = static_cast<int64_t>(num_shared_blocks) * n1s;
    end_routed_w1 = end_shared_w1 + static_cast<int64_t>(num_blocks) * n1;
    end_shared_w2 = end_routed_w1 + static_cast<int64_t>(num_shared_blocks) * n2;
    total = end_shared_w2 + static_cast<int64_t>(num_blocks) * n2;
  }

  // Requires 0 <= task < total.
  __device__ __forceinline__ Role2Task Decode(int64_t task) const {
    if (task < end_shared_w1) {
      return {kSharedW1, static_cast<int>(task / n1s), static_cast<int>(task % n1s)};
    }
    if (task < end_routed_w1) {
      const int64_t i = task - end_shared_w1;
      return {kRoutedW1, static_cast<int>(i / n1), static_cast<int>(i % n1)};
    }
    if (task < end_shared_w2) {
      const int64_t i = task - end_routed_w1;
      return {kSharedW2, static_cast<int>(i / n2), static_cast<int>(i % n2)};
    }
    const int64_t i = task - end_shared_w2;
    return {kRoutedW2, static_cast<int>(i / n2), static_cast<int>(i % n2)};
  }
};

}  // namespace gcmoe::kernels
