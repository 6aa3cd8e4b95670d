// ---------------------------------------------------------------------------------------------
// forge-pack CPU template prelude: OpenMP kernels over rows / groups / channels with loops the
// compiler vectorises (`#pragma omp simd`, restrict pointers). bf16 / f16 arrive as forge_bf16 /
// forge_f16 (forge_cpu.h: to_float() and forge_store() overloads for every element type).
// ---------------------------------------------------------------------------------------------
#include <cmath>
#include <cstdint>
#include <cstring>
#include "forge_cpu.h"

#define FP_RESTRICT __restrict__

// max that ignores NaN (like fmaxf) and vectorises to one instruction
static inline float fp_max(float a, float b) { return b > a ? b : a; }

// exp that vectorises: exp(x) = 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 (Cody-Waite),
// p a degree-6 polynomial (Cephes expf, ~1 ulp). exp(-inf) = 0 exactly, NaN stays NaN.
static inline float fp_exp_poly(float x) {
  const float lo = x > -87.33654f ? x : -87.33654f;  // ternaries vectorise; std::fmax may call libm
  const float xc = lo < 88.72283f ? lo : 88.72283f;
  // round to nearest with the 1.5 * 2^23 trick: std::floor is a libm call without -fno-trapping-math
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  const float v = y * scale;
  return x != x ? x : (x < -87.33654f ? 0.0f : (x > 88.72283f ? INFINITY : v));
}

#if defined(FAST_EXP) && FAST_EXP
#define FP_EXP(v) fp_exp_poly(v)
#else
#define FP_EXP(v) std::exp(v)
#endif
