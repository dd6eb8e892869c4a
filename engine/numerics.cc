#include "engine/numerics.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace gcmoe::numerics {

double CalcDiff(const double* x, const double* y, long n) {
  double cross = 0.0;
  double squares = 0.0;
  for (long i = 0; i < n; ++i) {
    cross += x[i] * y[i];
    squares += x[i] * x[i] + y[i] * y[i];
  }
  if (squares == 0.0) return 0.0;  // both all zero: identical
  return 1.0 - 2.0 * cross / squares;
}

float RoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

double Cosine(const double* x, const double* y, long n) {
  double cross = 0.0;
  double xx = 0.0;
  double yy = 0.0;
  for (long i = 0; i < n; ++i) {
    cross += x[i] * y[i];
    xx += x[i] * x[i];
    yy += y[i] * y[i];
  }
  if (xx == 0.0 && yy == 0.0) return 1.0;  // both all zero: identical
  if (xx == 0.0 || yy == 0.0) return 0.0;
  return cross / std::sqrt(xx * yy);
}

std::vector<double> OutputToDoubles(std::span<const uint8_t> bytes, bool fp32) {
  std::vector<double> out(bytes.size() / (fp32 ? 4 : 2));
  for (size_t i = 0; i < out.size(); ++i) {
    if (fp32) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      out[i] = v;
    } else {
      uint16_t v;
      std::memcpy(&v, bytes.data() + 2 * i, 2);
      out[i] = BF16ToFloat(v);
    }
  }
  return out;
}

}  // namespace gcmoe::numerics
