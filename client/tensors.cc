#include "client/tensors.h"

#include <bit>
#include <cstring>

#include "common/number_formats.h"

namespace gcmoe::client {
namespace {

// The API's tensors are little-endian; so is every host gcmoe runs on (x86-64, aarch64).
static_assert(std::endian::native == std::endian::little, "tensors are little-endian on the wire");

template <typename T>
void SetData(const std::vector<T>& values, v1::Tensor* tensor) {
  tensor->set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

void SetShape(v1::Tensor* tensor, std::initializer_list<int64_t> shape) {
  tensor->clear_shape();
  for (const int64_t d : shape) tensor->add_shape(d);
}

}  // namespace

Status EncodeHidden(const RequestArrays& a, v1::DType dtype, v1::ForwardRequest* request) {
  const size_t n = static_cast<size_t>(a.tokens) * a.hidden;
  if (a.hidden_values.size() != n) {
    return InvalidArgument("hidden has " + std::to_string(a.hidden_values.size()) +
                           " values, expected tokens * hidden = " + std::to_string(n));
  }
  v1::Tensor* hidden = request->mutable_hidden();
  hidden->set_dtype(dtype);
  SetShape(hidden, {a.tokens, a.hidden});
  switch (dtype) {
    case v1::FP32:
      SetData(a.hidden_values, hidden);
      request->clear_hidden_scales();
      return Status::Ok();
    case v1::BF16: {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i) bits[i] = numerics::FloatToBF16(a.hidden_values[i]);
      SetData(bits, hidden);
      request->clear_hidden_scales();
      return Status::Ok();
    }
    case v1::FP8_E4M3: {
      if (a.hidden % numerics::kBlock != 0) {
        return InvalidArgument("FP8 input needs hidden to be a multiple of 32, got " +
                               std::to_string(a.hidden));
      }
      const int blocks = a.hidden / numerics::kBlock;
      std::vector<uint8_t> codes(n);
      std::vector<uint8_t> scales(static_cast<size_t>(a.tokens) * blocks);
      // Row by row: every token's H values are blocked along H, as the server requantizes.
      for (int t = 0; t < a.tokens; ++t) {
        numerics::QuantizeE4M3K32(a.hidden_values.data() + static_cast<size_t>(t) * a.hidden,
                                  a.hidden, codes.data() + static_cast<size_t>(t) * a.hidden,
                                  scales.data() + static_cast<size_t>(t) * blocks);
      }
      SetData(codes, hidden);
      v1::Tensor* s = request->mutable_hidden_scales();
      s->set_dtype(v1::UE8M0);
      SetShape(s, {a.tokens, blocks});
      SetData(scales, s);
      return Status::Ok();
    }
    default:
      return InvalidArgument("hidden dtype must be BF16, FP32 or FP8_E4M3, got " +
                             DTypeName(dtype));
  }
}

Result<v1::ForwardRequest> BuildForwardRequest(const RequestArrays& a, uint32_t layer,
                                               v1::DType hidden_dtype, v1::DType output_dtype,
                                               const std::string& request_id) {
  const size_t slots = static_cast<size_t>(a.tokens) * a.top_k;
  if (a.topk_ids.size() != slots || a.topk_weights.size() != slots) {
    return InvalidArgument(
        "topk_ids and topk_weights need tokens * top_k = " + std::to_string(slots) +
        " values, got " + std::to_string(a.topk_ids.size()) + " and " +
        std::to_string(a.topk_weights.size()));
  }
  v1::ForwardRequest request;
  request.set_layer(layer);
  GCMOE_RETURN_IF_ERROR(EncodeHidden(a, hidden_dtype, &request));
  v1::Tensor* ids = request.mutable_topk_ids();
  ids->set_dtype(v1::INT32);
  SetShape(ids, {a.tokens, a.top_k});
  SetData(a.topk_ids, ids);
  v1::Tensor* weights = request.mutable_topk_weights();
  weights->set_dtype(v1::FP32);
  SetShape(weights, {a.tokens, a.top_k});
  SetData(a.topk_weights, weights);
  request.set_output_dtype(output_dtype);
  request.set_request_id(request_id);
  return request;
}

Result<std::vector<float>> DecodeFloatTensor(const v1::Tensor& tensor) {
  int64_t count = 1;
  for (const int64_t d : tensor.shape()) {
    if (d < 0) return InvalidArgument("output shape has a negative dimension");
    count *= d;
  }
  const std::string& data = tensor.data();
  size_t element_bytes = 0;
  if (tensor.dtype() == v1::BF16) {
    element_bytes = 2;
  } else if (tensor.dtype() == v1::FP32) {
    element_bytes = 4;
  } else {
    return InvalidArgument("output dtype " + DTypeName(tensor.dtype()) + " is not BF16 or FP32");
  }
  if (data.size() != static_cast<size_t>(count) * element_bytes) {
    return InvalidArgument("output holds " + std::to_string(data.size()) + " bytes, its shape " +
                           "needs " + std::to_string(count * element_bytes));
  }
  std::vector<float> values(static_cast<size_t>(count));
  if (element_bytes == 4) {
    std::memcpy(values.data(), data.data(), data.size());
  } else {
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, data.data() + 2 * i, 2);
      values[i] = numerics::BF16ToFloat(bits);
    }
  }
  return values;
}

int64_t PayloadBytes(const v1::ForwardRequest& r) {
  return static_cast<int64_t>(r.hidden().data().size() + r.hidden_scales().data().size() +
                              r.topk_ids().data().size() + r.topk_weights().data().size());
}

bool ParseDTypeName(const std::string& name, v1::DType* dtype) {
  if (name == "bf16") {
    *dtype = v1::BF16;
  } else if (name == "fp32") {
    *dtype = v1::FP32;
  } else if (name == "fp8" || name == "fp8_e4m3") {
    *dtype = v1::FP8_E4M3;
  } else {
    return false;
  }
  return true;
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return "bf16";
    case v1::FP32:
      return "fp32";
    case v1::FP8_E4M3:
      return "fp8_e4m3";
    case v1::INT32:
      return "int32";
    case v1::FP16:
      return "fp16";
    case v1::UE8M0:
      return "ue8m0";
    default:
      return "dtype " + std::to_string(static_cast<int>(dtype));
  }
}

}  // namespace gcmoe::client
