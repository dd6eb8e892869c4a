// Numerics, DESIGN.md §4: the number formats and block scaling (common/number_formats.h, shared
// with the client) and the metrics that compare a backend's output with the reference.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/number_formats.h"

namespace gcmoe::numerics {

// calc_diff(x, y) = 1 - 2*sum(xy) / sum(x^2 + y^2), in float64 (DESIGN.md §4).
double CalcDiff(const double* x, const double* y, long n);
double Cosine(const double* x, const double* y, long n);

// A layer output as the engine returns it (little-endian BF16, or FP32 with `fp32`) as doubles.
std::vector<double> OutputToDoubles(std::span<const uint8_t> bytes, bool fp32);

}  // namespace gcmoe::numerics
