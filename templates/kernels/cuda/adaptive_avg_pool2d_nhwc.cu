// adaptive_avg_pool2d to (1, 1), channels_last (NHWC in memory): a 2-D block, threadIdx.x along
// channel vectors (VEC channels, 16-byte loads), threadIdx.y splitting the HW pixels; partial
// sums meet in shared memory. Grid: (channel-vector blocks, N). out[n, c] = sum / HW.
// The vector path needs C % VEC == 0 and an aligned pointer. Dynamic shared memory:
// blockDim.x * blockDim.y * VEC floats.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}

template <int V>
__device__ __forceinline__ void pool_nhwc_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out, int C, int hw,
                                               float* part) {
  const int n = blockIdx.y;
  const float inv = __fdividef(1.f, (float)hw);
  // The grid covers C / VEC channel vectors; the element-wise path (V = 1) loops to cover all C.
  // The loop bound is uniform over the block, so the barrier inside is safe.
  for (int cbase = blockIdx.x * blockDim.x; cbase * V < C; cbase += gridDim.x * blockDim.x) {
    const int cv = cbase + threadIdx.x;  // channel vector
    const bool active = cv * V < C;
    const T_X* xn = x + (long long)n * hw * C + (long long)cv * V;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    for (int base = threadIdx.y; base < hw; base += blockDim.y * UNROLL) {
      Vec<T_X, V> a[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int p = base + u * blockDim.y;
        if (active && p < hw) a[u].template load<LOAD_HINT>(xn + (long long)p * C);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int p = base + u * blockDim.y;
        if (active && p < hw) {
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += a[u].get(k);
        }
      }
    }
    if (blockDim.y > 1) {
      // part[(y * blockDim.x + x) * V + k]; row 0 then sums the blockDim.y partials in order.
      __syncthreads();
#pragma unroll
      for (int k = 0; k < V; ++k) part[(threadIdx.y * blockDim.x + threadIdx.x) * V + k] = acc[k];
      __syncthreads();
      if (threadIdx.y == 0)
        for (int y = 1; y < (int)blockDim.y; ++y)
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += part[(y * blockDim.x + threadIdx.x) * V + k];
    }
    if (active && threadIdx.y == 0) {
#pragma unroll
      for (int k = 0; k < V; ++k) store1(out + (long long)n * C + cv * V + k, acc[k] * inv);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
adaptive_avg_pool2d_nhwc(const T_X* __restrict__ x, T_OUT* __restrict__ out, int C, int hw) {
  extern __shared__ float part[];
  if (VEC > 1 && C % VEC == 0 && vec_aligned<T_X, VEC>(x))
    pool_nhwc_impl<VEC>(x, out, C, hw, part);
  else
    pool_nhwc_impl<1>(x, out, C, hw, part);
}
