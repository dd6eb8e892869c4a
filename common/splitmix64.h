// splitmix64 (Steele, Lea and Flood, 2014): the project's one seeded generator, for anything that
// must draw the same numbers on every machine and library (synthetic weights, routing traces,
// test and benchmark instances). Not for cryptography.
#pragma once

#include <cstdint>

namespace gcmoe {

// The generator's increment (the golden ratio in 64-bit fixed point).
inline constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

// The output function: a bijective 64-bit mixer.
constexpr uint64_t SplitMixMix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMixMix(state_ += kSplitMixGamma); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform01() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace gcmoe
