// Pieces shared by the `gcmoe bench` harnesses.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace gcmoe::server {

// "1,2,4,...": token counts 1..65536 (the --tokens-per-rank flag).
Result<std::vector<int>> ParseTokenList(const std::string& text);

// The q-quantile (0..1) of `values` (nearest rank); values must not be empty.
double Percentile(std::vector<float> values, double q);

}  // namespace gcmoe::server
