// layer_norm over the last dim of an x whose rows are each contiguous but not packed
// (a transposed view, e.g. torchvision's ViT hands its encoder norm a (N, S, C) view of an
// (S, N, C) tensor): row r starts at element (r / inner) * so + (r % inner) * si; out is
// contiguous. One warp per row (THREADS / 32 rows per block) streams it twice: vector-batched
// moments around the row's first value, shuffle reductions, then the normalise pass re-reads the row (from L1/L2). Any row length.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _rownorm.cuh}}

template <int V>
__device__ __forceinline__ void rn_strided_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                T_OUT* __restrict__ out, long long rows, int cols, int inner,
                                                long long so, long long si, float eps OFFSET_PARAM) {
  constexpr int RPB = THREADS / 32;
  const int lane = (int)threadIdx.x & 31;
  const long long row = (long long)blockIdx.x * RPB + (int)threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together: the shuffles below stay within a warp
  const T_X* xr = x + (row / inner) * so + (row % inner) * si;
  T_OUT* orow = out + row * cols;
  const float shift = RMS ? 0.f : load1(xr);
  Moments st{0.f, 0.f, 0.f};
  float sq = 0.f;
  for (int base = 0; base < cols; base += 32 * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * 32 + lane) * V;
      if (c < cols) a[u].template load<LOAD_HINT>(xr + c);
    }
    float vals[UNROLL * V];
    int valid = 0;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * 32 + lane) * V;
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
    rstd = rsqrtf(__fdividef(group_sum<32>(sq), (float)cols) + eps);
  } else {
    st = group_moments<32>(st);
    mean = shift + st.mean;
    rstd = rsqrtf(__fdividef(st.m2, (float)cols) + eps);
  }
  for (int base = 0; base < cols; base += 32 * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * 32 + lane) * V;
      if (c < cols) a[u].template load<LOAD_HINT>(xr + c);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * 32 + lane) * V;
      if (c < cols) {
        float xs[V];
#pragma unroll
        for (int k = 0; k < V; ++k) xs[k] = a[u].get(k);
        rn_store<V>(orow + c, WEIGHT_ARG BIAS_ARG c, xs, mean, rstd OFFSET_ARG);
      }
    }
  }
}

// Vector access needs every row start aligned too: both strides multiples of VEC.
#define RN_STRIDED_VEC_OK (so % VEC == 0 && si % VEC == 0)

extern "C" __global__ void __launch_bounds__(THREADS)
layer_norm_strided_row(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                       const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, long long rows, int cols, int inner,
                       long long so, long long si, float eps) {
  if (RN_STRIDED_VEC_OK && rn_vec_ok<VEC>(x, weight, bias, out, cols))
    rn_strided_impl<VEC>(x, weight, bias, out, rows, cols, inner, so, si, eps, 0.f);
  else
    rn_strided_impl<1>(x, weight, bias, out, rows, cols, inner, so, si, eps, 0.f);
}
