// layer_norm / rms_norm over the last dim, any row length: one block per row; a statistics pass
// (layer_norm: vector-batched Welford/Chan merge, robust; rms_norm: sum of squares), then a
// normalise pass that re-reads the row (from L2 for rows that fit). UNROLL loads in flight.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _rownorm.cuh}}

template <int V>
__device__ __forceinline__ void rn_online_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                               T_OUT* __restrict__ out, int cols, float eps OFFSET_PARAM) {
  __shared__ float red[96];
  const T_X* xr = x + (long long)blockIdx.x * cols;
  T_OUT* orow = out + (long long)blockIdx.x * cols;
  Moments st{0.f, 0.f, 0.f};  // layer_norm: moments of x - shift (the row's first value)
  const float shift = RMS ? 0.f : load1(xr);
  float sq = 0.f;
  for (int base = 0; base < cols; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < cols) a[u].template load<LOAD_HINT>(xr + c);
    }
    float vals[UNROLL * V];
    int valid = 0;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      valid += (c < cols) ? V : 0;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        vals[u * V + k] = (c < cols) ? a[u].get(k) - shift : 0.f;
        sq += vals[u * V + k] * vals[u * V + k];
      }
    }
    if (!RMS) st = moments_merge(st, moments_of<UNROLL * V>(vals, valid));
  }
  float mean = 0.f, rstd;
  if (RMS) {
    rstd = rsqrtf(__fdividef(block_sum<THREADS>(sq, red), (float)cols) + eps);
  } else {
    st = block_moments<THREADS>(st, red);
    mean = shift + st.mean;
    rstd = rsqrtf(__fdividef(st.m2, (float)cols) + eps);
  }
  for (int base = 0; base < cols; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < cols) a[u].template load<LOAD_HINT>(xr + c);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < cols) {
        float xs[V];
#pragma unroll
        for (int k = 0; k < V; ++k) xs[k] = a[u].get(k);
        rn_store<V>(orow + c, WEIGHT_ARG BIAS_ARG c, xs, mean, rstd OFFSET_ARG);
      }
    }
  }
}

#if RMS
extern "C" __global__ void __launch_bounds__(THREADS)
rms_norm_online(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, T_OUT* __restrict__ out,
                int cols, float eps, float weight_offset) {
  const T_BIAS* bias = nullptr;
  if (rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_online_impl<VEC>(x, weight, bias, out, cols, eps, weight_offset);
  else
    rn_online_impl<1>(x, weight, bias, out, cols, eps, weight_offset);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS)
layer_norm_online(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias,
                  T_OUT* __restrict__ out, int cols, float eps) {
  if (rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_online_impl<VEC>(x, weight, bias, out, cols, eps, 0.f);
  else
    rn_online_impl<1>(x, weight, bias, out, cols, eps, 0.f);
}
#endif
