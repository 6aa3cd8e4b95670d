// softmax / log_softmax over the last dim: LANES threads per row (a warp, or a fraction of one for
// short rows such as MoE routers), THREADS / LANES rows per block, the row held in registers.
// Reductions are register shuffles only (no shared memory, no block barrier). Rows up to
// LANES * VEC * ITEMS elements (the launch spec requires it). 16-byte vector loads when
// cols % VEC == 0 and both pointers are aligned, else an element-wise path.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _softmax.cuh}}

template <int V>
__device__ __forceinline__ void softmax_warp_row_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out,
                                                      long long rows, int cols) {
  constexpr int NV = ITEMS * VEC / V;
  constexpr int RPB = THREADS / LANES;  // rows per block
  const int lane = (int)threadIdx.x % LANES;
  const long long row = (long long)blockIdx.x * RPB + (int)threadIdx.x / LANES;
  // Out-of-range rows still take part in the shuffles (every lane of the warp must), storing nothing.
  const int ncols = row < rows ? cols : 0;
  const T_X* xr = x + row * cols;
  T_OUT* orow = out + row * cols;
  float v[NV][V];
  float m = -FP_INF;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * LANES + lane) * V;
    if (c < ncols) {
      Vec<T_X, V> a;
      a.template load<LOAD_HINT>(xr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) { v[i][k] = a.get(k); m = fmaxf(m, v[i][k]); }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = -FP_INF;
    }
  }
  m = group_max<LANES>(m);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = (i * LANES + lane) * V < ncols;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float e = sm_exp(v[i][k] - m);
      s += valid ? e : 0.f;
      if (!LOG) v[i][k] = e;
    }
  }
  s = group_sum<LANES>(s);
  const float inv_sum = __fdividef(1.f, s), log_sum = logf(s);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * LANES + lane) * V;
    if (c < ncols) {
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.set(k, LOG ? sm_finish_log(v[i][k], m, log_sum) : v[i][k] * inv_sum);
      o.template store<STORE_HINT>(orow + c);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_warp_row(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long rows, int cols) {
  if (VEC > 1 && cols % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    softmax_warp_row_impl<VEC>(x, out, rows, cols);
  else
    softmax_warp_row_impl<1>(x, out, rows, cols);
}
