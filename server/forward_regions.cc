#include "server/forward_regions.h"

#include <cstring>

namespace gcmoe::server {
namespace {

using gcmoe::v1::Tensor;

Status CheckOneSource(const std::string& field, const Tensor& t) {
  if (t.has_region() && !t.data().empty()) {
    return InvalidArgument(field + ": both data and region are set, expected one of them");
  }
  return Status::Ok();
}

// `field`'s bytes: its data, or its region's. With `copy` the region's bytes are copied into
// memory the client cannot write (kept in *keep_alive).
// `device`, when given, takes a range of GPU memory (else refused for this field).
Status Resolve(const std::string& field, const Tensor& t, const MemoryRegistry& registry,
               const std::string& owner, bool copy, TensorBytes* out, DeviceBytes* device,
               std::vector<std::shared_ptr<const void>>* keep_alive) {
  if (!t.has_region()) {
    *out = TensorBytes{reinterpret_cast<const uint8_t*>(t.data().data()), t.data().size(), false};
    return Status::Ok();
  }
  GCMOE_ASSIGN_OR_RETURN(RegionBytes region,
                         registry.Resolve(owner, field + ".region", t.region().region(),
                                          t.region().offset(), t.region().byte_size()));
  if (region.device_region != 0) {
    // GPU memory: only the activations, in a dtype the ranks check there.
    if (device == nullptr) {
      return InvalidArgument(field + ".region: \"" + t.region().region() +
                             "\" is GPU memory (cuda_ipc); only hidden and output_region may be, "
                             "expected this tensor inline or in posix_shm");
    }
    if (t.dtype() != gcmoe::v1::BF16 && t.dtype() != gcmoe::v1::FP32) {
      return InvalidArgument(field + ".dtype: " + DTypeName(t.dtype()) +
                             " in GPU memory (cuda_ipc), expected BF16 or FP32 there");
    }
    *out = TensorBytes{nullptr, region.size, true, true};
    *device = DeviceBytes{region.device_region, region.device_offset, region.size};
    keep_alive->push_back(std::move(region.mapping));
    return Status::Ok();
  }
  if (copy) {
    auto owned = std::make_shared<std::vector<uint8_t>>(region.data, region.data + region.size);
    *out = TensorBytes{owned->data(), owned->size(), true};
    keep_alive->push_back(std::move(owned));
  } else {
    *out = TensorBytes{region.data, region.size, true};
    keep_alive->push_back(std::move(region.mapping));
  }
  return Status::Ok();
}

}  // namespace

bool NamesRegion(const gcmoe::v1::ForwardRequest& request) {
  return request.hidden().has_region() || request.hidden_scales().has_region() ||
         request.topk_ids().has_region() || request.topk_weights().has_region() ||
         request.has_output_region();
}

Status RegisteredMemoryOff() {
  return FailedPrecondition(
      "registered memory is off: the service runs with server.allow_registered_memory false");
}

Status ResolveForwardBytes(const gcmoe::v1::ForwardRequest& request,
                           const MemoryRegistry* registry, const std::string& owner,
                           ForwardBytes* bytes,
                           std::vector<std::shared_ptr<const void>>* keep_alive) {
  GCMOE_RETURN_IF_ERROR(CheckOneSource("hidden", request.hidden()));
  GCMOE_RETURN_IF_ERROR(CheckOneSource("hidden_scales", request.hidden_scales()));
  GCMOE_RETURN_IF_ERROR(CheckOneSource("topk_ids", request.topk_ids()));
  GCMOE_RETURN_IF_ERROR(CheckOneSource("topk_weights", request.topk_weights()));
  if (!NamesRegion(request)) {
    *bytes = InlineBytes(request);
    return Status::Ok();
  }
  if (registry == nullptr) return RegisteredMemoryOff();
  GCMOE_RETURN_IF_ERROR(Resolve("hidden", request.hidden(), *registry, owner, false, &bytes->hidden,
                                &bytes->hidden_device, keep_alive));
  GCMOE_RETURN_IF_ERROR(Resolve("hidden_scales", request.hidden_scales(), *registry, owner, false,
                                &bytes->hidden_scales, nullptr, keep_alive));
  GCMOE_RETURN_IF_ERROR(Resolve("topk_ids", request.topk_ids(), *registry, owner, true,
                                &bytes->topk_ids, nullptr, keep_alive));
  GCMOE_RETURN_IF_ERROR(Resolve("topk_weights", request.topk_weights(), *registry, owner, true,
                                &bytes->topk_weights, nullptr, keep_alive));
  if (request.has_output_region()) {
    const gcmoe::v1::TensorRegion& ref = request.output_region();
    GCMOE_ASSIGN_OR_RETURN(
        RegionBytes region,
        registry->Resolve(owner, "output_region", ref.region(), ref.offset(), ref.byte_size()));
    if (region.device_region != 0) {
      bytes->output_device = DeviceBytes{region.device_region, region.device_offset, region.size};
    } else {
      bytes->output = region.data;
      bytes->output_size = region.size;
    }
    keep_alive->push_back(std::move(region.mapping));
  }
  return Status::Ok();
}

}  // namespace gcmoe::server
