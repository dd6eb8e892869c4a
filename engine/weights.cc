#include "engine/weights.h"

#include <cerrno>
#include <cstdlib>

#include "engine/file_weights.h"
#include "engine/hf_checkpoint.h"
#include "engine/hf_weights.h"
#include "engine/synthetic_weights.h"

namespace gcmoe::engine {
namespace {

constexpr char kSyntheticPrefix[] = "synthetic:";

Result<uint64_t> ParseSeed(const std::string& text) {
  bool digits = !text.empty() && text.size() <= 20;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  errno = 0;
  const unsigned long long seed = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || errno != 0) {
    return InvalidArgument("model.weights: \"synthetic:" + text +
                           "\" has a bad seed, expected a decimal integer below 2^64");
  }
  return static_cast<uint64_t>(seed);
}

}  // namespace

Result<std::unique_ptr<WeightSource>> WeightSource::Open(const ModelSpec& spec) {
  GCMOE_RETURN_IF_ERROR(spec.Validate());
  const std::string prefix = kSyntheticPrefix;
  if (spec.weights.starts_with(prefix)) {
    GCMOE_ASSIGN_OR_RETURN(uint64_t seed, ParseSeed(spec.weights.substr(prefix.size())));
    return std::unique_ptr<WeightSource>(std::make_unique<SyntheticWeightSource>(spec, seed));
  }
  if (HfCheckpointDir(spec.weights)) return HfWeightSource::Open(spec);
  return FileWeightSource::Open(spec);
}

}  // namespace gcmoe::engine
