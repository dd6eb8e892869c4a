#include "server/bench_util.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace gcmoe::server {

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
  return values[static_cast<size_t>(q * (values.size() - 1) + 0.5)];
}

}  // namespace gcmoe::server
