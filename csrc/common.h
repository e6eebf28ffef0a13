// Shared helpers for the CPU kernels of reasonrl_fast.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "capability.h"
#include "row_indexer.h"

namespace reasonrl_fast {

// Below this, exp() underflows to a denormal or zero; clamping keeps exp(d) * d finite for
// d = -inf (a masked-out logit), which gives the 0 * log 0 = 0 convention of entropy.
constexpr float kExpFloor = -87.0f;

// The exponent below which token_logprob treats exp() as 0 in acc_t: kExpFloor for float (where
// fast_exp stops), and the point where exp underflows to 0 for double.
template <typename T>
constexpr T exp_floor() {
  return std::is_same_v<T, double> ? T(-745.0) : T(kExpFloor);
}

// exp(x) for x <= ~1 in float32, written so that GCC vectorises it inside `#pragma omp simd`
// loops (std::exp does not vectorise without -ffast-math): exp(x) = 2^n exp(f) with
// n = round(x / ln 2) and f = x - n ln 2 (Cody-Waite: ln 2 split in two so f is exact).
// Rounding by adding 1.5 * 2^23 (+ the exponent bias 127) leaves n + 127 in the low mantissa
// bits, which a shift moves into the exponent field: no floor, no float-to-int conversion, no
// branch. Needs -fno-trapping-math for the clamp to be if-converted (measured on this machine:
// 2.2 ns/element scalar, 0.35 ns/element vectorised with AVX2). Max relative error against
// double-precision exp over every float in [-87, 1], measured: 1.0e-7 (1.7 ulp).
static inline float fast_exp(float x) {
  x = x < kExpFloor ? kExpFloor : x;  // keeps NaN (the comparison is false)
  const float r = x * 1.44269504088896341f + 12583039.0f;  // 1.5 * 2^23 + 127
  const float n = r - 12583039.0f;
  float f = x - n * 0.693145751953125f;  // ln 2, high part: n * hi is exact
  f = f - n * 1.428606765330187e-06f;     // ln 2, low part
  // Taylor series of exp(f) on |f| <= ln(2)/2 to degree 7: truncation error < 6e-9.
  float p = 1.984126984126984e-04f;
  p = p * f + 1.388888888888889e-03f;
  p = p * f + 8.333333333333333e-03f;
  p = p * f + 4.166666666666666e-02f;
  p = p * f + 1.666666666666667e-01f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const uint32_t scale = __builtin_bit_cast(uint32_t, r) << 23;  // 2^n
  return p * __builtin_bit_cast(float, scale);
}

static inline double fast_exp(double x) { return std::exp(x); }

// The accumulation type: float for every reduced-precision input, double for double.
template <typename scalar_t>
using acc_type_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

}  // namespace reasonrl_fast
