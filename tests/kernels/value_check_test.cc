// kernels/value_check.h against a host scan: the first BF16 or FP32 element beyond a limit (NaN
// and Inf included), on tensors of every size class, with planted values at chosen places.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/value_check.h"
#include "tests/kernels/gpu_test_util.h"

namespace gcmoe::kernels_test {
namespace {

// The host's answer: the first index whose value is not within [-limit, limit], else ~0.
unsigned long long HostFirstBeyond(const std::vector<float>& values, float limit) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(std::fabs(values[i]) <= limit)) return i;
  }
  return ~0ull;
}

uint16_t ToBf16Bits(float v) {  // truncation: the planted values are exact in BF16
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<uint16_t>(bits >> 16);
}

unsigned long long DeviceFirstBeyond(const std::vector<float>& values, bool fp32, float limit) {
  const size_t n = values.size();
  std::vector<uint16_t> bf16(n);
  for (size_t i = 0; i < n; ++i) bf16[i] = ToBf16Bits(values[i]);
  const size_t bytes = n * (fp32 ? 4 : 2);
  void* data = nullptr;
  unsigned long long* first = nullptr;
  EXPECT_EQ(cudaMalloc(&data, bytes + 1), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&first, sizeof(*first)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(data, fp32 ? static_cast<const void*>(values.data()) : bf16.data(), bytes,
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemset(first, 0xff, sizeof(*first)), cudaSuccess);
  EXPECT_EQ(kernels::LaunchFirstBeyond(data, fp32, static_cast<int64_t>(n), limit, first, nullptr),
            cudaSuccess);
  unsigned long long result = 0;
  EXPECT_EQ(cudaMemcpy(&result, first, sizeof(result), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(data);
  cudaFree(first);
  return result;
}

TEST(ValueCheckTest, FindsTheFirstValueBeyondTheLimitAsAHostScanDoes) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  constexpr float kActivationLimit = 4294967296.0f;  // 2^32
  const float kFinite = std::numeric_limits<float>::max();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Sizes from one element to more than the kernel's grid covers in one pass (1024 x 256 x 4).
  for (const size_t n : {size_t{1}, size_t{31}, size_t{256 * 64 + 3}, size_t{1 << 21}}) {
    std::vector<float> clean(n);
    for (float& v : clean) v = unit(rng);
    for (const bool fp32 : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(n) + (fp32 ? " FP32" : " BF16"));
      EXPECT_EQ(DeviceFirstBeyond(clean, fp32, kActivationLimit), ~0ull);
      // One bad value at the start, the middle, the end; then several, the earliest counts.
      for (const size_t at : {size_t{0}, n / 2, n - 1}) {
        for (const float bad : {nan, inf, -inf, 8589934592.0f /* 2^33 */}) {
          std::vector<float> values = clean;
          values[at] = bad;
          EXPECT_EQ(DeviceFirstBeyond(values, fp32, kActivationLimit),
                    HostFirstBeyond(values, kActivationLimit))
              << "planted " << bad << " at " << at;
          // With the FP32 limit only Inf and NaN count: 2^33 is finite.
          EXPECT_EQ(DeviceFirstBeyond(values, fp32, kFinite), HostFirstBeyond(values, kFinite))
              << "planted " << bad << " at " << at;
        }
      }
      if (n > 1000) {
        std::vector<float> values = clean;
        std::uniform_int_distribution<size_t> place(0, n - 1);
        for (int i = 0; i < 50; ++i) values[place(rng)] = nan;
        EXPECT_EQ(DeviceFirstBeyond(values, fp32, kActivationLimit),
                  HostFirstBeyond(values, kActivationLimit));
      }
    }
  }
}

}  // namespace
}  // namespace gcmoe::kernels_test
