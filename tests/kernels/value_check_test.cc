// kernels/value_check.h against a host scan and a host copy: every range's rows arrive byte for
// byte, and each range's first BF16 or FP32 element beyond a limit (NaN and Inf included) is
// found, on ranges of every size class, aligned or not, with planted values at chosen places.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/value_check.h"
#include "tests/kernels/gpu_test_util.h"

namespace gcmoe::kernels_test {
namespace {

constexpr float kActivationLimit = 4294967296.0f;  // 2^32
const float kFinite = std::numeric_limits<float>::max();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

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

// One range: `values` as rows of `row_values`, stored with `src_pad` and copied to rows with
// `dst_pad` bytes of padding, both starting `shift` bytes into their allocations.
struct Range {
  std::vector<float> values;
  int64_t src_pad = 0;
  int64_t dst_pad = 0;
  int64_t shift = 0;
};

// Copies every range on the GPU in one call; returns each range's first index, and checks
// that each destination holds the source's bytes and that its padding was left alone.
std::vector<unsigned long long> CopyOnGpu(const std::vector<Range>& ranges, int64_t row_values,
                                          bool fp32, float limit) {
  const int64_t vb = fp32 ? 4 : 2;
  const int64_t row_bytes = row_values * vb;
  std::vector<kernels::RowCopy> copies;
  std::vector<void*> allocations;
  std::vector<std::vector<uint8_t>> sources;
  for (const Range& r : ranges) {
    const int64_t rows = static_cast<int64_t>(r.values.size()) / row_values;
    kernels::RowCopy c;
    c.rows = rows;
    c.src_pitch = row_bytes + r.src_pad;
    c.dst_pitch = row_bytes + r.dst_pad;
    std::vector<uint8_t> src(static_cast<size_t>(r.shift + rows * c.src_pitch), 0x5a);
    for (int64_t i = 0; i < static_cast<int64_t>(r.values.size()); ++i) {
      uint8_t* at = src.data() + r.shift + (i / row_values) * c.src_pitch + (i % row_values) * vb;
      if (fp32) {
        std::memcpy(at, &r.values[i], 4);
      } else {
        const uint16_t bits = ToBf16Bits(r.values[i]);
        std::memcpy(at, &bits, 2);
      }
    }
    void* s = nullptr;
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&s, src.size() + 1), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d, static_cast<size_t>(r.shift + rows * c.dst_pitch) + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(s, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(d, 0xa5, static_cast<size_t>(r.shift + rows * c.dst_pitch)), cudaSuccess);
    c.src = static_cast<uint8_t*>(s) + r.shift;
    c.dst = static_cast<uint8_t*>(d) + r.shift;
    copies.push_back(c);
    allocations.push_back(s);
    allocations.push_back(d);
    sources.push_back(std::move(src));
  }
  unsigned long long* first = nullptr;
  EXPECT_EQ(cudaMalloc(&first, ranges.size() * sizeof(*first)), cudaSuccess);
  EXPECT_EQ(cudaMemset(first, 0xff, ranges.size() * sizeof(*first)), cudaSuccess);
  EXPECT_EQ(kernels::LaunchCopyRowsChecked(copies, row_values, fp32, limit, first, nullptr),
            cudaSuccess);
  std::vector<unsigned long long> result(ranges.size());
  EXPECT_EQ(
      cudaMemcpy(result.data(), first, result.size() * sizeof(*first), cudaMemcpyDeviceToHost),
      cudaSuccess);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const kernels::RowCopy& c = copies[i];
    std::vector<uint8_t> dst(static_cast<size_t>(ranges[i].shift + c.rows * c.dst_pitch));
    EXPECT_EQ(cudaMemcpy(dst.data(), allocations[2 * i + 1], dst.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int64_t row = 0; row < c.rows; ++row) {
      const uint8_t* want = sources[i].data() + ranges[i].shift + row * c.src_pitch;
      const uint8_t* got = dst.data() + ranges[i].shift + row * c.dst_pitch;
      int64_t padding_written = 0;
      for (int64_t b = row_bytes; b < c.dst_pitch; ++b) padding_written += got[b] != 0xa5;
      const bool copied = std::memcmp(want, got, static_cast<size_t>(row_bytes)) == 0;
      EXPECT_TRUE(copied) << "range " << i << " row " << row;
      EXPECT_EQ(padding_written, 0) << "range " << i << " row " << row;
      if (!copied || padding_written > 0) break;
    }
  }
  for (void* p : allocations) cudaFree(p);
  cudaFree(first);
  return result;
}

TEST(ValueCheckTest, CopiesARangeAndFindsItsFirstValueBeyondTheLimitAsAHostScanDoes) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  constexpr int64_t kRowValues = 96;
  // From one row to more than the kernel's grid covers in one pass (256 blocks x 256 x 4 units).
  for (const int64_t rows : {int64_t{1}, int64_t{7}, int64_t{300}, int64_t{2800}}) {
    std::vector<float> clean(static_cast<size_t>(rows * kRowValues));
    for (float& v : clean) v = unit(rng);
    const size_t n = clean.size();
    for (const bool fp32 : {false, true}) {
      // Vector copies (aligned rows, padded destination rows as the engine's are), the
      // value-by-value path (2 bytes off 16: aligned for BF16, not for FP32, which goes byte by
      // byte), and byte by byte (an odd start and pitch, as a client's tensor may have).
      for (const auto& [src_pad, dst_pad, shift] :
           {std::tuple{0, 64, 0}, std::tuple{0, 0, 2}, std::tuple{32, 0, 0}, std::tuple{3, 0, 1}}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + (fp32 ? " FP32" : " BF16") + " pads " +
                     std::to_string(src_pad) + "/" + std::to_string(dst_pad) + " shift " +
                     std::to_string(shift));
        auto first = [&](const std::vector<float>& values, float limit) {
          return CopyOnGpu({Range{values, src_pad, dst_pad, shift}}, kRowValues, fp32, limit)[0];
        };
        EXPECT_EQ(first(clean, kActivationLimit), ~0ull);
        // One bad value at the start, the middle, the end; then several, the earliest counts.
        for (const size_t at : {size_t{0}, n / 2 + 1, n - 1}) {
          for (const float bad : {kNaN, kInf, -kInf, 8589934592.0f /* 2^33 */}) {
            std::vector<float> values = clean;
            values[at] = bad;
            EXPECT_EQ(first(values, kActivationLimit), HostFirstBeyond(values, kActivationLimit))
                << "planted " << bad << " at " << at;
            // With the FP32 limit only Inf and NaN count: 2^33 is finite.
            EXPECT_EQ(first(values, kFinite), HostFirstBeyond(values, kFinite))
                << "planted " << bad << " at " << at;
          }
        }
        if (n > 1000) {
          std::vector<float> values = clean;
          std::uniform_int_distribution<size_t> place(0, n - 1);
          for (int i = 0; i < 50; ++i) values[place(rng)] = kNaN;
          EXPECT_EQ(first(values, kActivationLimit), HostFirstBeyond(values, kActivationLimit));
        }
      }
    }
  }
}

TEST(ValueCheckTest, EveryRangeOfACallGetsItsOwnFirstIndex) {
  if (!HasGpu()) GTEST_SKIP() << kNoGpu;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> rows_of(1, 20);
  constexpr int64_t kRowValues = 64;
  // More ranges than one launch takes; every third clean, the others with bad values planted.
  std::vector<Range> ranges(70);
  for (size_t i = 0; i < ranges.size(); ++i) {
    Range& r = ranges[i];
    r.values.resize(static_cast<size_t>(rows_of(rng) * kRowValues));
    for (float& v : r.values) v = unit(rng);
    if (i % 3 != 0) {
      std::uniform_int_distribution<size_t> place(0, r.values.size() - 1);
      r.values[place(rng)] = i % 2 == 0 ? kNaN : -kInf;
      r.values[place(rng)] = kInf;
    }
    r.dst_pad = 128;
  }
  for (const bool fp32 : {false, true}) {
    const std::vector<unsigned long long> first =
        CopyOnGpu(ranges, kRowValues, fp32, kActivationLimit);
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_EQ(first[i], HostFirstBeyond(ranges[i].values, kActivationLimit))
          << "range " << i << (fp32 ? " FP32" : " BF16");
    }
  }
}

}  // namespace
}  // namespace gcmoe::kernels_test
