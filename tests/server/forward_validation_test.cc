// The validator on its own: every catalogued bad request is refused with its code and a
// message naming the field; valid requests yield the shards and the count matrix.
#include "server/forward_validation.h"
#include "server/grpc_status.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/numerics.h"
#include "tests/server/bad_requests.h"
#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

ForwardLimits Limits(const engine::ModelSpec& spec, int world) {
  ForwardLimits l;
  l.hidden = spec.hidden;
  l.experts = spec.num_experts;
  l.top_k = spec.top_k;
  l.layers = spec.num_layers;
  l.max_tokens = 1024 * world;
  l.world_size = world;
  return l;
}

TEST(ForwardValidationTest, EveryCataloguedBadRequestIsRefusedNamingTheField) {
  const engine::ModelSpec spec = DefaultModel();
  const auto catalogue = BadRequestCatalogue(spec, 2048);
  ASSERT_GE(catalogue.size(), 25u);
  for (const BadRequest& bad : catalogue) {
    gcmoe::v1::ForwardRequest request = BaseBadRequest(spec);
    bad.mutate(&request);
    ValidatedForward out;
    const Status status = ValidateForward(request, Limits(spec, 2), &out);
    ASSERT_FALSE(status.ok()) << bad.name;
    EXPECT_EQ(static_cast<int>(ToGrpcCode(status.code())), static_cast<int>(bad.code))
        << bad.name << ": " << status.ToString();
    EXPECT_NE(status.message().find(bad.message_contains), std::string::npos)
        << bad.name << ": \"" << status.message() << "\" lacks \"" << bad.message_contains
        << "\"";
  }
}

// Bytes from a registered region go through the same checks: every catalogued request whose
// tensors are moved out of the message into separate buffers (as a region's would be) gets the
// same code and message, but for the size field, which names the region's byte_size.
TEST(ForwardValidationTest, RegionBytesAreValidatedLikeInlineBytes) {
  const engine::ModelSpec spec = DefaultModel();
  for (const BadRequest& bad : BadRequestCatalogue(spec, 2048)) {
    gcmoe::v1::ForwardRequest request = BaseBadRequest(spec);
    bad.mutate(&request);
    ValidatedForward inline_out;
    const Status inline_status = ValidateForward(request, Limits(spec, 2), &inline_out);
    // The same bytes, held elsewhere and marked as a region's.
    std::vector<std::string> held;
    held.reserve(4);  // the spans point into these strings
    ForwardBytes bytes;
    for (auto [tensor, span] : {std::pair{request.mutable_hidden(), &bytes.hidden},
                                {request.mutable_hidden_scales(), &bytes.hidden_scales},
                                {request.mutable_topk_ids(), &bytes.topk_ids},
                                {request.mutable_topk_weights(), &bytes.topk_weights}}) {
      held.push_back(tensor->data());
      *span = TensorBytes{reinterpret_cast<const uint8_t*>(held.back().data()),
                          held.back().size(), true};
      tensor->clear_data();
      if (tensor->dtype() != gcmoe::v1::DTYPE_UNSPECIFIED || tensor->shape_size() > 0 ||
          !held.back().empty()) {
        tensor->mutable_region()->set_region("r");
      }
    }
    ValidatedForward region_out;
    const Status region_status = ValidateForward(request, bytes, Limits(spec, 2), &region_out);
    EXPECT_EQ(region_status.code(), inline_status.code()) << bad.name;
    std::string expected = inline_status.message();
    for (const char* field : {"hidden", "hidden_scales", "topk_ids", "topk_weights"}) {
      const std::string inline_field = std::string(field) + ".data: ";
      if (expected.rfind(inline_field, 0) == 0) {
        expected = std::string(field) + ".region.byte_size: " + expected.substr(inline_field.size());
      }
    }
    EXPECT_EQ(region_status.message(), expected) << bad.name;
  }
}

TEST(ForwardValidationTest, ValidRequestGivesShardsAndCountMatrix) {
  const engine::ModelSpec spec = DefaultModel();
  RequestSpec r;
  r.num_tokens = 11;
  r.unused_every = 3;
  const gcmoe::v1::ForwardRequest request = MakeForwardRequest(spec, r);
  ValidatedForward out;
  ASSERT_TRUE(ValidateForward(request, Limits(spec, 4), &out).ok());
  EXPECT_EQ(out.tokens_per_rank, (std::vector<int>{3, 3, 3, 2}));
  // Recount independently from the raw ids.
  std::vector<int64_t> expected(4 * spec.num_experts, 0);
  const std::string& ids = request.topk_ids().data();
  for (int t = 0; t < 11; ++t) {
    const int src = t < 3 ? 0 : t < 6 ? 1 : t < 9 ? 2 : 3;
    for (int j = 0; j < spec.top_k; ++j) {
      int32_t e;
      std::memcpy(&e, ids.data() + 4 * (t * spec.top_k + j), 4);
      if (e >= 0) ++expected[src * spec.num_experts + e];
    }
  }
  EXPECT_EQ(out.counts, expected);
  int64_t total = 0;
  for (int64_t c : out.counts) total += c;
  EXPECT_LT(total, 11 * spec.top_k);  // some slots are unused
}

TEST(ForwardValidationTest, ShardSizesAreContiguousAndBalanced) {
  EXPECT_EQ(ShardSizes(1, 4), (std::vector<int>{1, 0, 0, 0}));
  EXPECT_EQ(ShardSizes(8, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(ShardSizes(10, 4), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(ShardSizes(5, 1), (std::vector<int>{5}));
}
gcmoe::v1::Tensor OutputTensor(gcmoe::v1::DType dtype, const std::vector<float>& values, int cols) {
  gcmoe::v1::Tensor t;
  t.set_dtype(dtype);
  t.add_shape(static_cast<int64_t>(values.size()) / cols);
  t.add_shape(cols);
  if (dtype == gcmoe::v1::FP32) {
    t.set_data(values.data(), values.size() * 4);
  } else {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = numerics::FloatToBF16(values[i]);
    t.set_data(bits.data(), bits.size() * 2);
  }
  return t;
}

Status ValidateOutput(const gcmoe::v1::Tensor& t) {
  return ValidateForwardOutput(t.dtype(), reinterpret_cast<const uint8_t*>(t.data().data()),
                               t.data().size(), t.shape(1));
}

TEST(ForwardValidationTest, AnOutputWithInfOrNanIsNeverValid) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto dtype : {gcmoe::v1::FP32, gcmoe::v1::BF16}) {
    std::vector<float> values(3 * 8, 1.5f);
    values[8 + 5] = -3e38f;  // finite in both dtypes
    EXPECT_TRUE(ValidateOutput(OutputTensor(dtype, values, 8)).ok());
    values[2 * 8 + 3] = inf;
    Status status = ValidateOutput(OutputTensor(dtype, values, 8));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("output: element [2, 3] is Inf"), std::string::npos)
        << status.message();
    values[1] = nan;
    status = ValidateOutput(OutputTensor(dtype, values, 8));
    EXPECT_NE(status.message().find("output: element [0, 1] is NaN"), std::string::npos)
        << status.message();
  }
}

TEST(ForwardValidationTest, MagnitudesUpToTheBoundsAreAccepted) {
  const engine::ModelSpec spec = DefaultModel();
  RequestSpec r;
  r.num_tokens = 4;
  gcmoe::v1::ForwardRequest request = MakeForwardRequest(spec, r);
  const float activation = kMaxActivationMagnitude;
  const float weight = -kMaxRoutingWeightMagnitude;
  std::memcpy(request.mutable_hidden()->mutable_data()->data() + 4 * 3, &activation, 4);
  std::memcpy(request.mutable_topk_weights()->mutable_data()->data() + 4 * 1, &weight, 4);
  ValidatedForward out;
  EXPECT_TRUE(ValidateForward(request, Limits(spec, 2), &out).ok());
  const float over = std::nextafter(kMaxActivationMagnitude, 1e38f);
  std::memcpy(request.mutable_hidden()->mutable_data()->data() + 4 * 3, &over, 4);
  const Status status = ValidateForward(request, Limits(spec, 2), &out);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("hidden: element [0, 3]"), std::string::npos) << status.message();
}

// The checks scan every value in one vectorized pass and name a value only when that pass finds
// one out of bounds: the bounds are exact in every dtype, right at the limit.
TEST(ForwardValidationTest, BoundsAreExactInBf16AndFp8) {
  const engine::ModelSpec spec = DefaultModel();
  ValidatedForward out;
  RequestSpec r;
  r.num_tokens = 4;
  r.dtype = gcmoe::v1::BF16;
  gcmoe::v1::ForwardRequest bf16 = MakeForwardRequest(spec, r);
  auto poke16 = [&bf16](int index, uint16_t bits) {
    std::memcpy(bf16.mutable_hidden()->mutable_data()->data() + 2 * index, &bits, 2);
  };
  poke16(spec.hidden + 5, 0xCF80);  // -2^32
  EXPECT_TRUE(ValidateForward(bf16, Limits(spec, 2), &out).ok());
  poke16(spec.hidden + 5, 0xCF81);  // the next BF16 below it
  Status status = ValidateForward(bf16, Limits(spec, 2), &out);
  EXPECT_NE(status.message().find("hidden: element [1, 5] is -4.3"), std::string::npos)
      << status.message();

  r.dtype = gcmoe::v1::FP8_E4M3;
  gcmoe::v1::ForwardRequest fp8 = MakeForwardRequest(spec, r);
  uint8_t* codes = reinterpret_cast<uint8_t*>(fp8.mutable_hidden()->mutable_data()->data());
  uint8_t* scales = reinterpret_cast<uint8_t*>(fp8.mutable_hidden_scales()->mutable_data()->data());
  // Block 0 of token 0: E4M3 448 (0x7E) under scale 2^23 is 3.76e9 <= 2^32.
  codes[7] = 0x7E;
  scales[0] = 127 + 23;
  EXPECT_TRUE(ValidateForward(fp8, Limits(spec, 2), &out).ok());
  // Under 2^24 the block's largest code decides: 1.0 gives 2^24 (fine), 448 gives 7.5e9.
  scales[0] = 127 + 24;
  for (int i = 0; i < 32; ++i) codes[i] = 0x38;  // E4M3 1.0
  EXPECT_TRUE(ValidateForward(fp8, Limits(spec, 2), &out).ok());
  codes[7] = 0x7E;
  status = ValidateForward(fp8, Limits(spec, 2), &out);
  EXPECT_NE(status.message().find("hidden: element [0, 7] decodes to 7.5"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace gcmoe::server::testing
