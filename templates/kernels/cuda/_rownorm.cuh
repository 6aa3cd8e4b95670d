// ---- layer_norm (RMS = 0) / rms_norm (RMS = 1) over the last `cols` elements of each row -----
// layer_norm: out = (x - mean) * rstd * weight + bias, biased variance, exact two-pass stats.
// rms_norm:   out = x * rsqrt(mean(x^2) + eps) * (weight + weight_offset) (offset 1: Gemma's 1 + w).
// Kernels are named layer_norm_<family> (x, weight, bias, out, ...) and rms_norm_<family>
// (x, weight, out, ..., weight_offset); absent weight / bias arrive as NULL and are not read.
#define WEIGHT_PARAM const T_WEIGHT* __restrict__ weight,
#define WEIGHT_ARG weight,
#define BIAS_PARAM const T_BIAS* __restrict__ bias,
#define BIAS_ARG bias,
#define OFFSET_PARAM , float weight_offset
#define OFFSET_ARG , weight_offset

// Normalise V consecutive values xs of columns c .. c + V - 1 and store them at o.
template <int V>
__device__ __forceinline__ void rn_store(T_OUT* __restrict__ o, WEIGHT_PARAM BIAS_PARAM int c, const float (&xs)[V],
                                         float mean, float rstd OFFSET_PARAM) {
  float w[V], b[V];
#if HAS_WEIGHT
  { Vec<T_WEIGHT, V> t; t.template load<1>(weight + c);
#pragma unroll
    for (int k = 0; k < V; ++k) w[k] = t.get(k); }
#else
#pragma unroll
  for (int k = 0; k < V; ++k) w[k] = 1.f;
#endif
#if HAS_BIAS
  { Vec<T_BIAS, V> t; t.template load<1>(bias + c);
#pragma unroll
    for (int k = 0; k < V; ++k) b[k] = t.get(k); }
#else
#pragma unroll
  for (int k = 0; k < V; ++k) b[k] = 0.f;
#endif
  Vec<T_OUT, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) {
#if RMS
    out.set(k, xs[k] * rstd * (w[k] + weight_offset));
#else
    out.set(k, fmaf((xs[k] - mean) * rstd, w[k], b[k]));
#endif
  }
  out.template store<STORE_HINT>(o);
}

template <int V>
__device__ __forceinline__ bool rn_vec_ok(const void* x, WEIGHT_PARAM BIAS_PARAM const void* out, int cols) {
  bool ok = VEC > 1 && cols % VEC == 0 && vec_aligned<T_X, V>(x) && vec_aligned<T_OUT, V>(out);
#if HAS_WEIGHT
  ok = ok && vec_aligned<T_WEIGHT, V>(weight);
#endif
#if HAS_BIAS
  ok = ok && vec_aligned<T_BIAS, V>(bias);
#endif
  return ok;
}
