// Pieces shared by the `gcmoe bench` harnesses.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::tools {

// "1,2,4,...": token counts 1..65536 (the --tokens-per-rank flag).
Result<std::vector<int>> ParseTokenList(const std::string& text);

// The q-quantile (0..1) of `values`: common/percentile.h's nearest rank, after sorting.
double Percentile(std::vector<float> values, double q);

// How two BF16 layer outputs differ, value by value.
struct Bf16Difference {
  int64_t values = 0;       // values whose bits differ
  int64_t first = -1;       // index of the first of them, -1 when none
  double max_abs_diff = 0;  // the largest |a - b|
  double max_abs = 0;       // the largest |a|, for scale
  // "N values, first token t feature f, max |diff| x (max |y| y)".
  std::string Describe(int hidden) const;
};
Bf16Difference CompareBf16(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace gcmoe::tools
