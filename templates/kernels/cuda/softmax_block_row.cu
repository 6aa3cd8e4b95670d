// softmax / log_softmax over the last dim: one block per row, the row held in registers.
// One read of x, one write of out; exp computed once per element. Rows up to
// THREADS * VEC * ITEMS elements (the launch spec requires it). 16-byte vector loads when
// cols % VEC == 0 and both pointers are aligned, else an element-wise path with the same layout.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _softmax.cuh}}

template <int V>
__device__ __forceinline__ void softmax_block_row_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out, int cols) {
  constexpr int NV = ITEMS * VEC / V;  // vectors per thread
  __shared__ float red[32];
  const T_X* xr = x + (long long)blockIdx.x * cols;
  T_OUT* orow = out + (long long)blockIdx.x * cols;
  float v[NV][V];
  float m = -FP_INF;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * THREADS + (int)threadIdx.x) * V;
    if (c < cols) {
      Vec<T_X, V> a;
      a.template load<LOAD_HINT>(xr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) { v[i][k] = a.get(k); m = fmaxf(m, v[i][k]); }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = -FP_INF;
    }
  }
  m = block_max<THREADS>(m, red);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = (i * THREADS + (int)threadIdx.x) * V < cols;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float e = sm_exp(v[i][k] - m);
      s += valid ? e : 0.f;
      if (!LOG) v[i][k] = e;
    }
  }
  s = block_sum<THREADS>(s, red);
  const float inv_sum = __fdividef(1.f, s), log_sum = logf(s);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (i * THREADS + (int)threadIdx.x) * V;
    if (c < cols) {
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.set(k, LOG ? sm_finish_log(v[i][k], m, log_sum) : v[i][k] * inv_sum);
      o.template store<STORE_HINT>(orow + c);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_block_row(const T_X* __restrict__ x, T_OUT* __restrict__ out, int cols) {
  if (VEC > 1 && cols % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    softmax_block_row_impl<VEC>(x, out, cols);
  else
    softmax_block_row_impl<1>(x, out, cols);
}
