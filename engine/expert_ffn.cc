#include "engine/expert_ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/ffn_dot.h"
#include "engine/numerics.h"

namespace gcmoe::engine {
namespace {

// Decoded weight rows held at once (a tile), reused across all rows of the call; sized to stay
// in L1/L2 next to the activation rows.
constexpr int kTileBytes = 32 << 10;

using V4 = float __attribute__((vector_size(16)));

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// E2M1 byte -> its two values (low nibble first), unscaled.
struct E2M1PairTable {
  float pairs[256][2];
  E2M1PairTable() {
    for (int b = 0; b < 256; ++b) {
      pairs[b][0] = numerics::DecodeE2M1(static_cast<uint8_t>(b & 0xF));
      pairs[b][1] = numerics::DecodeE2M1(static_cast<uint8_t>(b >> 4));
    }
  }
};

// E2M1 weight rows, packed two per byte, UE8M0 scale per 32: [rows, cols/2] + [rows, cols/32].
struct E2M1Rows {
  const uint8_t* codes;
  const uint8_t* scales;
  int cols;

  void Decode(int row, float* out) const {
    static const E2M1PairTable table;
    const uint8_t* c = codes + static_cast<int64_t>(row) * (cols / 2);
    const uint8_t* s = scales + static_cast<int64_t>(row) * (cols / numerics::kBlock);
    // Scaling after the lookup is exact: a power of two times a value of two significant bits.
    // Two bytes make one 4-float vector, scaled in registers and stored once (storing the
    // pairs and scaling them in a second pass stalls on store-to-load forwarding).
    for (int b = 0; b < cols / numerics::kBlock; ++b) {
      const float scale = numerics::DecodeUE8M0(s[b]);
      const V4 scale4 = {scale, scale, scale, scale};
      const uint8_t* bc = c + b * (numerics::kBlock / 2);
      float* bo = out + b * numerics::kBlock;
      for (int i = 0; i < numerics::kBlock / 2; i += 2) {
        float quad[4];
        std::memcpy(quad, table.pairs[bc[i]], 8);
        std::memcpy(quad + 2, table.pairs[bc[i + 1]], 8);
        const V4 v = Load4(quad) * scale4;
        std::memcpy(bo + 2 * i, &v, sizeof(v));
      }
    }
  }
};

// E4M3 weight rows, UE8M0 scale per 32: [rows, cols] + [rows, cols/32].
struct E4M3Rows {
  const uint8_t* codes;
  const uint8_t* scales;
  int cols;

  void Decode(int row, float* out) const {
    numerics::DequantizeE4M3K32(codes + static_cast<int64_t>(row) * cols,
                                scales + static_cast<int64_t>(row) * (cols / numerics::kBlock),
                                cols, out);
  }
};

// sigmoid(z) as an FP32 value, evaluated in float64 and rounded once. libm's expf is not
// correctly rounded and glibc picks an FMA or a plain variant by CPU, so its bits can differ
// between machines; through float64 the float result is the correctly rounded sigmoid except
// about once in 2^28 evaluations, which keeps CPU ranks on different machines in agreement.
inline float Sigmoid(float z) {
  return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z))));
}

// For every activation row r and weight row j: store(r, j, w_j . in_r) in FP32. Weight rows are
// decoded a tile at a time into `tile` and reused for all activation rows; the tiling and the
// pairing of rows in Dot2 change which loads are shared, never a dot product's arithmetic.
template <typename Rows, typename Store>
void MatVecRows(const Rows& w, int num_w_rows, int rows, const float* in, std::vector<float>* tile,
                Store store) {
  const int k = w.cols;
  const int tile_rows = std::clamp(kTileBytes / (k * static_cast<int>(sizeof(float))), 2, 32) & ~1;
  tile->resize(static_cast<size_t>(tile_rows) * k);
  float* t = tile->data();
  for (int j0 = 0; j0 < num_w_rows; j0 += tile_rows) {
    const int count = std::min(tile_rows, num_w_rows - j0);
    for (int j = 0; j < count; ++j) w.Decode(j0 + j, t + static_cast<int64_t>(j) * k);
    for (int r = 0; r < rows; ++r) {
      const float* x = in + static_cast<int64_t>(r) * k;
      int j = 0;
      for (; j + 1 < count; j += 2) {
        const float* w0 = t + static_cast<int64_t>(j) * k;
        float d0, d1;
        ffn::Dot2(w0, w0 + k, x, k, &d0, &d1);
        store(r, j0 + j, d0);
        store(r, j0 + j + 1, d1);
      }
      if (j < count) store(r, j0 + j, ffn::Dot1(t + static_cast<int64_t>(j) * k, x, k));
    }
  }
}

// DESIGN.md §4 steps 1-4 for one expert over `rows` assignments.
// b1 [2I] and b2 [H] are the expert's biases, or nullptr.
template <typename Rows>
void ExpertFfn(const ModelSpec& spec, const Rows& w1, const Rows& w2, const float* b1,
               const float* b2, int inter, int rows, const uint8_t* const* x_rows,
               const uint8_t* const* x_scale_rows, const float* route_weights,
               uint16_t* const* out_rows, FfnScratch* scratch) {
  if (rows <= 0) return;
  const int hidden = spec.hidden;
  scratch->x.resize(static_cast<size_t>(rows) * hidden);
  scratch->act.resize(static_cast<size_t>(rows) * 2 * inter);
  scratch->h.resize(static_cast<size_t>(rows) * inter);

  // 1. x̂ = dequant(E4M3 x): exact products of E4M3 values and powers of two.
  for (int r = 0; r < rows; ++r) {
    numerics::DequantizeE4M3K32(x_rows[r], x_scale_rows[r], hidden,
                                scratch->x.data() + static_cast<int64_t>(r) * hidden);
  }

  // 2. a = Ŵ1 x̂ (+ b1) in FP32, rounded to BF16.
  float* act = scratch->act.data();
  MatVecRows(w1, 2 * inter, rows, scratch->x.data(), &scratch->w_rows,
             [act, inter, b1](int r, int j, float v) {
               if (b1 != nullptr) v += b1[j];
               act[static_cast<int64_t>(r) * 2 * inter + j] = numerics::RoundToBF16(v);
             });

  // 3. SwiGLU with the optional clamp, the up offset and the routing weight, in FP32, left to
  //    right: h = ((g' * sigmoid(alpha g')) * (u' + offset)) * w. fmin/fmax as on the device
  //    (NaN-ignoring).
  // 4a. ĥ = dequant(E4M3_k32(h)), block by block.
  const float alpha = spec.activation_alpha;
  const bool clamp = spec.activation_clamp.has_value();
  const float c = clamp ? *spec.activation_clamp : 0.0f;
  const float up_offset = spec.activation_up_offset;
  for (int r = 0; r < rows; ++r) {
    const float* a = act + static_cast<int64_t>(r) * 2 * inter;
    float* h = scratch->h.data() + static_cast<int64_t>(r) * inter;
    const float weight = route_weights != nullptr ? route_weights[r] : 1.0f;
    for (int i = 0; i < inter; ++i) {
      float gate = a[i];
      float up = a[inter + i];
      if (clamp) {
        gate = std::fmin(gate, c);
        up = std::fmax(std::fmin(up, c), -c);
      }
      const float sig = Sigmoid(alpha * gate);
      h[i] = gate * sig * (up + up_offset) * weight;
    }
    for (int b = 0; b < inter; b += numerics::kBlock) {
      uint8_t codes[numerics::kBlock];
      uint8_t scale;
      numerics::QuantizeE4M3K32(h + b, numerics::kBlock, codes, &scale);
      numerics::DequantizeE4M3K32(codes, &scale, numerics::kBlock, h + b);
    }
  }

  // 4b. p = Ŵ2 ĥ (+ w b2) in FP32, rounded to BF16 into the caller's rows. The routing weight
  //     is already inside ĥ, so the bias takes it here: w (W2 h + b2) of the model.
  MatVecRows(w2, hidden, rows, scratch->h.data(), &scratch->w_rows,
             [out_rows, b2, route_weights](int r, int j, float v) {
               if (b2 != nullptr) {
                 const float weight = route_weights != nullptr ? route_weights[r] : 1.0f;
                 v += weight * b2[j];
               }
               out_rows[r][j] = numerics::FloatToBF16(v);
             });
}

}  // namespace

void RoutedExpertFfn(const ModelSpec& spec, const ExpertWeights& w, int rows,
                     const uint8_t* const* x_rows, const uint8_t* const* x_scale_rows,
                     const float* route_weights, uint16_t* const* out_rows, FfnScratch* scratch) {
  const E2M1Rows w1{w.w1.data(), w.w1_scales.data(), spec.hidden};
  const E2M1Rows w2{w.w2.data(), w.w2_scales.data(), spec.intermediate};
  const float* b1 = w.has_biases() ? w.b1.data() : nullptr;
  const float* b2 = w.has_biases() ? w.b2.data() : nullptr;
  ExpertFfn(spec, w1, w2, b1, b2, spec.intermediate, rows, x_rows, x_scale_rows, route_weights,
            out_rows, scratch);
}

void SharedExpertFfn(const ModelSpec& spec, const SharedExpertWeights& w, int rows,
                     const uint8_t* const* x_rows, const uint8_t* const* x_scale_rows,
                     uint16_t* const* out_rows, FfnScratch* scratch) {
  const E4M3Rows w1{w.w1.data(), w.w1_scales.data(), spec.hidden};
  const E4M3Rows w2{w.w2.data(), w.w2_scales.data(), spec.shared_intermediate};
  ExpertFfn(spec, w1, w2, nullptr, nullptr, spec.shared_intermediate, rows, x_rows, x_scale_rows,
            nullptr, out_rows, scratch);
}

}  // namespace gcmoe::engine
