// layer_norm / rms_norm over the last dim: LANES threads per row (a warp, or part of one for
// short rows), THREADS / LANES rows per block, the row in registers, shuffle reductions only.
// Rows up to LANES * VEC * ITEMS (the launch spec requires it).
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _rownorm.cuh}}

template <int V>
__device__ __forceinline__ void rn_warp_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM T_OUT* __restrict__ out,
                                             long long rows, int cols, float eps OFFSET_PARAM) {
  constexpr int NV = ITEMS * VEC / V;
  constexpr int RPB = THREADS / LANES;
  const int lane = (int)threadIdx.x % LANES;
  const long long row = (long long)blockIdx.x * RPB + (int)threadIdx.x / LANES;
  const int ncols = row < rows ? cols : 0;  // idle lanes still join the shuffles
  const T_X* xr = x + row * cols;
  T_OUT* orow = out + row * cols;
  float v[NV][V];
  // layer_norm sums x - shift (the row's first value): small sums even when |mean| >> std
  const float shift = (RMS || ncols == 0) ? 0.f : load1(xr);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * LANES + lane) * V;
    if (c < ncols) {
      Vec<T_X, V> a;
      a.template load<LOAD_HINT>(xr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) { v[i][k] = a.get(k); s += RMS ? v[i][k] * v[i][k] : v[i][k] - shift; }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = 0.f;
    }
  }
  s = group_sum<LANES>(s);
  float mean = 0.f, rstd;
  if (RMS) {
    rstd = rsqrtf(__fdividef(s, (float)cols) + eps);
  } else {
    mean = shift + __fdividef(s, (float)cols);
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const bool valid = (i * LANES + lane) * V < ncols;
#pragma unroll
      for (int k = 0; k < V; ++k) { const float d = v[i][k] - mean; q += valid ? d * d : 0.f; }
    }
    rstd = rsqrtf(__fdividef(group_sum<LANES>(q), (float)cols) + eps);
  }
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * LANES + lane) * V;
    if (c < ncols) rn_store<V>(orow + c, WEIGHT_ARG BIAS_ARG c, v[i], mean, rstd OFFSET_ARG);
  }
}

#if RMS
extern "C" __global__ void __launch_bounds__(THREADS)
rms_norm_warp_row(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, T_OUT* __restrict__ out,
                  long long rows, int cols, float eps, float weight_offset) {
  const T_BIAS* bias = nullptr;
  if (rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_warp_impl<VEC>(x, weight, bias, out, rows, cols, eps, weight_offset);
  else
    rn_warp_impl<1>(x, weight, bias, out, rows, cols, eps, weight_offset);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS)
layer_norm_warp_row(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias,
                    T_OUT* __restrict__ out, long long rows, int cols, float eps) {
  if (rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_warp_impl<VEC>(x, weight, bias, out, rows, cols, eps, 0.f);
  else
    rn_warp_impl<1>(x, weight, bias, out, rows, cols, eps, 0.f);
}
#endif
