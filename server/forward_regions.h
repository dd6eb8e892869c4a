// A ForwardRequest's registered-memory references (Tensor.region, output_region) resolved into
// the byte spans validation and the coordinator work on (server/forward_validation.h).
//
// Activations (hidden, hidden_scales) are read straight from the region into the ranks' shard
// slots, and the output is written straight into output_region: what changes in them after
// validation can change only numbers, and the output is checked for Inf and NaN before any call
// succeeds. The routing is different: topk_ids index arrays on the coordinator and the ranks and
// make the step's count matrix, so a client rewriting them between validation and the step
// could make a rank index out of range. It is therefore copied out of the region first (8 bytes
// per slot, against H x 2 or more per token of activations) and validated and used from the
// copy.
//
// GPU memory (cuda_ipc) holds only `hidden` (BF16 or FP32) and the output: the coordinator checks
// their ranges and sizes, and the ranks read and write them on the GPU and check their values
// there. The routing never lives there (the coordinator reads it), nor FP8 scales.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "gcmoe/v1/moe.pb.h"
#include "server/forward_validation.h"
#include "server/memory_registry.h"

namespace gcmoe::server {

// Whether any tensor of `request`, or its output, names a registered region.
bool NamesRegion(const gcmoe::v1::ForwardRequest& request);

// Fills *bytes with each tensor's bytes (inline or from `owner`'s registrations) and appends to
// *keep_alive what they point into. Errors name the field: INVALID_ARGUMENT when data and region
// are both set; FAILED_PRECONDITION naming server.allow_registered_memory when a region is named
// and `registry` is null (the feature is off); else MemoryRegistry::Resolve's. Sizes against the
// dtype and shape are ValidateForward's to check.
Status ResolveForwardBytes(const gcmoe::v1::ForwardRequest& request,
                           const MemoryRegistry* registry, const std::string& owner,
                           ForwardBytes* bytes,
                           std::vector<std::shared_ptr<const void>>* keep_alive);

// The FAILED_PRECONDITION every registered-memory use gets with the feature off.
Status RegisteredMemoryOff();

}  // namespace gcmoe::server
