#include "engine/ffn_dot.h"

#include <cstring>

namespace gcmoe::engine::ffn {
namespace {

// GCC/Clang vector types. Plain loops over float[16] accumulators were vectorized across k with
// shuffles (several times slower), so the lanes are explicit vectors: lane l is element l % W of
// vector l / W. Vectors are never passed by value: their ABI depends on the target.
using V4 = float __attribute__((vector_size(16)));
using V8 = float __attribute__((vector_size(32)));

// The fixed tree over the 16 lanes (l += l + 8, l += l + 4, l += l + 2, l += l + 1), written
// out per vector width.
template <typename V>
[[gnu::always_inline]] inline float ReduceLanes(const V* acc) {
  V4 quarter;  // lanes 0..3 after the first two levels
  if constexpr (sizeof(V) == sizeof(V4)) {
    // acc[0..3] hold lanes 0-3, 4-7, 8-11, 12-15.
    quarter = (acc[0] + acc[2]) + (acc[1] + acc[3]);
  } else {
    // acc[0..1] hold lanes 0-7, 8-15.
    const V8 eighth = acc[0] + acc[1];
    V4 lo, hi;
    std::memcpy(&lo, &eighth, sizeof(V4));
    std::memcpy(&hi, reinterpret_cast<const char*>(&eighth) + sizeof(V4), sizeof(V4));
    quarter = lo + hi;
  }
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

template <typename V>
[[gnu::always_inline]] inline void Dot2Body(const float* w0, const float* w1, const float* x,
                                            int n, float* out0, float* out1) {
  constexpr int kWidth = sizeof(V) / sizeof(float);
  constexpr int kCount = kDotLanes / kWidth;
  V acc0[kCount] = {};
  V acc1[kCount] = {};
  for (int k = 0; k < n; k += kDotLanes) {
    for (int v = 0; v < kCount; ++v) {
      V xv, a, b;
      std::memcpy(&xv, x + k + v * kWidth, sizeof(V));
      std::memcpy(&a, w0 + k + v * kWidth, sizeof(V));
      std::memcpy(&b, w1 + k + v * kWidth, sizeof(V));
      acc0[v] += a * xv;
      acc1[v] += b * xv;
    }
  }
  *out0 = ReduceLanes(acc0);
  *out1 = ReduceLanes(acc1);
}

template <typename V>
[[gnu::always_inline]] inline float Dot1Body(const float* w, const float* x, int n) {
  constexpr int kWidth = sizeof(V) / sizeof(float);
  constexpr int kCount = kDotLanes / kWidth;
  V acc[kCount] = {};
  for (int k = 0; k < n; k += kDotLanes) {
    for (int v = 0; v < kCount; ++v) {
      V xv, a;
      std::memcpy(&xv, x + k + v * kWidth, sizeof(V));
      std::memcpy(&a, w + k + v * kWidth, sizeof(V));
      acc[v] += a * xv;
    }
  }
  return ReduceLanes(acc);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define GCMOE_WIDE_DOT 1
// AVX2 without FMA: the same multiplies and adds per lane, twice as many per instruction.
__attribute__((target("avx2"))) void Dot2Avx2(const float* w0, const float* w1, const float* x,
                                               int n, float* out0, float* out1) {
  Dot2Body<V8>(w0, w1, x, n, out0, out1);
}
__attribute__((target("avx2"))) float Dot1Avx2(const float* w, const float* x, int n) {
  return Dot1Body<V8>(w, x, n);
}
#endif

using Dot2Fn = void (*)(const float*, const float*, const float*, int, float*, float*);
using Dot1Fn = float (*)(const float*, const float*, int);

float Dot1Portable(const float* w, const float* x, int n) { return Dot1Body<V4>(w, x, n); }

}  // namespace

void Dot2Portable(const float* w0, const float* w1, const float* x, int n, float* out0,
                  float* out1) {
  Dot2Body<V4>(w0, w1, x, n, out0, out1);
}

bool HasWideDot() {
#ifdef GCMOE_WIDE_DOT
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

void Dot2Wide(const float* w0, const float* w1, const float* x, int n, float* out0,
              float* out1) {
#ifdef GCMOE_WIDE_DOT
  Dot2Avx2(w0, w1, x, n, out0, out1);
#else
  Dot2Portable(w0, w1, x, n, out0, out1);
#endif
}

void Dot2(const float* w0, const float* w1, const float* x, int n, float* out0, float* out1) {
  static const Dot2Fn fn = HasWideDot() ? Dot2Wide : Dot2Portable;
  fn(w0, w1, x, n, out0, out1);
}

float Dot1(const float* w, const float* x, int n) {
#ifdef GCMOE_WIDE_DOT
  static const Dot1Fn fn = HasWideDot() ? Dot1Avx2 : Dot1Portable;
#else
  static const Dot1Fn fn = Dot1Portable;
#endif
  return fn(w, x, n);
}

}  // namespace gcmoe::engine::ffn
