#include "tools/bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/percentile.h"
#include "engine/numerics.h"

namespace gcmoe::tools {

Result<std::vector<int>> ParseTokenList(const std::string& text) {
  std::vector<int> tokens;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 65536) {
      return InvalidArgument("--tokens-per-rank: \"" + item + "\" is not a token count 1..65536");
    }
    tokens.push_back(static_cast<int>(v));
  }
  if (tokens.empty()) return InvalidArgument("--tokens-per-rank: expected a list like 1,2,4");
  return tokens;
}

double Percentile(std::vector<float> values, double q) {
  std::sort(values.begin(), values.end());
  return NearestRankPercentile<float>(values, q);
}

Bf16Difference CompareBf16(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  Bf16Difference d;
  for (size_t i = 0; i + 1 < std::min(a.size(), b.size()); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, &a[i], 2);
    std::memcpy(&y, &b[i], 2);
    const double fx = numerics::BF16ToFloat(x);
    d.max_abs = std::max(d.max_abs, std::fabs(fx));
    if (x == y) continue;
    if (d.values++ == 0) d.first = static_cast<int64_t>(i / 2);
    d.max_abs_diff = std::max(d.max_abs_diff, std::fabs(fx - numerics::BF16ToFloat(y)));
  }
  return d;
}

std::string Bf16Difference::Describe(int hidden) const {
  char text[160];
  std::snprintf(text, sizeof(text), "%lld values, first token %lld feature %lld, max |diff| %.4g (max |y| %.4g)",
                static_cast<long long>(values), static_cast<long long>(first / hidden),
                static_cast<long long>(first % hidden), max_abs_diff, max_abs);
  return text;
}

}  // namespace gcmoe::tools
