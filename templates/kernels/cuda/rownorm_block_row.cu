// layer_norm / rms_norm over the last dim: one block per row, the row held in registers (one
// read, one write; exact two-pass statistics from registers). Rows up to THREADS * VEC * ITEMS
// (the launch spec requires it). 16-byte vectors when cols % VEC == 0 and pointers are aligned.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _rownorm.cuh}}

template <int V>
__device__ __forceinline__ void rn_block_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                              T_OUT* __restrict__ out, int cols, float eps OFFSET_PARAM) {
  constexpr int NV = ITEMS * VEC / V;
  __shared__ float red[32];
  const T_X* xr = x + (long long)blockIdx.x * cols;
  T_OUT* orow = out + (long long)blockIdx.x * cols;
  float v[NV][V];
  // layer_norm sums x - shift (the row's first value): small sums even when |mean| >> std
  const float shift = (RMS) ? 0.f : load1(xr);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * THREADS + (int)threadIdx.x) * V;
    if (c < cols) {
      Vec<T_X, V> a;
      a.template load<LOAD_HINT>(xr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) { v[i][k] = a.get(k); s += RMS ? v[i][k] * v[i][k] : v[i][k] - shift; }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = 0.f;
    }
  }
  s = block_sum<THREADS>(s, red);
  float mean = 0.f, rstd;
  if (RMS) {
    rstd = rsqrtf(__fdividef(s, (float)cols) + eps);
  } else {
    mean = shift + __fdividef(s, (float)cols);
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const bool valid = (i * THREADS + (int)threadIdx.x) * V < cols;
#pragma unroll
      for (int k = 0; k < V; ++k) { const float d = v[i][k] - mean; q += valid ? d * d : 0.f; }
    }
    rstd = rsqrtf(__fdividef(block_sum<THREADS>(q, red), (float)cols) + eps);
  }
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * THREADS + (int)threadIdx.x) * V;
    if (c < cols) rn_store<V>(orow + c, WEIGHT_ARG BIAS_ARG c, v[i], mean, rstd OFFSET_ARG);
  }
}

#if RMS
extern "C" __global__ void __launch_bounds__(THREADS)
rms_norm_block_row(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, T_OUT* __restrict__ out,
                   int cols, float eps, float weight_offset) {
  const T_BIAS* bias = nullptr;
  if (rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_block_impl<VEC>(x, weight, bias, out, cols, eps, weight_offset);
  else
    rn_block_impl<1>(x, weight, bias, out, cols, eps, weight_offset);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS)
layer_norm_block_row(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias,
                     T_OUT* __restrict__ out, int cols, float eps) {
  if (rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_block_impl<VEC>(x, weight, bias, out, cols, eps, 0.f);
  else
    rn_block_impl<1>(x, weight, bias, out, cols, eps, 0.f);
}
#endif
