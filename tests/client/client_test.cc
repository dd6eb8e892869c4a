// The client's pieces without a server: request encodings, .npy files, random routing and the
// summary's arithmetic.
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/npy.h"
#include "client/requests.h"
#include "client/summary.h"
#include "client/tensors.h"
#include "common/number_formats.h"

namespace gcmoe::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RequestArrays SmallRequest() {
  RandomRequestOptions o;
  o.tokens = 5;
  o.hidden = 64;
  o.experts = 8;
  o.top_k = 3;
  o.seed = 7;
  return RandomRequest(o);
}

template <typename T>
std::vector<T> Elements(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

TEST(ClientRequests, RandomRequestHasTheModelsShapeAndValidRouting) {
  const RequestArrays a = SmallRequest();
  ASSERT_EQ(a.hidden_values.size(), 5u * 64);
  ASSERT_EQ(a.topk_ids.size(), 5u * 3);
  ASSERT_EQ(a.topk_weights.size(), 5u * 3);
  for (int t = 0; t < 5; ++t) {
    std::set<int> experts;
    float sum = 0.0f;
    for (int s = 0; s < 3; ++s) {
      const int e = a.topk_ids[t * 3 + s];
      EXPECT_GE(e, 0);
      EXPECT_LT(e, 8);
      experts.insert(e);
      EXPECT_GT(a.topk_weights[t * 3 + s], 0.0f);
      sum += a.topk_weights[t * 3 + s];
    }
    EXPECT_EQ(experts.size(), 3u) << "token " << t << " repeats an expert";
    EXPECT_NEAR(sum, 1.0f, 1e-6f);
  }
  // Unit-scale activations.
  double sum_sq = 0.0;
  for (const float v : a.hidden_values) sum_sq += v * v;
  EXPECT_NEAR(sum_sq / a.hidden_values.size(), 1.0, 0.25);
}

TEST(ClientRequests, SeedsMakeRequestsReproducibleAndDistinct) {
  RandomRequestOptions o{.tokens = 4, .hidden = 32, .experts = 16, .top_k = 4, .seed = 3};
  EXPECT_EQ(RandomRequest(o).hidden_values, RandomRequest(o).hidden_values);
  EXPECT_EQ(RandomRequest(o).topk_ids, RandomRequest(o).topk_ids);
  RandomRequestOptions other = o;
  other.seed = 4;
  EXPECT_NE(RandomRequest(o).hidden_values, RandomRequest(other).hidden_values);
}

std::vector<int> ExpertCounts(double skew) {
  RandomRequestOptions o{.tokens = 4000,
                         .hidden = 32,
                         .experts = 16,
                         .top_k = 2,
                         .skew = skew,
                         .popularity_seed = 11,
                         .seed = 5};
  const RequestArrays a = RandomRequest(o);
  std::vector<int> counts(16, 0);
  for (const int e : a.topk_ids) ++counts[e];
  return counts;
}

TEST(ClientRequests, SkewConcentratesRoutingOnHotExperts) {
  // 8000 assignments over 16 experts: 500 each when uniform.
  const std::vector<int> uniform = ExpertCounts(0.0);
  EXPECT_LT(*std::max_element(uniform.begin(), uniform.end()), 600);
  EXPECT_GT(*std::min_element(uniform.begin(), uniform.end()), 400);

  const std::vector<int> skewed = ExpertCounts(1.5);
  const int hottest = *std::max_element(skewed.begin(), skewed.end());
  EXPECT_GT(hottest, 1000);
  EXPECT_LT(*std::min_element(skewed.begin(), skewed.end()), 300);
  // The hot expert is the one the popularity ranking put first.
  const std::vector<double> p = ExpertPopularity(16, 1.5, 11);
  const size_t top = std::max_element(p.begin(), p.end()) - p.begin();
  EXPECT_EQ(skewed[top], hottest);
  double total = 0.0;
  for (const double v : p) total += v;
  EXPECT_NEAR(total, 1.0, 1e-12);
}

TEST(ClientTensors, Bf16RequestBytesAreRoundedFloats) {
  const RequestArrays a = SmallRequest();
  Result<v1::ForwardRequest> r = BuildForwardRequest(a, 1, v1::BF16, v1::FP32, "id-1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->layer(), 1u);
  EXPECT_EQ(r->request_id(), "id-1");
  EXPECT_EQ(r->output_dtype(), v1::FP32);
  EXPECT_EQ(r->hidden().dtype(), v1::BF16);
  EXPECT_THAT(r->hidden().shape(), ElementsAre(5, 64));
  ASSERT_EQ(r->hidden().data().size(), 5u * 64 * 2);
  const std::vector<uint16_t> bits = Elements<uint16_t>(r->hidden().data());
  for (size_t i = 0; i < bits.size(); ++i) {
    ASSERT_EQ(bits[i], numerics::FloatToBF16(a.hidden_values[i])) << i;
  }
  EXPECT_FALSE(r->has_hidden_scales());
  EXPECT_EQ(r->topk_ids().dtype(), v1::INT32);
  EXPECT_THAT(r->topk_ids().shape(), ElementsAre(5, 3));
  EXPECT_EQ(Elements<int32_t>(r->topk_ids().data()), a.topk_ids);
  EXPECT_EQ(r->topk_weights().dtype(), v1::FP32);
  EXPECT_THAT(r->topk_weights().shape(), ElementsAre(5, 3));
  EXPECT_EQ(Elements<float>(r->topk_weights().data()), a.topk_weights);
  EXPECT_EQ(PayloadBytes(*r), 5 * 64 * 2 + 5 * 3 * 4 * 2);
}

TEST(ClientTensors, Fp32RequestBytesAreTheFloats) {
  const RequestArrays a = SmallRequest();
  Result<v1::ForwardRequest> r = BuildForwardRequest(a, 0, v1::FP32, v1::BF16, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hidden().dtype(), v1::FP32);
  EXPECT_EQ(Elements<float>(r->hidden().data()), a.hidden_values);
}

TEST(ClientTensors, Fp8RequestIsE4M3WithOneUe8m0ScalePer32ValuesOfEachToken) {
  RequestArrays a = SmallRequest();
  // A known block: token 0's first 32 values are 0..31, so amax 31: scale 2^ceil(log2(31/448))
  // = 2^-3 (UE8M0 code 124), and 1.0 / 2^-3 = 8 is E4M3 0x50.
  for (int i = 0; i < 32; ++i) a.hidden_values[i] = static_cast<float>(i);
  Result<v1::ForwardRequest> r = BuildForwardRequest(a, 0, v1::FP8_E4M3, v1::BF16, "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->hidden().dtype(), v1::FP8_E4M3);
  EXPECT_THAT(r->hidden().shape(), ElementsAre(5, 64));
  ASSERT_EQ(r->hidden().data().size(), 5u * 64);
  EXPECT_EQ(r->hidden_scales().dtype(), v1::UE8M0);
  EXPECT_THAT(r->hidden_scales().shape(), ElementsAre(5, 2));
  ASSERT_EQ(r->hidden_scales().data().size(), 10u);
  const std::vector<uint8_t> codes = Elements<uint8_t>(r->hidden().data());
  const std::vector<uint8_t> scales = Elements<uint8_t>(r->hidden_scales().data());
  EXPECT_EQ(scales[0], 124);
  EXPECT_EQ(codes[1], 0x50);
  EXPECT_EQ(codes[0], 0x00);

  // Every token quantized on its own, as the engine's E4M3-K32 does for one row.
  std::vector<uint8_t> expected_codes(64);
  std::vector<uint8_t> expected_scales(2);
  for (int t = 0; t < 5; ++t) {
    numerics::QuantizeE4M3K32(a.hidden_values.data() + t * 64, 64, expected_codes.data(),
                              expected_scales.data());
    EXPECT_EQ(std::vector<uint8_t>(codes.begin() + t * 64, codes.begin() + (t + 1) * 64),
              expected_codes);
    EXPECT_EQ(std::vector<uint8_t>(scales.begin() + t * 2, scales.begin() + (t + 1) * 2),
              expected_scales);
  }
  // Dequantized within E4M3's half-ulp (2^-4 relative) of the input, plus the block's floor.
  std::vector<float> back(64);
  for (int t = 0; t < 5; ++t) {
    numerics::DequantizeE4M3K32(codes.data() + t * 64, scales.data() + t * 2, 64, back.data());
    for (int i = 0; i < 64; ++i) {
      const float x = a.hidden_values[t * 64 + i];
      const float scale = numerics::DecodeUE8M0(scales[t * 2 + i / 32]);
      EXPECT_NEAR(back[i], x, std::fabs(x) / 16 + scale * 0.002f) << t << "," << i;
    }
  }
}

TEST(ClientTensors, RejectsWhatTheApiCannotCarry) {
  RequestArrays a = SmallRequest();
  a.hidden = 48;  // FP8 scales need H % 32 == 0
  a.hidden_values.resize(5 * 48);
  Result<v1::ForwardRequest> fp8 = BuildForwardRequest(a, 0, v1::FP8_E4M3, v1::BF16, "");
  ASSERT_FALSE(fp8.ok());
  EXPECT_THAT(fp8.status().message(), HasSubstr("multiple of 32"));
  EXPECT_FALSE(BuildForwardRequest(a, 0, v1::INT32, v1::BF16, "").ok());
  a.topk_ids.pop_back();
  EXPECT_FALSE(BuildForwardRequest(a, 0, v1::BF16, v1::BF16, "").ok());
}

TEST(ClientTensors, DecodesBf16AndFp32OutputsAndChecksTheirSize) {
  v1::Tensor t;
  t.set_dtype(v1::BF16);
  t.add_shape(1);
  t.add_shape(3);
  const uint16_t bits[3] = {0x3F80, 0xC040, 0x7FC0};  // 1.0, -3.0, NaN
  t.set_data(reinterpret_cast<const char*>(bits), sizeof(bits));
  Result<std::vector<float>> v = DecodeFloatTensor(t);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((*v)[0], 1.0f);
  EXPECT_EQ((*v)[1], -3.0f);
  EXPECT_TRUE(std::isnan((*v)[2]));

  const OutputCheck check = CheckOutput(*v);
  EXPECT_EQ(check.values, 3);
  EXPECT_EQ(check.nan, 1);
  EXPECT_DOUBLE_EQ(check.sum_abs, 4.0);

  const float floats[3] = {0.5f, 2.0f, -1.0f};
  t.set_dtype(v1::FP32);
  t.set_data(reinterpret_cast<const char*>(floats), sizeof(floats));
  v = DecodeFloatTensor(t);
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(*v, ElementsAre(0.5f, 2.0f, -1.0f));

  t.add_shape(2);  // [1, 3, 2] needs 24 bytes, the data has 12
  EXPECT_THAT(DecodeFloatTensor(t).status().message(), HasSubstr("holds 12 bytes"));
  t.set_dtype(v1::FP8_E4M3);
  EXPECT_FALSE(DecodeFloatTensor(t).ok());
}

TEST(ClientTensors, DTypeNames) {
  v1::DType d = v1::DTYPE_UNSPECIFIED;
  EXPECT_TRUE(ParseDTypeName("fp8", &d));
  EXPECT_EQ(d, v1::FP8_E4M3);
  EXPECT_TRUE(ParseDTypeName("bf16", &d));
  EXPECT_EQ(d, v1::BF16);
  EXPECT_TRUE(ParseDTypeName("fp32", &d));
  EXPECT_EQ(d, v1::FP32);
  EXPECT_FALSE(ParseDTypeName("int8", &d));
  EXPECT_EQ(DTypeName(v1::FP8_E4M3), "fp8_e4m3");
}

// np.save(f, np.arange(6, dtype="<i4").reshape(2, 3)), byte for byte (numpy 1.24).
std::string NumpyInt32Bytes() {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  header.append(117 - header.size(), ' ');
  header += '\n';
  std::string bytes("\x93NUMPY\x01\x00\x76\x00", 10);
  bytes += header;
  for (int32_t i = 0; i < 6; ++i) bytes.append(reinterpret_cast<const char*>(&i), 4);
  return bytes;
}

TEST(ClientNpy, ReadsWhatNumpyWrites) {
  const std::string bytes = NumpyInt32Bytes();
  ASSERT_EQ(bytes.size(), 152u);
  Result<NpyArray> a = ParseNpy(bytes, "ids.npy");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->descr, "<i4");
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  Result<std::vector<int32_t>> ints = NpyToInt32(*a, "ids.npy");
  ASSERT_TRUE(ints.ok());
  EXPECT_THAT(*ints, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_FALSE(NpyToFloat(*a, "ids.npy").ok());
}

TEST(ClientNpy, WritesWhatItReadsWithNumpysLayout) {
  const std::string path = ::testing::TempDir() + "client_test_out.npy";
  ASSERT_TRUE(WriteNpyFloat32(path, {2, 3}, {1, 2, 3, 4, 5, -6.5f}).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 128u + 24u);  // header padded to 64 bytes, as numpy pads it
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes[127], '\n');
  Result<NpyArray> a = ReadNpy(path);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  Result<std::vector<float>> v = NpyToFloat(*a, path);
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(*v, ElementsAre(1, 2, 3, 4, 5, -6.5f));

  ASSERT_TRUE(WriteNpyFloat32(path, {4}, {1, 2, 3, 4}).ok());
  a = ReadNpy(path);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->shape, ElementsAre(4));
}

TEST(ClientNpy, RejectsWhatItCannotRead) {
  EXPECT_THAT(ParseNpy("not numpy at all", "x.npy").status().message(), HasSubstr("not a .npy"));
  std::string fortran = NumpyInt32Bytes();
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_THAT(ParseNpy(fortran, "x.npy").status().message(), HasSubstr("ascontiguousarray"));
  std::string truncated = NumpyInt32Bytes();
  truncated.pop_back();
  EXPECT_THAT(ParseNpy(truncated, "x.npy").status().message(), HasSubstr("data bytes"));
  std::string unsigned_bytes = NumpyInt32Bytes();
  unsigned_bytes.replace(unsigned_bytes.find("<i4"), 3, "|u1");
  EXPECT_THAT(ParseNpy(unsigned_bytes, "x.npy").status().message(), HasSubstr("not supported"));
  EXPECT_EQ(ReadNpy(::testing::TempDir() + "no-such.npy").status().code(), StatusCode::kNotFound);
}

TEST(ClientNpy, Int64IdsMustFitInt32) {
  NpyArray a;
  a.descr = "<i8";
  a.shape = {2};
  const int64_t values[2] = {3, int64_t{1} << 40};
  a.data.assign(reinterpret_cast<const char*>(values), sizeof(values));
  EXPECT_THAT(NpyToInt32(a, "ids").status().message(), HasSubstr("does not fit int32"));
  a.shape = {1};
  a.data.resize(8);
  Result<std::vector<int32_t>> ok = NpyToInt32(a, "ids");
  ASSERT_TRUE(ok.ok());
  EXPECT_THAT(*ok, ElementsAre(3));
}

TEST(ClientSummary, PercentilesAreNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 90), 90);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Percentile(v, 0), 1);
  EXPECT_EQ(Percentile({7.0}, 99), 7.0);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 50), 2);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 51), 3);
  EXPECT_EQ(Percentile({}, 50), 0.0);
}

TEST(ClientSummary, SpatialUtilizationIsMeanOverMax) {
  google::protobuf::RepeatedField<int64_t> loads;
  loads.Add(30);
  loads.Add(10);
  EXPECT_DOUBLE_EQ(SpatialUtilization(loads), 20.0 / 30.0);
  loads.Set(1, 30);
  EXPECT_DOUBLE_EQ(SpatialUtilization(loads), 1.0);
  EXPECT_EQ(SpatialUtilization(google::protobuf::RepeatedField<int64_t>()), 0.0);
}

TEST(ClientSummary, CountsOutcomesAndReportsTheServersStats) {
  ForwardSummary summary;
  v1::ForwardResponse response;
  response.mutable_output()->set_dtype(v1::BF16);
  response.mutable_output()->add_shape(8);
  response.mutable_output()->add_shape(64);
  v1::ForwardStats* stats = response.mutable_stats();
  stats->set_engine_ns(2000000);
  stats->set_balancer_enabled(true);
  stats->set_relief_passes(12);
  stats->set_relief_solve_ns(3500);
  for (const int64_t l : {30, 10}) stats->add_load_before(l);
  for (const int64_t l : {20, 20}) stats->add_load_after(l);
  summary.AddOk(100.0, response, CheckOutput({1.0f, -3.0f}));
  summary.AddOk(300.0, response, CheckOutput({2.0f, 2.0f}));
  summary.AddFailure(50.0, "UNAVAILABLE", "rank 1 is not ready");
  summary.AddFailure(60.0, "UNAVAILABLE", "rank 1 is still not ready");
  EXPECT_EQ(summary.ok(), 2);
  EXPECT_EQ(summary.failed(), 2);
  EXPECT_TRUE(summary.outputs_finite());

  const std::string text = summary.Format({.tokens_per_request = 8, .wall_s = 0.5});
  EXPECT_THAT(text, HasSubstr("4 sent, 2 ok, 2 failed"));
  EXPECT_THAT(text, HasSubstr("UNAVAILABLE x2: rank 1 is not ready"));
  EXPECT_THAT(text, HasSubstr("32.0 tokens/s, 4.0 requests/s"));
  EXPECT_THAT(text, HasSubstr("p50 60.0  p90 300.0  p99 300.0  max 300.0 us"));
  EXPECT_THAT(text, HasSubstr("engine p50 2000.0 mean 2000.0 us"));
  EXPECT_THAT(text, HasSubstr("mean(L)/max(L) 0.667 before -> 1.000 after balancing; relief "
                              "12.0 passes, 3.50 us"));
  EXPECT_THAT(text, HasSubstr("before [60 20] after [40 40]"));
  EXPECT_THAT(text, HasSubstr("[8, 64] bf16, mean |y| 2.000000, NaN 0, Inf 0"));

  summary.AddOk(1.0, response, CheckOutput({NAN}));
  EXPECT_FALSE(summary.outputs_finite());
}

}  // namespace
}  // namespace gcmoe::client
