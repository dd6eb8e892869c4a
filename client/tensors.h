// Host arrays <-> gcmoe.v1.Tensor for the client: the request encodings the API accepts (BF16,
// FP32, FP8 E4M3 with UE8M0 scales per 32, INT32) and the output decodings (BF16, FP32), with
// the formats of engine/numerics.h so that the client quantizes exactly as the server would.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::client {

// What one Forward carries, before encoding. Row-major.
struct RequestArrays {
  int tokens = 0;
  int hidden = 0;
  int top_k = 0;
  std::vector<float> hidden_values;  // [T, H]
  std::vector<int32_t> topk_ids;     // [T, k], -1 = unused slot
  std::vector<float> topk_weights;   // [T, k]
};

// Fills `hidden` (and `hidden_scales` for FP8_E4M3) of a ForwardRequest. dtype: BF16, FP32 or
// FP8_E4M3; FP8 needs H to be a multiple of 32 (one UE8M0 scale per 32 values of a token).
Status EncodeHidden(const RequestArrays& arrays, v1::DType dtype, v1::ForwardRequest* request);

// A complete request: hidden as `hidden_dtype`, topk_ids INT32, topk_weights FP32.
Result<v1::ForwardRequest> BuildForwardRequest(const RequestArrays& arrays, uint32_t layer,
                                               v1::DType hidden_dtype, v1::DType output_dtype,
                                               const std::string& request_id);

// A [T, H] output tensor (BF16 or FP32) as floats, checking the shape against the data size.
Result<std::vector<float>> DecodeFloatTensor(const v1::Tensor& tensor);

// Bytes a request would take on the wire, roughly (the tensors' data): to check against the
// server's message limit before sending.
int64_t PayloadBytes(const v1::ForwardRequest& request);

// "bf16" | "fp32" | "fp8" -> DType; false when the name is unknown.
bool ParseDTypeName(const std::string& name, v1::DType* dtype);
// BF16 -> "bf16", FP8_E4M3 -> "fp8_e4m3", ...
std::string DTypeName(v1::DType dtype);

}  // namespace gcmoe::client
