// The validator on its own: every catalogued bad request is refused with its code and a
// message naming the field; valid requests yield the shards and the count matrix.
#include "server/forward_validation.h"
#include "server/grpc_status.h"

#include <gtest/gtest.h>

#include <cstring>

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

}  // namespace
}  // namespace gcmoe::server::testing
