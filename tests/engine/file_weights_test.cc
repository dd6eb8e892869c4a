// Safetensors weight files: round trips in the three forms through WriteWeightsFile, and bad
// files written by hand here (independently of the engine's writer), each failing with a message
// that names the tensor or the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "engine/numerics.h"
#include "engine/weights.h"
#include "tests/engine/tiny_model.h"

namespace gcmoe::engine {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing_util::TempPath;
using testing_util::TinyModel;

// ---- Round trips through WriteWeightsFile -------------------------------------------------

class RoundTrip : public ::testing::TestWithParam<WeightFileForm> {};

TEST_P(RoundTrip, FileHoldsTheSourceWeights) {
  const WeightFileForm form = GetParam();
  const ModelSpec spec = TinyModel("synthetic:21", 2);
  auto synthetic = WeightSource::Open(spec);
  ASSERT_TRUE(synthetic.ok());
  const std::string path = TempPath("roundtrip_" + std::to_string(static_cast<int>(form)));
  ASSERT_TRUE(WriteWeightsFile(**synthetic, form, path).ok());

  ModelSpec file_spec = spec;
  file_spec.weights = path;
  auto file = WeightSource::Open(file_spec);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->Describe(), path);
  ASSERT_TRUE((*file)->CheckExperts({0, 1}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                             15}).ok());

  for (int layer = 0; layer < 2; ++layer) {
    for (int expert : {0, 6, 15}) {
      const auto want_dense = (*synthetic)->LoadExpertDense(layer, expert);
      const auto got_q = (*file)->LoadExpert(layer, expert);
      ASSERT_TRUE(want_dense.ok() && got_q.ok()) << got_q.status().ToString();
      const auto got_dense = (*file)->LoadExpertDense(layer, expert);
      switch (form) {
        case WeightFileForm::kFloat32:
        case WeightFileForm::kPreQuantized: {
          // F32 is exact; so are pre-quantized codes. Both quantize to the source's codes.
          const auto want_q = (*synthetic)->LoadExpert(layer, expert);
          EXPECT_EQ(got_q->w1, want_q->w1);
          EXPECT_EQ(got_q->w1_scales, want_q->w1_scales);
          EXPECT_EQ(got_q->w2, want_q->w2);
          EXPECT_EQ(got_q->w2_scales, want_q->w2_scales);
          if (form == WeightFileForm::kFloat32) {
            ASSERT_TRUE(got_dense.ok());
            EXPECT_EQ(got_dense->w1, want_dense->w1);
            EXPECT_EQ(got_dense->w2, want_dense->w2);
          } else {
            EXPECT_EQ(got_dense.status().code(), StatusCode::kNotFound);
            EXPECT_THAT(got_dense.status().message(),
                        HasSubstr("layers." + std::to_string(layer) + ".experts.w1.blocks"));
          }
          break;
        }
        case WeightFileForm::kBFloat16: {
          ASSERT_TRUE(got_dense.ok());
          std::vector<float> rounded = want_dense->w1;
          for (float& v : rounded) v = numerics::RoundToBF16(v);
          EXPECT_EQ(got_dense->w1, rounded);
          // Quantized at load from the BF16 values.
          std::vector<uint8_t> codes(got_q->w1.size()), scales(got_q->w1_scales.size());
          const int H = spec.hidden;
          for (int r = 0; r < 2 * spec.intermediate; ++r) {
            numerics::QuantizeE2M1K32(rounded.data() + r * H, H, codes.data() + r * H / 2,
                                      scales.data() + r * H / 32);
          }
          EXPECT_EQ(got_q->w1, codes);
          EXPECT_EQ(got_q->w1_scales, scales);
          break;
        }
      }
    }
    const auto want_shared = (*synthetic)->LoadShared(layer);
    const auto got_shared = (*file)->LoadShared(layer);
    ASSERT_TRUE(want_shared.ok() && got_shared.ok());
    if (form != WeightFileForm::kBFloat16) {
      EXPECT_EQ(got_shared->w1, want_shared->w1);
      EXPECT_EQ(got_shared->w2_scales, want_shared->w2_scales);
    }
  }
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Forms, RoundTrip,
                         ::testing::Values(WeightFileForm::kFloat32, WeightFileForm::kBFloat16,
                                           WeightFileForm::kPreQuantized));

TEST(WeightsFileExport, ReExportFromAFile) {
  const ModelSpec spec = TinyModel("synthetic:3");
  auto synthetic = WeightSource::Open(spec);
  ASSERT_TRUE(synthetic.ok());
  const std::string f32 = TempPath("reexport.f32"), q = TempPath("reexport.q");
  ASSERT_TRUE(WriteWeightsFile(**synthetic, WeightFileForm::kFloat32, f32).ok());
  ModelSpec f32_spec = spec;
  f32_spec.weights = f32;
  auto from_f32 = WeightSource::Open(f32_spec);
  ASSERT_TRUE(from_f32.ok());
  ASSERT_TRUE(WriteWeightsFile(**from_f32, WeightFileForm::kPreQuantized, q).ok());
  ModelSpec q_spec = spec;
  q_spec.weights = q;
  auto from_q = WeightSource::Open(q_spec);
  ASSERT_TRUE(from_q.ok());
  EXPECT_EQ((*from_q)->LoadExpert(0, 9)->w2, (*synthetic)->LoadExpert(0, 9)->w2);
  // A pre-quantized file has no full-precision weights to export.
  const Status status =
      WriteWeightsFile(**from_q, WeightFileForm::kFloat32, TempPath("reexport.fail"));
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(TempPath("reexport.fail")));
  std::filesystem::remove(f32);
  std::filesystem::remove(q);
}

// ---- Hand-written files ---------------------------------------------------------------------

// A small model for hand-made files: H = I = I_s = 32, E = 2.
ModelSpec SmallModel(const std::string& path) {
  ModelSpec spec = TinyModel(path);
  spec.hidden = 32;
  spec.intermediate = 32;
  spec.num_experts = 2;
  spec.top_k = 1;
  spec.shared_intermediate = 32;
  return spec;
}

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

std::vector<uint8_t> F32Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The full-precision F32 tensors of SmallModel, deterministic.
std::vector<RawTensor> SmallDenseTensors() {
  return {
      {"layers.0.experts.w1", "F32", {2, 64, 32}, F32Bytes(RandomFloats(2 * 64 * 32, 1))},
      {"layers.0.experts.w2", "F32", {2, 32, 32}, F32Bytes(RandomFloats(2 * 32 * 32, 2))},
      {"layers.0.shared.w1", "F32", {64, 32}, F32Bytes(RandomFloats(64 * 32, 3))},
      {"layers.0.shared.w2", "F32", {32, 32}, F32Bytes(RandomFloats(32 * 32, 4))},
  };
}

// The file layout written out by hand: 8-byte little-endian length, JSON, data.
void WriteRaw(const std::string& path, const std::vector<RawTensor>& tensors,
              const std::string& header_override = "") {
  // Appended piece by piece: GCC 12 warns (-Wrestrict) on some chains of string operator+.
  std::string header = "{";
  uint64_t offset = 0;
  std::string data;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RawTensor& t = tensors[i];
    if (i > 0) header.append(",");
    header.append("\"").append(t.name).append("\":{\"dtype\":\"").append(t.dtype);
    header.append("\",\"shape\":[");
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) header.append(",");
      header.append(std::to_string(t.shape[d]));
    }
    header.append("],\"data_offsets\":[").append(std::to_string(offset)).append(",");
    header.append(std::to_string(offset + t.data.size())).append("]}");
    offset += t.data.size();
    data.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  header += "}";
  if (!header_override.empty()) header = header_override;
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

Status OpenStatus(const std::string& path) { return WeightSource::Open(SmallModel(path)).status(); }

TEST(HandWrittenFile, ValidFileLoadsAtTheRightOffsets) {
  const std::string path = TempPath("valid.safetensors");
  const auto tensors = SmallDenseTensors();
  WriteRaw(path, tensors);
  auto source = WeightSource::Open(SmallModel(path));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const auto dense = (*source)->LoadExpertDense(0, 1);
  ASSERT_TRUE(dense.ok());
  // Expert 1's w2 is the second half of the w2 tensor.
  std::vector<float> w2(2 * 32 * 32);
  std::memcpy(w2.data(), tensors[1].data.data(), tensors[1].data.size());
  EXPECT_TRUE(std::equal(dense->w2.begin(), dense->w2.end(), w2.begin() + 32 * 32));
  const auto shared = (*source)->LoadSharedDense(0);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(std::memcmp(shared->w1.data(), tensors[2].data.data(), tensors[2].data.size()), 0);
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, NaNNamesTensorAndIndex) {
  const std::string path = TempPath("nan.safetensors");
  auto tensors = SmallDenseTensors();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(tensors[0].data.data() + 4 * (1 * 64 * 32 + 5 * 32 + 7), &nan, 4);
  WriteRaw(path, tensors);
  auto source = WeightSource::Open(SmallModel(path));
  ASSERT_TRUE(source.ok()) << "header checks pass; values are checked at load";
  EXPECT_TRUE((*source)->LoadExpert(0, 0).ok());
  const auto expected = AllOf(HasSubstr("layers.0.experts.w1"), HasSubstr("[1,5,7]"),
                              HasSubstr("NaN"));
  const auto loaded = (*source)->LoadExpert(0, 1);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), expected);
  EXPECT_THAT((*source)->LoadExpertDense(0, 1).status().message(), expected);
  EXPECT_TRUE((*source)->CheckExperts({0}, {0}).ok());
  EXPECT_THAT((*source)->CheckExperts({0}, {0, 1}).message(), expected);
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, InfInBF16SharedTensor) {
  const std::string path = TempPath("inf.safetensors");
  auto tensors = SmallDenseTensors();
  std::vector<uint8_t> bf16(32 * 32 * 2, 0);
  const uint16_t inf = 0xFF80;  // -Inf
  std::memcpy(bf16.data() + 2 * (3 * 32 + 4), &inf, 2);
  tensors[3] = {"layers.0.shared.w2", "BF16", {32, 32}, bf16};
  WriteRaw(path, tensors);
  auto source = WeightSource::Open(SmallModel(path));
  ASSERT_TRUE(source.ok());
  const auto expected = AllOf(HasSubstr("layers.0.shared.w2"), HasSubstr("[3,4]"),
                              HasSubstr("Inf"));
  EXPECT_THAT((*source)->LoadShared(0).status().message(), expected);
  EXPECT_THAT((*source)->CheckExperts({0}, {0}).message(), expected);
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, WrongShape) {
  const std::string path = TempPath("shape.safetensors");
  auto tensors = SmallDenseTensors();
  tensors[1].shape = {2, 32, 16};
  tensors[1].data.resize(2 * 32 * 16 * 4);
  WriteRaw(path, tensors);
  const Status status = OpenStatus(path);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("layers.0.experts.w2: shape [2,32,16], expected [2,32,32]"));
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, MissingTensor) {
  const std::string path = TempPath("missing.safetensors");
  auto tensors = SmallDenseTensors();
  tensors.erase(tensors.begin() + 2);  // layers.0.shared.w1
  WriteRaw(path, tensors);
  EXPECT_THAT(OpenStatus(path).message(), HasSubstr("layers.0.shared.w1: missing"));
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, WrongDtype) {
  const std::string path = TempPath("dtype.safetensors");
  auto tensors = SmallDenseTensors();
  tensors[0].dtype = "F16";
  tensors[0].data.resize(tensors[0].data.size() / 2);
  WriteRaw(path, tensors);
  EXPECT_THAT(OpenStatus(path).message(),
              HasSubstr("layers.0.experts.w1: dtype F16, expected F32 or BF16"));
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, TruncatedFile) {
  const std::string path = TempPath("truncated.safetensors");
  WriteRaw(path, SmallDenseTensors());
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 100);
  Status status = OpenStatus(path);
  EXPECT_EQ(status.code(), StatusCode::kDataLoss);
  // The last tensor in data order loses its tail.
  EXPECT_THAT(status.message(), AllOf(HasSubstr("layers.0.shared.w2"), HasSubstr("truncated")));

  std::filesystem::resize_file(path, 40);  // inside the header
  EXPECT_THAT(OpenStatus(path).message(),
              AllOf(HasSubstr("header length"), HasSubstr("truncated")));
  std::filesystem::resize_file(path, 5);
  EXPECT_THAT(OpenStatus(path).message(), HasSubstr("too short"));
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, BadHeaderJson) {
  const std::string path = TempPath("json.safetensors");
  WriteRaw(path, SmallDenseTensors(), "{\"layers.0.experts.w1\": {\"dtype\": ");
  EXPECT_THAT(OpenStatus(path).message(), HasSubstr("header is not valid JSON"));
  WriteRaw(path, SmallDenseTensors(), "[1, 2]");
  EXPECT_THAT(OpenStatus(path).message(), HasSubstr("header is not a JSON object"));
  WriteRaw(path, {}, R"({"layers.0.experts.w1": {"dtype": "F32", "shape": [2], )"
                     R"("data_offsets": [0, 4]}})");
  EXPECT_THAT(OpenStatus(path).message(),
              AllOf(HasSubstr("layers.0.experts.w1"), HasSubstr("truncated")));
  WriteRaw(path, SmallDenseTensors(),
           R"({"layers.0.experts.w1": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})");
  EXPECT_THAT(OpenStatus(path).message(),
              AllOf(HasSubstr("layers.0.experts.w1"), HasSubstr("need 12")));
  std::filesystem::remove(path);
}

// Pre-quantized tensors of SmallModel: all-zero codes with scale 2^0, then edited by the tests.
std::vector<RawTensor> SmallQuantizedTensors() {
  return {
      {"layers.0.experts.w1.blocks", "U8", {2, 64, 16}, std::vector<uint8_t>(2 * 64 * 16, 0x21)},
      {"layers.0.experts.w1.scales", "U8", {2, 64, 1}, std::vector<uint8_t>(2 * 64, 127)},
      {"layers.0.experts.w2.blocks", "U8", {2, 32, 16}, std::vector<uint8_t>(2 * 32 * 16, 0x21)},
      {"layers.0.experts.w2.scales", "U8", {2, 32, 1}, std::vector<uint8_t>(2 * 32, 127)},
      {"layers.0.shared.w1.fp8", "U8", {64, 32}, std::vector<uint8_t>(64 * 32, 0x38)},
      {"layers.0.shared.w1.scales", "U8", {64, 1}, std::vector<uint8_t>(64, 127)},
      {"layers.0.shared.w2.fp8", "U8", {32, 32}, std::vector<uint8_t>(32 * 32, 0x38)},
      {"layers.0.shared.w2.scales", "U8", {32, 1}, std::vector<uint8_t>(32, 127)},
  };
}

TEST(HandWrittenFile, PreQuantizedCodesAreCheckedAndLoadedAsIs) {
  const std::string path = TempPath("prequant.safetensors");
  auto tensors = SmallQuantizedTensors();
  tensors[1].data[1 * 64 + 3] = 255;     // w1.scales [1,3,0]
  tensors[4].data[2 * 32 + 9] = 0xFF;    // shared.w1.fp8 [2,9]: -NaN
  WriteRaw(path, tensors);
  auto source = WeightSource::Open(SmallModel(path));
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const auto expert0 = (*source)->LoadExpert(0, 0);
  ASSERT_TRUE(expert0.ok());
  EXPECT_EQ(expert0->w1, std::vector<uint8_t>(64 * 16, 0x21));
  EXPECT_THAT((*source)->LoadExpert(0, 1).status().message(),
              HasSubstr("layers.0.experts.w1.scales: UE8M0 code 255 (NaN) at index [1,3,0]"));
  EXPECT_THAT((*source)->LoadShared(0).status().message(),
              HasSubstr("layers.0.shared.w1.fp8: E4M3 NaN code at index [2,9]"));
  EXPECT_THAT((*source)->CheckExperts({0}, {0}).message(), HasSubstr("layers.0.shared.w1.fp8"));
  std::filesystem::remove(path);
}

TEST(HandWrittenFile, BlocksWithoutScales) {
  const std::string path = TempPath("noscales.safetensors");
  auto tensors = SmallQuantizedTensors();
  tensors.erase(tensors.begin() + 3);  // layers.0.experts.w2.scales
  WriteRaw(path, tensors);
  EXPECT_THAT(OpenStatus(path).message(),
              HasSubstr("layers.0.experts.w2.scales: missing (layers.0.experts.w2.blocks is "
                        "present)"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gcmoe::engine
