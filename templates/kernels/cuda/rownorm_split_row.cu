// layer_norm / rms_norm for a few very long rows: each row is split over SPLIT blocks so that the
// whole GPU works (16 rows of 4 M elements would otherwise run on 16 blocks).
// Kernel 1 (<op>_split_stats): every block computes the statistics of its `chunk` of a row into
//   the workspace `ws` (rows * SPLIT float4): layer_norm the moments (count, mean, M2) of x minus
//   the row's first value (a shift every block of the row shares, so the partials merge exactly
//   by Chan's formula); rms_norm the sum of squares.
// Kernel 2 (<op>_split_norm): every block merges its row's SPLIT partials in a fixed order
//   (bitwise reproducible) and normalises(+affine) its chunk; the second read of a chunk mostly
//   hits L2 when the stats of the next rows are still running. `chunk` is a multiple of VEC.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _rownorm.cuh}}

// Partial statistics of columns [begin, end) of row xr for this thread; `sq` gets the sum of squares.
template <int V>
__device__ __forceinline__ Moments rn_chunk_moments(const T_X* __restrict__ xr, int begin, int end, float shift,
                                                    float& sq) {
  Moments st{0.f, 0.f, 0.f};
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      if (c < end) a[u].template load<LOAD_HINT>(xr + c);
    }
    float vals[UNROLL * V];
    int valid = 0;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = base + (u * THREADS + (int)threadIdx.x) * V;
      valid += (c < end) ? V : 0;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        vals[u * V + k] = (c < end) ? a[u].get(k) - shift : 0.f;
        sq += vals[u * V + k] * vals[u * V + k];
      }
    }
    if (!RMS) st = moments_merge(st, moments_of<UNROLL * V>(vals, valid));
  }
  return st;
}

template <int V>
__device__ __forceinline__ void rn_chunk_apply(const T_X* __restrict__ xr, WEIGHT_PARAM BIAS_PARAM
                                               T_OUT* __restrict__ orow, int begin, int end, float mean,
                                               float rstd OFFSET_PARAM) {
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
        rn_store<V>(orow + c, WEIGHT_ARG BIAS_ARG c, xs, mean, rstd OFFSET_ARG);
      }
    }
  }
}

__device__ __forceinline__ void rn_split_stats(const T_X* __restrict__ x, float4* __restrict__ ws, int cols,
                                               int chunk) {
  __shared__ float red[96];
  const long long row = blockIdx.x / SPLIT;
  const int part = blockIdx.x % SPLIT;
  const int begin = min(cols, part * chunk), end = min(cols, begin + chunk);
  const T_X* xr = x + row * cols;
  const float shift = RMS ? 0.f : load1(xr);
  float sq = 0.f;
  Moments st;
  if (VEC > 1 && cols % VEC == 0 && chunk % VEC == 0 && vec_aligned<T_X, VEC>(x))
    st = rn_chunk_moments<VEC>(xr, begin, end, shift, sq);
  else
    st = rn_chunk_moments<1>(xr, begin, end, shift, sq);
  if (RMS) {
    sq = block_sum<THREADS>(sq, red);
    if (threadIdx.x == 0) ws[blockIdx.x] = make_float4(0.f, 0.f, 0.f, sq);
  } else {
    st = block_moments<THREADS>(st, red);
    if (threadIdx.x == 0) ws[blockIdx.x] = make_float4(st.n, st.mean, st.m2, 0.f);
  }
}

__device__ __forceinline__ void rn_split_norm(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                              const float4* __restrict__ ws, T_OUT* __restrict__ out, int cols,
                                              int chunk, float eps OFFSET_PARAM) {
  __shared__ float red[96];
  const long long row = blockIdx.x / SPLIT;
  const int part = blockIdx.x % SPLIT;
  float mean = 0.f, rstd;
  if (RMS) {
    float sq = 0.f;
    for (int p = threadIdx.x; p < SPLIT; p += THREADS) sq += ws[row * SPLIT + p].w;
    rstd = rsqrtf(__fdividef(block_sum<THREADS>(sq, red), (float)cols) + eps);
  } else {
    Moments st{0.f, 0.f, 0.f};
    for (int p = threadIdx.x; p < SPLIT; p += THREADS) {
      const float4 q = ws[row * SPLIT + p];
      st = moments_merge(st, Moments{q.x, q.y, q.z});
    }
    st = block_moments<THREADS>(st, red);
    mean = load1(x + row * cols) + st.mean;
    rstd = rsqrtf(__fdividef(st.m2, (float)cols) + eps);
  }
  const int begin = min(cols, part * chunk), end = min(cols, begin + chunk);
  if (chunk % VEC == 0 && rn_vec_ok<VEC>(x, WEIGHT_ARG BIAS_ARG out, cols))
    rn_chunk_apply<VEC>(x + row * cols, WEIGHT_ARG BIAS_ARG out + row * cols, begin, end, mean, rstd OFFSET_ARG);
  else
    rn_chunk_apply<1>(x + row * cols, WEIGHT_ARG BIAS_ARG out + row * cols, begin, end, mean, rstd OFFSET_ARG);
}

#if RMS
extern "C" __global__ void __launch_bounds__(THREADS)
rms_norm_split_stats(const T_X* __restrict__ x, float4* __restrict__ ws, int cols, int chunk) {
  rn_split_stats(x, ws, cols, chunk);
}

extern "C" __global__ void __launch_bounds__(THREADS)
rms_norm_split_norm(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const float4* __restrict__ ws,
                    T_OUT* __restrict__ out, int cols, int chunk, float eps, float weight_offset) {
  const T_BIAS* bias = nullptr;
  rn_split_norm(x, weight, bias, ws, out, cols, chunk, eps, weight_offset);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS)
layer_norm_split_stats(const T_X* __restrict__ x, float4* __restrict__ ws, int cols, int chunk) {
  rn_split_stats(x, ws, cols, chunk);
}

extern "C" __global__ void __launch_bounds__(THREADS)
layer_norm_split_norm(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                      const T_BIAS* __restrict__ bias, const float4* __restrict__ ws, T_OUT* __restrict__ out,
                      int cols, int chunk, float eps) {
  rn_split_norm(x, weight, bias, ws, out, cols, chunk, eps, 0.f);
}
#endif
