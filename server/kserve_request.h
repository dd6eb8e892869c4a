// Open Inference Protocol (KServe v2) ModelInfer requests <-> gcmoe.v1 Forward: the model
// "gcmoe" takes inputs `hidden` [T, H] (BF16 or FP32), `topk_ids` [T, k] (INT32) and
// `topk_weights` [T, k] (FP32), as `raw_input_contents` or as typed `contents`, and the
// request parameters `layer` and `output_datatype`; it returns one output, `output` [T, H].
// Every message names the input or parameter at fault, as ForwardRequest's validation does.
#pragma once

#include <string>

#include "common/status.h"
#include "gcmoe/v1/moe.pb.h"
#include "inference/grpc_predict_v2.pb.h"

namespace gcmoe::server {

inline constexpr const char* kKServeModelName = "gcmoe";
inline constexpr const char* kKServeModelVersion = "1";

// The model name and version of a KServe call: NOT_FOUND unless they name the one model.
// `field` prefixes the message ("model_name", "name").
Status CheckKServeModel(const std::string& field, const std::string& name,
                        const std::string* version);

// Translates the inputs and parameters into a ForwardRequest; the shapes against the model
// are left to ValidateForward, which words them with the same input names.
Status ToForwardRequest(const inference::ModelInferRequest& request,
                        gcmoe::v1::ForwardRequest* forward);

// Fills the response with `output` as raw bytes (the protocol's only carrier for BF16).
void ToInferResponse(const inference::ModelInferRequest& request,
                     const gcmoe::v1::ForwardResponse& forward,
                     inference::ModelInferResponse* response);

}  // namespace gcmoe::server
