// A catalogue of malformed Forward requests, each with the status code and the words its
// message must contain. Used against the validator directly and through a running service.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <grpcpp/support/status_code_enum.h>

#include "engine/model_spec.h"
#include "gcmoe/v1/moe.pb.h"

namespace gcmoe::server::testing {

struct BadRequest {
  std::string name;
  std::function<void(gcmoe::v1::ForwardRequest*)> mutate;  // applied to a valid request
  grpc::StatusCode code;
  std::string message_contains;
};

// Valid base request: 4 tokens, FP32 activations, layer 0. `max_tokens` is the service's
// capacity (for the over-capacity case).
gcmoe::v1::ForwardRequest BaseBadRequest(const engine::ModelSpec& spec);
std::vector<BadRequest> BadRequestCatalogue(const engine::ModelSpec& spec, int max_tokens);

}  // namespace gcmoe::server::testing
