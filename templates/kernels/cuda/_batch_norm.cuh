// ---- batch_norm (inference) helpers ----------------------------------------------------------
// out = x * a[c] + b[c], a = weight[c] * rsqrt(running_var[c] + eps), b = bias[c] - running_mean[c] * a.
// weight / bias are always kernel parameters (NULL when the call has none: HAS_WEIGHT / HAS_BIAS = 0).
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

__device__ __forceinline__ float2 bn_coef(BN_PARAMS int c, float eps) {
  const float a = WEIGHT_AT(c) * rsqrtf(load1(running_var + c) + eps);
  return make_float2(a, BIAS_AT(c) - load1(running_mean + c) * a);
}
