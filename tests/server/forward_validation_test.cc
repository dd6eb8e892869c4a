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

TEST(ForwardValidationTest, AnOutputWithInfOrNanIsNeverValid) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto dtype : {gcmoe::v1::FP32, gcmoe::v1::BF16}) {
    std::vector<float> values(3 * 8, 1.5f);
    values[8 + 5] = -3e38f;  // finite in both dtypes
    EXPECT_TRUE(ValidateForwardOutput(OutputTensor(dtype, values, 8)).ok());
    values[2 * 8 + 3] = inf;
    Status status = ValidateForwardOutput(OutputTensor(dtype, values, 8));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("output: element [2, 3] is Inf"), std::string::npos)
        << status.message();
    values[1] = nan;
    status = ValidateForwardOutput(OutputTensor(dtype, values, 8));
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

}  // namespace
}  // namespace gcmoe::server::testing
