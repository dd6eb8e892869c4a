// Internal: the FP32 dot products of the CPU expert math (expert_ffn.cc).
//
// Fixed summation order, the same on every target and for every caller: lane l (of 16) sums
// w[k] * x[k] for k = l, l + 16, l + 32, ... in increasing k; then the lanes are reduced in a
// fixed tree (l += l + 8, l += l + 4, l += l + 2, l += l + 1). No multiply-add contraction.
// n is a multiple of 16.
#pragma once

namespace gcmoe::engine::ffn {

inline constexpr int kDotLanes = 16;

// *out0 = w0 . x and *out1 = w1 . x; x is read once for both.
void Dot2(const float* w0, const float* w1, const float* x, int n, float* out0, float* out1);
float Dot1(const float* w, const float* x, int n);

// The implementations behind Dot2, exposed so tests can check they agree bit for bit:
// 4-wide vectors (every target), and 8-wide AVX2 ones where the CPU has AVX2.
void Dot2Portable(const float* w0, const float* w1, const float* x, int n, float* out0,
                  float* out1);
bool HasWideDot();
void Dot2Wide(const float* w0, const float* w1, const float* x, int n, float* out0,
              float* out1);  // only when HasWideDot()

}  // namespace gcmoe::engine::ffn
