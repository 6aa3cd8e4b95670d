// adaptive_avg_pool2d to (1, 1), NCHW, for small unaligned planes (7x7 = 49): each block stages
// PLANES consecutive planes (PLANES * HW contiguous elements) through shared memory with fully
// coalesced 16-byte loads, then THREADS / PLANES threads per plane sum it from shared memory.
// The tile keeps the input's raw bits: each 16-byte vector goes to shared memory as one 16-byte
// store (converting first to floats would make 8 scalar stores per vector, 8-way bank conflicts).
// The vector path needs the tile start to be 16-byte aligned: (PLANES * HW) % VEC == 0.
// Dynamic shared memory: PLANES * HW elements of the input type.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}

template <int V>
__device__ __forceinline__ void pool_tile_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes,
                                               int hw, typename Elem<T_X>::bits* tile) {
  typedef typename Elem<T_X>::bits B;
  const long long p0 = (long long)blockIdx.x * PLANES;
  const int np = (int)min((long long)PLANES, planes - p0);
  const int n = np * hw;  // elements in this block's tile
  const T_X* xt = x + p0 * hw;
  for (int base = 0; base < n; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i + V <= n) a[u].template load<LOAD_HINT>(xt + i);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i + V <= n) {
        // raw 16-byte (or element-sized) chunks: a Vec of one 16-bit element is 4 bytes wide
        typedef typename Vec<T_X, V>::R R;
#pragma unroll
        for (int c = 0; c < Vec<T_X, V>::NCHUNK; ++c) reinterpret_cast<R*>(tile + i)[c] = a[u].u.r[c];
      } else {
        for (int j = i; j < n; ++j) tile[j] = reinterpret_cast<const B*>(xt)[j];
      }
    }
  }
  __syncthreads();
  constexpr int TPP = THREADS / PLANES;  // threads per plane (a power of two <= 32)
  const int p = (int)threadIdx.x / TPP, l = (int)threadIdx.x % TPP;
  float acc = 0.f;
  if (p < np)
    for (int i = l; i < hw; i += TPP) acc += Elem<T_X>::to_f(tile[p * hw + i]);
  acc = group_sum<TPP>(acc);
  if (l == 0 && p < np) store1(out + p0 + p, __fdividef(acc, (float)hw));
}

extern "C" __global__ void __launch_bounds__(THREADS)
adaptive_avg_pool2d_nchw_tile(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes, int hw) {
  extern __shared__ uint4 tile_smem[];  // 16-byte aligned
  typename Elem<T_X>::bits* tile = reinterpret_cast<typename Elem<T_X>::bits*>(tile_smem);
  if (VEC > 1 && (PLANES * hw) % VEC == 0 && vec_aligned<T_X, VEC>(x))
    pool_tile_impl<VEC>(x, out, planes, hw, tile);
  else
    pool_tile_impl<1>(x, out, planes, hw, tile);
}
