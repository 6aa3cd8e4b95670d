// adaptive_avg_pool2d to (1, 1), NCHW: LANES threads per (n, c) plane (a warp for big planes,
// a few lanes for 7x7 = 49), THREADS / LANES planes per block, shuffle reduction, out[plane] =
// sum / HW. UNROLL loads in flight per lane; 16-byte vectors when HW % VEC == 0 and aligned.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}

template <int V>
__device__ __forceinline__ void pool_lanes_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes,
                                                int hw) {
  constexpr int PPB = THREADS / LANES;
  const int lane = (int)threadIdx.x % LANES;
  const long long plane = (long long)blockIdx.x * PPB + (int)threadIdx.x / LANES;
  const int n = plane < planes ? hw : 0;  // idle lanes still join the shuffles
  const T_X* xp = x + plane * hw;
  float acc = 0.f;
  for (int base = 0; base < n; base += LANES * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * LANES + lane) * V;
      if (i < n) a[u].template load<LOAD_HINT>(xp + i);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * LANES + lane) * V;
      if (i < n) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc += a[u].get(k);
      }
    }
  }
  acc = group_sum<LANES>(acc);
  if (lane == 0 && plane < planes) store1(out + plane, __fdividef(acc, (float)hw));
}

extern "C" __global__ void __launch_bounds__(THREADS)
adaptive_avg_pool2d_nchw_lanes(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes, int hw) {
  if (VEC > 1 && hw % VEC == 0 && vec_aligned<T_X, VEC>(x))
    pool_lanes_impl<VEC>(x, out, planes, hw);
  else
    pool_lanes_impl<1>(x, out, planes, hw);
}
