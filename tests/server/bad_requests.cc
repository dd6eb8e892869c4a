#include "tests/server/bad_requests.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/server/service_harness.h"

namespace gcmoe::server::testing {
namespace {

using gcmoe::v1::ForwardRequest;
using grpc::StatusCode;

template <typename T>
void Poke(std::string* data, size_t index, T value) {
  std::memcpy(data->data() + index * sizeof(T), &value, sizeof(T));
}

ForwardRequest WithDType(const engine::ModelSpec& spec, gcmoe::v1::DType dtype) {
  RequestSpec r;
  r.num_tokens = 4;
  r.dtype = dtype;
  r.seed = 11;
  return MakeForwardRequest(spec, r);
}

}  // namespace

ForwardRequest BaseBadRequest(const engine::ModelSpec& spec) {
  return WithDType(spec, gcmoe::v1::FP32);
}

std::vector<BadRequest> BadRequestCatalogue(const engine::ModelSpec& spec, int max_tokens) {
  const int H = spec.hidden;
  const int k = spec.top_k;
  const int E = spec.num_experts;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const ForwardRequest bf16 = WithDType(spec, gcmoe::v1::BF16);
  const ForwardRequest fp8 = WithDType(spec, gcmoe::v1::FP8_E4M3);
  const auto INVALID = StatusCode::INVALID_ARGUMENT;
  return {
      {"hidden dtype INT32", [](ForwardRequest* r) { r->mutable_hidden()->set_dtype(gcmoe::v1::INT32); },
       INVALID, "hidden.dtype: INT32"},
      {"hidden dtype unspecified",
       [](ForwardRequest* r) { r->mutable_hidden()->set_dtype(gcmoe::v1::DTYPE_UNSPECIFIED); },
       INVALID, "hidden.dtype"},
      {"hidden dtype UE8M0", [](ForwardRequest* r) { r->mutable_hidden()->set_dtype(gcmoe::v1::UE8M0); },
       INVALID, "expected BF16, FP32 or FP8_E4M3"},
      {"hidden missing", [](ForwardRequest* r) { r->clear_hidden(); }, INVALID, "hidden: missing"},
      {"hidden 1-D",
       [](ForwardRequest* r) {
         r->mutable_hidden()->clear_shape();
         r->mutable_hidden()->add_shape(4 * 256);
       },
       INVALID, "hidden.shape"},
      {"hidden 3-D",
       [](ForwardRequest* r) {
         r->mutable_hidden()->clear_shape();
         for (int d : {1, 4, 256}) r->mutable_hidden()->add_shape(d);
       },
       INVALID, "3 dimension(s)"},
      {"hidden wrong H",
       [](ForwardRequest* r) {
         r->mutable_hidden()->set_shape(1, 128);
         r->mutable_hidden()->mutable_data()->resize(4 * 128 * 4);
       },
       INVALID, "hidden.shape[1]: 128, expected H = " + std::to_string(H)},
      {"hidden negative dimension", [](ForwardRequest* r) { r->mutable_hidden()->set_shape(0, -4); },
       INVALID, "negative"},
      {"hidden bytes short",
       [H](ForwardRequest* r) { r->mutable_hidden()->mutable_data()->resize(4 * H * 4 - 4); },
       INVALID, "hidden.data"},
      {"hidden bytes long", [](ForwardRequest* r) { r->mutable_hidden()->mutable_data()->append("abcd"); },
       INVALID, "hidden.data"},
      {"empty batch",
       [](ForwardRequest* r) {
         for (auto* t : {r->mutable_hidden(), r->mutable_topk_ids(), r->mutable_topk_weights()}) {
           t->set_shape(0, 0);
           t->clear_data();
         }
       },
       INVALID, "empty"},
      {"over capacity",
       [max_tokens, H, k](ForwardRequest* r) {
         const int T = max_tokens + 1;
         r->mutable_hidden()->set_shape(0, T);
         r->mutable_hidden()->mutable_data()->assign(static_cast<size_t>(T) * H * 4, '\0');
         r->mutable_topk_ids()->set_shape(0, T);
         r->mutable_topk_ids()->mutable_data()->assign(static_cast<size_t>(T) * k * 4, '\xff');
         r->mutable_topk_weights()->set_shape(0, T);
         r->mutable_topk_weights()->mutable_data()->assign(static_cast<size_t>(T) * k * 4, '\0');
       },
       StatusCode::RESOURCE_EXHAUSTED, "capacity"},
      {"unknown layer", [&spec](ForwardRequest* r) { r->set_layer(spec.num_layers); },
       StatusCode::NOT_FOUND, "layer: " + std::to_string(spec.num_layers)},
      {"unknown layer, huge", [](ForwardRequest* r) { r->set_layer(4000000000u); }, StatusCode::NOT_FOUND,
       "not a layer"},
      {"NaN activation", [nan](ForwardRequest* r) { Poke(r->mutable_hidden()->mutable_data(), 5, nan); },
       INVALID, "element [0, 5] is NaN"},
      {"Inf activation",
       [inf, H](ForwardRequest* r) { Poke(r->mutable_hidden()->mutable_data(), H + 7, -inf); },
       INVALID, "element [1, 7] is Inf"},
      {"BF16 NaN activation",
       [bf16](ForwardRequest* r) {
         *r = bf16;
         Poke<uint16_t>(r->mutable_hidden()->mutable_data(), 3, 0x7FC1);
       },
       INVALID, "is NaN"},
      {"BF16 Inf activation",
       [bf16](ForwardRequest* r) {
         *r = bf16;
         Poke<uint16_t>(r->mutable_hidden()->mutable_data(), 9, 0xFF80);
       },
       INVALID, "is Inf"},
      // Finite but beyond the documented magnitudes (DESIGN.md §4): the layer would overflow.
      {"huge activation 3e38",
       [H](ForwardRequest* r) { Poke(r->mutable_hidden()->mutable_data(), 2 * H + 1, 3e38f); },
       INVALID, "hidden: element [2, 1] is 3e+38, expected a magnitude of at most 2^32"},
      {"activation just over 2^32",
       [](ForwardRequest* r) { Poke(r->mutable_hidden()->mutable_data(), 4, -4.3e9f); }, INVALID,
       "hidden: element [0, 4] is -4.3e+09"},
      {"BF16 huge activation",
       [bf16](ForwardRequest* r) {
         *r = bf16;
         Poke<uint16_t>(r->mutable_hidden()->mutable_data(), 6, 0x7F61);  // about 3e38
       },
       INVALID, "hidden: element [0, 6] is 2.99"},
      {"FP8 activation huge through its scale",
       [fp8](ForwardRequest* r) {
         *r = fp8;
         Poke<uint8_t>(r->mutable_hidden_scales()->mutable_data(), 0, 254);  // 2^127
       },
       INVALID, "with its scale, expected a magnitude of at most 2^32"},
      {"routing weight 3e38",
       [k](ForwardRequest* r) { Poke(r->mutable_topk_weights()->mutable_data(), k + 2, 3e38f); },
       INVALID, "topk_weights: element [1, 2] is 3e+38, expected a magnitude of at most 2^16"},
      {"FP8 NaN code",
       [fp8](ForwardRequest* r) {
         *r = fp8;
         Poke<uint8_t>(r->mutable_hidden()->mutable_data(), 2, 0xFF);
       },
       INVALID, "E4M3 NaN"},
      {"FP8 without scales",
       [fp8](ForwardRequest* r) {
         *r = fp8;
         r->clear_hidden_scales();
       },
       INVALID, "hidden_scales: missing"},
      {"FP8 scales wrong shape",
       [fp8](ForwardRequest* r) {
         *r = fp8;
         r->mutable_hidden_scales()->set_shape(1, 4);
       },
       INVALID, "hidden_scales.shape"},
      {"FP8 scales wrong dtype",
       [fp8](ForwardRequest* r) {
         *r = fp8;
         r->mutable_hidden_scales()->set_dtype(gcmoe::v1::INT32);
       },
       INVALID, "hidden_scales.dtype: INT32, expected UE8M0"},
      {"FP8 scale code 255",
       [fp8](ForwardRequest* r) {
         *r = fp8;
         Poke<uint8_t>(r->mutable_hidden_scales()->mutable_data(), 1, 255);
       },
       INVALID, "UE8M0 NaN"},
      {"scales with FP32 hidden",
       [fp8](ForwardRequest* r) { *r->mutable_hidden_scales() = fp8.hidden_scales(); }, INVALID,
       "hidden_scales: given with FP32"},
      {"topk_ids dtype FP32", [](ForwardRequest* r) { r->mutable_topk_ids()->set_dtype(gcmoe::v1::FP32); },
       INVALID, "topk_ids.dtype: FP32, expected INT32"},
      {"topk_ids missing", [](ForwardRequest* r) { r->clear_topk_ids(); }, INVALID,
       "topk_ids: missing"},
      {"topk_ids k+1 columns",
       [k](ForwardRequest* r) {
         r->mutable_topk_ids()->set_shape(1, k + 1);
         r->mutable_topk_ids()->mutable_data()->resize(4 * (k + 1) * 4);
       },
       INVALID, "topk_ids.shape"},
      {"topk_ids too few rows",
       [k](ForwardRequest* r) {
         r->mutable_topk_ids()->set_shape(0, 3);
         r->mutable_topk_ids()->mutable_data()->resize(3 * k * 4);
       },
       INVALID, "topk_ids.shape"},
      {"topk_ids bytes short", [](ForwardRequest* r) { r->mutable_topk_ids()->mutable_data()->pop_back(); },
       INVALID, "topk_ids.data"},
      {"expert id = E",
       [E](ForwardRequest* r) { Poke<int32_t>(r->mutable_topk_ids()->mutable_data(), 2, E); },
       INVALID, "is " + std::to_string(E) + ", expected an expert in [0, " + std::to_string(E)},
      {"expert id -2", [](ForwardRequest* r) { Poke<int32_t>(r->mutable_topk_ids()->mutable_data(), 0, -2); },
       INVALID, "is -2"},
      {"duplicate expert in a token",
       [](ForwardRequest* r) {
         std::string* d = r->mutable_topk_ids()->mutable_data();
         int32_t first;
         std::memcpy(&first, d->data(), 4);
         Poke<int32_t>(d, 1, first);
       },
       INVALID, "distinct experts"},
      {"topk_weights dtype BF16",
       [](ForwardRequest* r) { r->mutable_topk_weights()->set_dtype(gcmoe::v1::BF16); }, INVALID,
       "topk_weights.dtype: BF16, expected FP32"},
      {"topk_weights missing", [](ForwardRequest* r) { r->clear_topk_weights(); }, INVALID,
       "topk_weights: missing"},
      {"topk_weights wrong shape",
       [](ForwardRequest* r) { r->mutable_topk_weights()->set_shape(1, 2); }, INVALID,
       "topk_weights.shape"},
      {"topk_weights NaN",
       [nan](ForwardRequest* r) { Poke(r->mutable_topk_weights()->mutable_data(), 6, nan); },
       INVALID, "topk_weights: element [1, 2] is NaN"},
      {"output dtype INT32", [](ForwardRequest* r) { r->set_output_dtype(gcmoe::v1::INT32); },
       INVALID, "output_dtype: INT32, expected BF16 or FP32"},
      {"output dtype FP8", [](ForwardRequest* r) { r->set_output_dtype(gcmoe::v1::FP8_E4M3); },
       INVALID, "output_dtype"},
  };
}

}  // namespace gcmoe::server::testing
