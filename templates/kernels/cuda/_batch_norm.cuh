// ---- batch_norm (inference) helpers ----------------------------------------------------------
// out = (x - running_mean[c]) * a[c] + bias[c], a = weight[c] * rsqrt(running_var[c] + eps).
// (x - mean first: folding the mean into the shift, x * a + b, cancels when |mean| >> std.)
// weight / bias are always kernel parameters (NULL when the call has none: HAS_WEIGHT / HAS_BIAS).
#define WEIGHT_PARAM const T_WEIGHT* __restrict__ weight,
#define WEIGHT_ARG weight,
#define BIAS_PARAM const T_BIAS* __restrict__ bias,
#define BIAS_ARG bias,
#if HAS_WEIGHT
#define WEIGHT_AT(c) load1(weight + (c))
#else
#define WEIGHT_AT(c) 1.f
#endif
#if HAS_BIAS
#define BIAS_AT(c) load1(bias + (c))
#else
#define BIAS_AT(c) 0.f
#endif
#define BN_PARAMS const T_RUNNING_MEAN* __restrict__ running_mean, const T_RUNNING_VAR* __restrict__ running_var, \
                  WEIGHT_PARAM BIAS_PARAM
#define BN_ARGS running_mean, running_var, WEIGHT_ARG BIAS_ARG

// Per-channel (mean, scale, shift); apply with bn_apply(x, coef).
__device__ __forceinline__ float3 bn_coef(BN_PARAMS int c, float eps) {
  const float a = WEIGHT_AT(c) * rsqrtf(load1(running_var + c) + eps);
  return make_float3(load1(running_mean + c), a, BIAS_AT(c));
}
FP_DEV float bn_apply(float x, float3 k) { return fmaf(x - k.x, k.y, k.z); }
