// softmax / log_softmax over the last dim, any row length: one block per row, single-pass online
// statistics (running max and rescaled sum, one exp per element), then a second pass that reads
// x again (from L2 for rows that fit) and writes out. UNROLL vector loads in flight per thread.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _softmax.cuh}}

template <int V>
__device__ __forceinline__ void softmax_online_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out, int cols) {
  __shared__ float red_m[32], red_s[32];
  const T_X* xr = x + (long long)blockIdx.x * cols;
  T_OUT* orow = out + (long long)blockIdx.x * cols;
  const int nvec = cols / V;  // V divides cols on the vector path; V == 1 otherwise
  MaxSum st{-FP_INF, 0.f};
  for (int base = 0; base < nvec; base += THREADS * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = base + u * THREADS + (int)threadIdx.x;
      if (j < nvec) a[u].template load<LOAD_HINT>(xr + (long long)j * V);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = base + u * THREADS + (int)threadIdx.x;
      if (j < nvec) {
        float xs[V];
#pragma unroll
        for (int k = 0; k < V; ++k) xs[k] = a[u].get(k);
        sm_accumulate<V>(st, xs);
      }
    }
  }
  st = block_maxsum<THREADS>(st, red_m, red_s, SmExp());
  const float inv_sum = __fdividef(1.f, st.s), log_sum = logf(st.s);
  for (int base = 0; base < nvec; base += THREADS * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = base + u * THREADS + (int)threadIdx.x;
      if (j < nvec) a[u].template load<LOAD_HINT>(xr + (long long)j * V);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = base + u * THREADS + (int)threadIdx.x;
      if (j < nvec) {
        Vec<T_OUT, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xs = a[u].get(k);
          o.set(k, LOG ? sm_finish_log(xs, st.m, log_sum) : sm_exp(xs - st.m) * inv_sum);
        }
        o.template store<STORE_HINT>(orow + (long long)j * V);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_online(const T_X* __restrict__ x, T_OUT* __restrict__ out, int cols) {
  if (VEC > 1 && cols % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    softmax_online_impl<VEC>(x, out, cols);
  else
    softmax_online_impl<1>(x, out, cols);
}
