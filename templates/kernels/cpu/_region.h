// forge-pack region kernels (CPU): the math the generated expressions call (region_lower's op
// table), in fp32 as eager computes 16-bit dtypes, with NaN propagated as PyTorch does.
#define FP_FN static inline
// The generated code's index type: FP_IDX_T is int where the iteration space and every operand's
// furthest element lie below 2^30 (set per region by search/families/region.py), so that index
// division by the constant sizes is 32-bit; long long otherwise (and when no define is given).
#ifndef FP_IDX_T
#define FP_IDX_T long long
#endif
typedef FP_IDX_T fp_idx;
#define FP_INF INFINITY
#define FP_NAN NAN

FP_FN float fp_ld(const float* p) { return *p; }
FP_FN float fp_ld(const forge_bf16* p) { return forge_bf16_to_float(p->bits); }
FP_FN float fp_ld(const forge_f16* p) { return forge_f16_to_float(p->bits); }
FP_FN float fp_round_bf16(float v) { return forge_bf16_to_float(forge_float_to_bf16(v)); }
FP_FN float fp_round_f16(float v) { return forge_f16_to_float(forge_float_to_f16(v)); }
FP_FN float fp_exp(float v) { return std::exp(v); }
FP_FN float fp_log(float v) { return std::log(v); }
FP_FN float fp_sqrt(float v) { return std::sqrt(v); }
FP_FN float fp_rsqrt(float v) { return 1.0f / std::sqrt(v); }
FP_FN float fp_tanh(float v) { return std::tanh(v); }
FP_FN float fp_erf(float v) { return std::erf(v); }
FP_FN float fp_abs(float v) { return std::fabs(v); }
FP_FN float fp_pow(float a, float b) { return std::pow(a, b); }
FP_FN float fp_trunc(float v) { return std::trunc(v); }
FP_FN float fp_sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
FP_FN float fp_silu(float v) { return v / (1.0f + std::exp(-v)); }
FP_FN float fp_relu(float v) { return v < 0.0f ? 0.0f : v; }  // NaN stays NaN
FP_FN float fp_gelu(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); }
FP_FN float fp_gelu_tanh(float v) {
  return 0.5f * v * (1.0f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
}
FP_FN float fp_cos(float v) { return std::cos(v); }
FP_FN float fp_sin(float v) { return std::sin(v); }
FP_FN float fp_expm1(float v) { return std::expm1(v); }
FP_FN float fp_log1p(float v) { return std::log1p(v); }
FP_FN float fp_clamp_lo(float v, float lo) { return v < lo ? lo : v; }
FP_FN float fp_clamp_hi(float v, float hi) { return v > hi ? hi : v; }
FP_FN float fp_maxnan(float a, float b) { return (a != a || a > b) ? a : b; }
FP_FN float fp_minnan(float a, float b) { return (a != a || a < b) ? a : b; }
