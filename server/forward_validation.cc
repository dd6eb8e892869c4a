#include "server/forward_validation.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "common/number_formats.h"
#include "server/parallel_bytes.h"

namespace gcmoe::server {
namespace {

using gcmoe::v1::DType;
using gcmoe::v1::Tensor;

std::string ShapeText(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.shape_size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(t.shape(i));
  }
  return s + "]";
}

// Checks dtype, a 2-D shape [rows, cols] and the byte size of one tensor field.
Status CheckMatrix(const std::string& field, const Tensor& t, const TensorBytes& bytes,
                   DType dtype, int64_t rows, int64_t cols, const std::string& shape_names,
                   int elem_bytes) {
  if (t.dtype() != dtype) {
    return InvalidArgument(field + ".dtype: " + DTypeName(t.dtype()) + ", expected " +
                           DTypeName(dtype));
  }
  if (t.shape_size() != 2) {
    return InvalidArgument(field + ".shape: " + ShapeText(t) + " has " +
                           std::to_string(t.shape_size()) + " dimension(s), expected " +
                           shape_names);
  }
  if (t.shape(0) != rows || t.shape(1) != cols) {
    return InvalidArgument(field + ".shape: " + ShapeText(t) + ", expected " + shape_names +
                           " = [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  const int64_t expected = rows * cols * elem_bytes;
  if (static_cast<int64_t>(bytes.size) != expected) {
    return InvalidArgument(field + (bytes.in_region ? ".region.byte_size: " : ".data: ") +
                           std::to_string(bytes.size) + " bytes, expected " +
                           std::to_string(expected) + " (" + shape_names + " x " +
                           std::to_string(elem_bytes) + " bytes)");
  }
  return Status::Ok();
}

bool IsEmpty(const Tensor& t) {
  return t.dtype() == gcmoe::v1::DTYPE_UNSPECIFIED && t.shape_size() == 0 && t.data().empty() &&
         !t.has_region();
}

TensorBytes BytesOf(const Tensor& t) {
  return TensorBytes{reinterpret_cast<const uint8_t*>(t.data().data()), t.data().size(), false};
}

std::string Element(int64_t index, int64_t cols) {
  return "[" + std::to_string(index / cols) + ", " + std::to_string(index % cols) + "]";
}

std::string ValueText(float v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(v));
  return text;
}

// The largest |v| of n FP32 (or BF16) values as bits with the sign cleared: for IEEE floats
// this order is the order of magnitudes, with Inf and NaN above every finite value. One
// branch-free pass the compiler vectorizes; the element-wise checks run only to name a bad value.
// With the sign cleared the bits compare the same as signed integers, whose maximum baseline
// x86-64 (SSE2) has an instruction or a short sequence for, unlike the unsigned one: at 256 rows
// of 6144 values, 100 against 220 us (BF16) and 0.67 against 1.0 ms (FP32) on the development
// machine.
template <typename Bits>
Bits MaxMagnitudeBits(const uint8_t* bytes, int64_t n) {
  using Signed = std::make_signed_t<Bits>;
  constexpr Bits kMagnitude = static_cast<Bits>(~Bits{0}) >> 1;  // all but the sign bit
  Signed max_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + sizeof(Bits) * i, sizeof(Bits));
    max_bits = std::max<Signed>(max_bits, static_cast<Signed>(bits & kMagnitude));
  }
  return static_cast<Bits>(max_bits);
}

// Whether every FP32 or BF16 value is finite and at most `limit` in magnitude (a limit whose
// low 16 bits are zero or one, as 2^32 and FLT_MAX, is exact for BF16 too).
bool AllWithin(DType dtype, const uint8_t* bytes, size_t size, float limit) {
  const int64_t n = static_cast<int64_t>(size);
  uint32_t limit_bits;
  std::memcpy(&limit_bits, &limit, 4);
  if (dtype == gcmoe::v1::FP32) return MaxMagnitudeBits<uint32_t>(bytes, n / 4) <= limit_bits;
  return MaxMagnitudeBits<uint16_t>(bytes, n / 2) <= (limit_bits >> 16);
}

// Finite and within kMaxActivationMagnitude, for FP32 and BF16 activations (FP8 ones are
// checked with their scales). The scan is split over `pool` when the tensor is large.
Status CheckHiddenValues(DType dtype, const TensorBytes& hidden, int64_t cols,
                         engine::ThreadPool* pool) {
  const uint8_t* bytes = hidden.data;
  std::atomic<bool> within{true};
  ForByteChunks(pool, hidden.size, 4, [&](size_t begin, size_t end) {
    if (!AllWithin(dtype, bytes + begin, end - begin, kMaxActivationMagnitude)) {
      within.store(false, std::memory_order_relaxed);
    }
  });
  if (within.load()) return Status::Ok();
  // Found: the first bad element, named by one pass in order.
  const int64_t n = static_cast<int64_t>(hidden.size);
  const int elem = dtype == gcmoe::v1::FP32 ? 4 : 2;
  for (int64_t i = 0; i < n / elem; ++i) {
    float v;
    if (elem == 4) {
      std::memcpy(&v, bytes + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      v = numerics::BF16ToFloat(bits);
    }
    if (!std::isfinite(v)) {
      return InvalidArgument("hidden: element " + Element(i, cols) + " is " +
                             (std::isnan(v) ? "NaN" : "Inf") + ", expected finite activations");
    }
    if (std::fabs(v) > kMaxActivationMagnitude) {
      return InvalidArgument("hidden: element " + Element(i, cols) + " is " + ValueText(v) +
                             ", expected a magnitude of at most 2^32 (DESIGN.md §4)");
    }
  }
  return Status::Ok();
}

// E4M3 codes with their UE8M0 scales: no NaN code, decoded magnitude within
// kMaxActivationMagnitude (448 x 2^127 would not even be a finite float).
Status CheckFp8Hidden(const TensorBytes& hidden, const TensorBytes& scales, int64_t cols) {
  const uint8_t* q = hidden.data;
  const uint8_t* s = scales.data;
  const int64_t n = static_cast<int64_t>(hidden.size);
  const int64_t blocks_per_row = cols / 32;
  // Fast path: no NaN code, and no scale so large that even the largest code (448 < 2^9) could
  // pass 2^32, i.e. every scale exponent at most 2^23 (code 150).
  bool any_nan = false;
  for (int64_t i = 0; i < n; ++i) any_nan |= (q[i] & 0x7F) == 0x7F;
  uint8_t max_scale = 0;
  const int64_t num_scales = static_cast<int64_t>(scales.size);
  for (int64_t i = 0; i < num_scales; ++i) max_scale = std::max(max_scale, s[i]);
  if (!any_nan && max_scale <= 127 + 23) return Status::Ok();
  for (int64_t i = 0; i < n; ++i) {
    if ((q[i] & 0x7F) == 0x7F) {
      return InvalidArgument("hidden: element " + Element(i, cols) +
                             " is the E4M3 NaN code, expected finite activations");
    }
    const int64_t block = (i / cols) * blocks_per_row + (i % cols) / 32;
    const double v = static_cast<double>(numerics::DecodeE4M3(q[i])) *
                     std::ldexp(1.0, static_cast<int>(s[block]) - 127);
    if (std::fabs(v) > kMaxActivationMagnitude) {
      return InvalidArgument("hidden: element " + Element(i, cols) + " decodes to " +
                             ValueText(static_cast<float>(v)) +
                             " with its scale, expected a magnitude of at most 2^32 "
                             "(DESIGN.md §4)");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case gcmoe::v1::DTYPE_UNSPECIFIED: return "DTYPE_UNSPECIFIED";
    case gcmoe::v1::BF16: return "BF16";
    case gcmoe::v1::FP32: return "FP32";
    case gcmoe::v1::FP8_E4M3: return "FP8_E4M3";
    case gcmoe::v1::INT32: return "INT32";
    case gcmoe::v1::FP16: return "FP16";
    case gcmoe::v1::UE8M0: return "UE8M0";
    default: return "an unknown dtype";
  }
}

std::vector<int> ShardSizes(int num_tokens, int world_size) {
  std::vector<int> sizes(world_size, num_tokens / world_size);
  for (int r = 0; r < num_tokens % world_size; ++r) ++sizes[r];
  return sizes;
}

ForwardBytes InlineBytes(const gcmoe::v1::ForwardRequest& request) {
  ForwardBytes bytes;
  bytes.hidden = BytesOf(request.hidden());
  bytes.hidden_scales = BytesOf(request.hidden_scales());
  bytes.topk_ids = BytesOf(request.topk_ids());
  bytes.topk_weights = BytesOf(request.topk_weights());
  return bytes;
}

Status ValidateForward(const gcmoe::v1::ForwardRequest& request, const ForwardLimits& limits,
                       ValidatedForward* out) {
  return ValidateForward(request, InlineBytes(request), limits, out);
}

Status ValidateForward(const gcmoe::v1::ForwardRequest& request, const ForwardBytes& bytes,
                       const ForwardLimits& limits, ValidatedForward* out,
                       engine::ThreadPool* pool) {
  const int H = limits.hidden;
  const int k = limits.top_k;
  const int E = limits.experts;
  if (static_cast<int64_t>(request.layer()) >= limits.layers) {
    return NotFound("layer: " + std::to_string(request.layer()) +
                    " is not a layer of the loaded model, expected 0.." +
                    std::to_string(limits.layers - 1));
  }

  // hidden: [T, H]
  const Tensor& hidden = request.hidden();
  if (IsEmpty(hidden)) return InvalidArgument("hidden: missing, expected a [T, H] tensor");
  int elem = 0;
  switch (hidden.dtype()) {
    case gcmoe::v1::BF16: elem = 2; out->hidden_dtype = engine::DType::kBF16; break;
    case gcmoe::v1::FP32: elem = 4; out->hidden_dtype = engine::DType::kFP32; break;
    case gcmoe::v1::FP8_E4M3: elem = 1; out->hidden_dtype = engine::DType::kFP8E4M3; break;
    default:
      return InvalidArgument(std::string("hidden.dtype: ") + DTypeName(hidden.dtype()) +
                             ", expected BF16, FP32 or FP8_E4M3");
  }
  if (hidden.shape_size() != 2) {
    return InvalidArgument("hidden.shape: " + ShapeText(hidden) + " has " +
                           std::to_string(hidden.shape_size()) +
                           " dimension(s), expected [T, H] with H = " + std::to_string(H));
  }
  const int64_t T = hidden.shape(0);
  if (T < 0 || hidden.shape(1) < 0) {
    return InvalidArgument("hidden.shape: " + ShapeText(hidden) + " has a negative dimension");
  }
  if (hidden.shape(1) != H) {
    return InvalidArgument("hidden.shape[1]: " + std::to_string(hidden.shape(1)) +
                           ", expected H = " + std::to_string(H));
  }
  if (T == 0) return InvalidArgument("hidden.shape[0]: the batch is empty, expected T >= 1");
  if (T > limits.max_tokens) {
    return ResourceExhausted("hidden.shape[0]: " + std::to_string(T) +
                             " tokens exceed the service's capacity of " +
                             std::to_string(limits.max_tokens) +
                             " per call (parallel.ranks x engine.max_tokens_per_rank)");
  }
  GCMOE_RETURN_IF_ERROR(
      CheckMatrix("hidden", hidden, bytes.hidden, hidden.dtype(), T, H, "[T, H]", elem));
  if (hidden.dtype() != gcmoe::v1::FP8_E4M3 && !bytes.hidden.on_device) {
    GCMOE_RETURN_IF_ERROR(CheckHiddenValues(hidden.dtype(), bytes.hidden, H, pool));
  }

  // hidden_scales: [T, H/32] UE8M0, exactly when hidden is FP8.
  const Tensor& scales = request.hidden_scales();
  if (hidden.dtype() == gcmoe::v1::FP8_E4M3) {
    if (IsEmpty(scales)) {
      return InvalidArgument(
          "hidden_scales: missing, expected [T, H/32] UE8M0 scales with FP8_E4M3 hidden");
    }
    GCMOE_RETURN_IF_ERROR(CheckMatrix("hidden_scales", scales, bytes.hidden_scales,
                                      gcmoe::v1::UE8M0, T, H / 32, "[T, H/32]", 1));
    const uint8_t* codes = bytes.hidden_scales.data;
    for (int64_t i = 0; i < T * (H / 32); ++i) {
      if (codes[i] == 255) {
        return InvalidArgument("hidden_scales: element " + Element(i, H / 32) +
                               " is 255 (UE8M0 NaN), expected 0..254");
      }
    }
    GCMOE_RETURN_IF_ERROR(CheckFp8Hidden(bytes.hidden, bytes.hidden_scales, H));
  } else if (!IsEmpty(scales)) {
    return InvalidArgument(std::string("hidden_scales: given with ") + DTypeName(hidden.dtype()) +
                           " hidden, expected scales only with FP8_E4M3 hidden");
  }

  // topk_ids: [T, k] INT32 in [-1, E), no expert twice in one token.
  const Tensor& ids = request.topk_ids();
  if (IsEmpty(ids)) return InvalidArgument("topk_ids: missing, expected a [T, k] INT32 tensor");
  GCMOE_RETURN_IF_ERROR(
      CheckMatrix("topk_ids", ids, bytes.topk_ids, gcmoe::v1::INT32, T, k, "[T, k]", 4));
  const Tensor& weights = request.topk_weights();
  if (IsEmpty(weights)) {
    return InvalidArgument("topk_weights: missing, expected a [T, k] FP32 tensor");
  }
  GCMOE_RETURN_IF_ERROR(CheckMatrix("topk_weights", weights, bytes.topk_weights,
                                    gcmoe::v1::FP32, T, k, "[T, k]", 4));

  switch (request.output_dtype()) {
    case gcmoe::v1::DTYPE_UNSPECIFIED:
    case gcmoe::v1::BF16: out->output_fp32 = false; break;
    case gcmoe::v1::FP32: out->output_fp32 = true; break;
    default:
      return InvalidArgument(std::string("output_dtype: ") + DTypeName(request.output_dtype()) +
                             ", expected BF16 or FP32");
  }
  if (bytes.output != nullptr || bytes.output_device.region != 0) {
    const int out_elem = out->output_fp32 ? 4 : 2;
    const int64_t expected = T * H * out_elem;
    const uint64_t size = bytes.output != nullptr ? bytes.output_size : bytes.output_device.size;
    if (static_cast<int64_t>(size) != expected) {
      return InvalidArgument("output_region.byte_size: " + std::to_string(size) +
                             " bytes, expected " + std::to_string(expected) + " ([T, H] x " +
                             std::to_string(out_elem) + " bytes of output_dtype)");
    }
  }

  const int P = limits.world_size;
  out->num_tokens = static_cast<int>(T);
  out->tokens_per_rank = ShardSizes(out->num_tokens, P);
  out->counts.assign(static_cast<size_t>(P) * E, 0);
  const uint8_t* id_data = bytes.topk_ids.data;
  const uint8_t* w_data = bytes.topk_weights.data;
  int src = 0;
  int src_end = out->tokens_per_rank[0];
  for (int64_t t = 0; t < T; ++t) {
    while (t >= src_end) src_end += out->tokens_per_rank[++src];
    for (int j = 0; j < k; ++j) {
      int32_t e;
      std::memcpy(&e, id_data + 4 * (t * k + j), 4);
      float w;
      std::memcpy(&w, w_data + 4 * (t * k + j), 4);
      if (!std::isfinite(w)) {
        return InvalidArgument("topk_weights: element " + Element(t * k + j, k) + " is " +
                               (std::isnan(w) ? "NaN" : "Inf") + ", expected a finite weight");
      }
      if (std::fabs(w) > kMaxRoutingWeightMagnitude) {
        return InvalidArgument("topk_weights: element " + Element(t * k + j, k) + " is " +
                               ValueText(w) +
                               ", expected a magnitude of at most 2^16 (DESIGN.md §4)");
      }
      if (e == -1) continue;
      if (e < 0 || e >= E) {
        return InvalidArgument("topk_ids: element " + Element(t * k + j, k) + " is " +
                               std::to_string(e) + ", expected an expert in [0, " +
                               std::to_string(E) + ") or -1 for an unused slot");
      }
      for (int i = 0; i < j; ++i) {
        int32_t other;
        std::memcpy(&other, id_data + 4 * (t * k + i), 4);
        if (other == e) {
          return InvalidArgument("topk_ids: token " + std::to_string(t) + " lists expert " +
                                 std::to_string(e) + " in slots " + std::to_string(i) +
                                 " and " + std::to_string(j) +
                                 ", expected distinct experts per token");
        }
      }
      ++out->counts[static_cast<size_t>(src) * E + e];
    }
  }
  out->bytes = bytes;
  return Status::Ok();
}

bool OutputFinite(DType dtype, const uint8_t* data, size_t size) {
  return AllWithin(dtype, data, size, std::numeric_limits<float>::max());
}

Status ValidateForwardOutput(DType dtype, const uint8_t* bytes, size_t size, int64_t cols) {
  if (OutputFinite(dtype, bytes, size)) return Status::Ok();
  const bool fp32 = dtype == gcmoe::v1::FP32;
  const int64_t elem = fp32 ? 4 : 2;
  const int64_t n = static_cast<int64_t>(size) / elem;
  if (cols <= 0) cols = n;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (fp32) {
      std::memcpy(&v, bytes + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      v = numerics::BF16ToFloat(bits);
    }
    if (!std::isfinite(v)) {
      return InvalidArgument("output: element " + Element(i, cols) + " is " +
                             (std::isnan(v) ? "NaN" : "Inf") +
                             ": the layer overflowed FP32 on this input; expected smaller "
                             "hidden or topk_weights (DESIGN.md §4)");
    }
  }
  return Status::Ok();
}

}  // namespace gcmoe::server
