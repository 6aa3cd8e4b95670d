// softmax / log_softmax over the last dim for a few very long rows: each row is split over SPLIT
// blocks so that the whole GPU works (8 rows of 262,144 would otherwise run on 8 blocks).
// Kernel 1 (softmax_split_stats): every block computes the online (max, sum) of its chunk and
//   writes it to the workspace `ws` (rows * SPLIT float2).
// Kernel 2 (softmax_split_norm): every block merges its row's SPLIT partials in a fixed order
//   (bitwise reproducible), then normalises its chunk (the second read mostly hits L2).
// `chunk` (a multiple of VEC) is the number of columns per block.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _softmax.cuh}}

template <int V>
__device__ __forceinline__ MaxSum chunk_stats(const T_X* __restrict__ xr, int begin, int end) {
  MaxSum st{-FP_INF, 0.f};
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < end) a[u].template load<LOAD_HINT>(xr + c);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < end) {
        float xs[V];
#pragma unroll
        for (int k = 0; k < V; ++k) xs[k] = a[u].get(k);
        sm_accumulate<V>(st, xs);
      }
    }
  }
  return st;
}

template <int V>
__device__ __forceinline__ void chunk_finish(const T_X* __restrict__ xr, T_OUT* __restrict__ orow, int begin, int end,
                                             MaxSum st) {
  const float inv_sum = __fdividef(1.f, st.s), log_sum = logf(st.s);
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < end) a[u].template load<LOAD_HINT>(xr + c);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < end) {
        Vec<T_OUT, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float xs = a[u].get(k);
          o.set(k, LOG ? sm_finish_log(xs, st.m, log_sum) : sm_exp(xs - st.m) * inv_sum);
        }
        o.template store<STORE_HINT>(orow + c);
      }
    }
  }
}

FP_DEV bool use_vec(const void* x, int cols, int chunk) {
  return VEC > 1 && cols % VEC == 0 && chunk % VEC == 0 && vec_aligned<T_X, VEC>(x);
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_split_stats(const T_X* __restrict__ x, float2* __restrict__ ws, int cols, int chunk) {
  __shared__ float red_m[32], red_s[32];
  const long long row = blockIdx.x / SPLIT;
  const int part = blockIdx.x % SPLIT;
  const int begin = part * chunk, end = min(cols, begin + chunk);
  const T_X* xr = x + row * cols;
  MaxSum st = use_vec(x, cols, chunk) ? chunk_stats<VEC>(xr, begin, end) : chunk_stats<1>(xr, begin, end);
  st = block_maxsum<THREADS>(st, red_m, red_s, SmExp());
  if (threadIdx.x == 0) ws[blockIdx.x] = make_float2(st.m, st.s);
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_split_norm(const T_X* __restrict__ x, const float2* __restrict__ ws, T_OUT* __restrict__ out, int cols,
                   int chunk) {
  __shared__ float red_m[32], red_s[32];
  const long long row = blockIdx.x / SPLIT;
  const int part = blockIdx.x % SPLIT;
  MaxSum st{-FP_INF, 0.f};
  for (int p = threadIdx.x; p < SPLIT; p += THREADS) {
    const float2 q = ws[row * SPLIT + p];
    st = maxsum_merge(st, MaxSum{q.x, q.y}, SmExp());
  }
  st = block_maxsum<THREADS>(st, red_m, red_s, SmExp());
  const int begin = part * chunk, end = min(cols, begin + chunk);
  if (use_vec(x, cols, chunk) && vec_aligned<T_OUT, VEC>(out))
    chunk_finish<VEC>(x + row * cols, out + row * cols, begin, end, st);
  else
    chunk_finish<1>(x + row * cols, out + row * cols, begin, end, st);
}
