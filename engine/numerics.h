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

// d rounded to float toward zero, with the last bit set when inexact ("round to odd"). Rounding
// that float to a format at least two bits narrower (BF16, E4M3, E2M1) gives the correctly
// rounded result of d itself, so a float64 value is rounded once, as if directly.
float RoundToOdd(double d);

// A layer output as the engine returns it (little-endian BF16, or FP32 with `fp32`) as doubles.
std::vector<double> OutputToDoubles(std::span<const uint8_t> bytes, bool fp32);

}  // namespace gcmoe::numerics
