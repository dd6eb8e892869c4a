#include "tools/bench_random_weights.h"

#include <algorithm>
#include <cmath>

#include "common/number_formats.h"
#include "common/splitmix64.h"

namespace gcmoe::tools {
namespace {

// One splitmix64 stream per (seed, tensor).
using Stream = SplitMix64;

uint64_t TensorSeed(uint64_t seed, int layer, int expert, int tensor) {
  return seed * 0x100000001B3ull ^ (static_cast<uint64_t>(layer) << 40) ^
         (static_cast<uint64_t>(expert + 1) << 8) ^ static_cast<uint64_t>(tensor);
}

// UE8M0 code near 2^-log2(rms * sqrt(k)), jittered by -1..+1 per block.
void FillScales(Stream* s, double code_rms, int k, std::vector<uint8_t>* scales) {
  const int base = 127 - static_cast<int>(std::lround(std::log2(code_rms * std::sqrt(k))));
  for (size_t i = 0; i < scales->size(); i += 8) {
    uint64_t r = s->Next();
    for (size_t j = i; j < std::min(i + 8, scales->size()); ++j, r >>= 8) {
      (*scales)[j] = static_cast<uint8_t>(base - 1 + static_cast<int>((r & 0xFF) % 3));
    }
  }
}

// Every byte is two valid E2M1 codes.
void FillE2M1(Stream* s, std::vector<uint8_t>* codes) {
  for (size_t i = 0; i < codes->size(); i += 8) {
    uint64_t r = s->Next();
    for (size_t j = i; j < std::min(i + 8, codes->size()); ++j, r >>= 8) {
      (*codes)[j] = static_cast<uint8_t>(r);
    }
  }
}

// E4M3 codes with exponent fields 5..9 (magnitudes 0.25 .. 3.75), any sign and mantissa: no
// NaN code, a realistic spread.
void FillE4M3(Stream* s, std::vector<uint8_t>* codes) {
  for (size_t i = 0; i < codes->size(); i += 4) {
    uint64_t r = s->Next();
    for (size_t j = i; j < std::min(i + 4, codes->size()); ++j, r >>= 16) {
      const uint32_t sign = (r >> 15) & 1;
      const uint32_t exponent = 5 + static_cast<uint32_t>((r >> 3) & 0xFF) % 5;
      (*codes)[j] = static_cast<uint8_t>((sign << 7) | (exponent << 3) | (r & 7));
    }
  }
}

// BF16 values uniform in [-1, 1] (gpt-oss stores its biases in BF16).
void FillBiases(Stream* s, std::vector<float>* values) {
  for (float& v : *values) {
    const double unit = static_cast<double>(s->Next() >> 11) * 0x1p-53;  // [0, 1)
    v = numerics::RoundToBF16(static_cast<float>(2.0 * unit - 1.0));
  }
}

// RMS of the code values each generator draws (E2M1: all 16 codes; E4M3: the band above).
constexpr double kE2M1Rms = 2.93;
constexpr double kE4M3Rms = 1.45;

}  // namespace

RandomCodeWeightSource::RandomCodeWeightSource(const engine::ModelSpec& spec, uint64_t seed,
                                               bool biases)
    : spec_(spec), seed_(seed), biases_(biases) {}

std::string RandomCodeWeightSource::Describe() const {
  return "random-codes:" + std::to_string(seed_);
}

Result<engine::ExpertWeights> RandomCodeWeightSource::LoadExpert(int layer, int expert) const {
  if (layer < 0 || layer >= spec_.num_layers || expert < 0 || expert >= spec_.num_experts) {
    return InvalidArgument("random weights: no layer " + std::to_string(layer) + " expert " +
                           std::to_string(expert));
  }
  const int64_t H = spec_.hidden;
  const int64_t I = spec_.intermediate;
  engine::ExpertWeights w;
  w.w1.resize(2 * I * H / 2);
  w.w1_scales.resize(2 * I * H / 32);
  w.w2.resize(H * I / 2);
  w.w2_scales.resize(H * I / 32);
  Stream s(TensorSeed(seed_, layer, expert, 0));
  FillE2M1(&s, &w.w1);
  FillScales(&s, kE2M1Rms, spec_.hidden, &w.w1_scales);
  FillE2M1(&s, &w.w2);
  FillScales(&s, kE2M1Rms, spec_.intermediate, &w.w2_scales);
  if (biases_) {
    Stream b(TensorSeed(seed_, layer, expert, 1));
    w.b1.resize(2 * I);
    w.b2.resize(H);
    FillBiases(&b, &w.b1);
    FillBiases(&b, &w.b2);
  }
  return w;
}

Result<engine::SharedExpertWeights> RandomCodeWeightSource::LoadShared(int layer) const {
  if (!spec_.has_shared() || layer < 0 || layer >= spec_.num_layers) {
    return InvalidArgument("random weights: no shared expert for layer " + std::to_string(layer));
  }
  const int64_t H = spec_.hidden;
  const int64_t Is = spec_.shared_intermediate;
  engine::SharedExpertWeights w;
  w.w1.resize(2 * Is * H);
  w.w1_scales.resize(2 * Is * H / 32);
  w.w2.resize(H * Is);
  w.w2_scales.resize(H * Is / 32);
  Stream s(TensorSeed(seed_, layer, -1, 2));
  FillE4M3(&s, &w.w1);
  FillScales(&s, kE4M3Rms, spec_.hidden, &w.w1_scales);
  FillE4M3(&s, &w.w2);
  FillScales(&s, kE4M3Rms, spec_.shared_intermediate, &w.w2_scales);
  return w;
}

Result<engine::DenseExpertWeights> RandomCodeWeightSource::LoadExpertDense(int, int) const {
  return NotFound("random weights: codes only, no full-precision weights");
}

Result<engine::DenseExpertWeights> RandomCodeWeightSource::LoadSharedDense(int) const {
  return NotFound("random weights: codes only, no full-precision weights");
}

Status RandomCodeWeightSource::CheckExperts(const std::vector<int>&,
                                            const std::vector<int>&) const {
  return Status::Ok();
}

int64_t RandomCodeWeightSource::RoutedExpertBytes(const engine::ModelSpec& spec) {
  const int64_t H = spec.hidden;
  const int64_t I = spec.intermediate;
  return 2 * I * (H / 2 + H / 32) + H * (I / 2 + I / 32);
}

int64_t RandomCodeWeightSource::SharedExpertBytes(const engine::ModelSpec& spec) {
  const int64_t H = spec.hidden;
  const int64_t Is = spec.shared_intermediate;
  return 2 * Is * (H + H / 32) + H * (Is + Is / 32);
}

}  // namespace gcmoe::tools
