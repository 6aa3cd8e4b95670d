// adaptive_avg_pool2d to (1, 1), NCHW, for small unaligned planes (7x7 = 49): each block stages
// PLANES consecutive planes (PLANES * HW contiguous elements) through shared memory with fully
// coalesced 16-byte loads, then THREADS / PLANES threads per plane sum it from shared memory.
// The tile keeps the input's raw bits: each 16-byte vector goes to shared memory as one 16-byte
// store (converting first to floats would make 8 scalar stores per vector, 8-way bank conflicts).
// The vector path needs the tile start to be 16-byte aligned: (PLANES * HW) % VEC == 0.
// PERSIST > 0: a grid of SMs x PERSIST blocks walks the tiles (grid stride); each block loads its
// next tile into registers while it sums the current one from shared memory, so loads stay in
// flight without block launch gaps (needs the tile in one trip: PLANES * HW <= THREADS * VEC * UNROLL).
// Dynamic shared memory: PLANES * HW elements of the input type.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}

// THREADS / PLANES threads per plane sum the staged tile (planes p0 .. p0 + np - 1).
FP_DEV void pool_tile_sum(T_OUT* __restrict__ out, const typename Elem<T_X>::bits* tile, long long p0, int np, int hw) {
  constexpr int TPP = THREADS / PLANES;  // threads per plane (a power of two <= 32)
  const int p = (int)threadIdx.x / TPP, l = (int)threadIdx.x % TPP;
  float acc = 0.f;
  if (p < np)
    for (int i = l; i < hw; i += TPP) acc += Elem<T_X>::to_f(tile[p * hw + i]);
  acc = group_sum<TPP>(acc);
  if (l == 0 && p < np) store1(out + p0 + p, __fdividef(acc, (float)hw));
}

template <int V>
__device__ __forceinline__ void pool_tile_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes,
                                               int hw, typename Elem<T_X>::bits* tile, long long tix) {
  typedef typename Elem<T_X>::bits B;
  const long long p0 = tix * PLANES;
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
  pool_tile_sum(out, tile, p0, np, hw);
}

#if PERSIST
// Tile tix's vectors into registers (one trip: the whole tile, ragged tail excluded).
template <int V>
FP_DEV void pool_tile_fetch(Vec<T_X, V> (&a)[UNROLL], const T_X* __restrict__ x, long long planes, int hw, long long tix) {
  const long long p0 = tix * PLANES;
  const int n = (int)min((long long)PLANES, planes - p0) * hw;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int i = (u * THREADS + (int)threadIdx.x) * V;
    if (i + V <= n) a[u].template load<LOAD_HINT>(x + p0 * hw + i);
  }
}

template <int V>
__device__ __forceinline__ void pool_tile_persist(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes,
                                                  int hw, typename Elem<T_X>::bits* tile) {
  typedef typename Elem<T_X>::bits B;
  typedef typename Vec<T_X, V>::R R;
  const long long ntiles = (planes + PLANES - 1) / PLANES;
  long long t = blockIdx.x;
  Vec<T_X, V> a[UNROLL];
  if (t < ntiles) pool_tile_fetch<V>(a, x, planes, hw, t);
  for (; t < ntiles; t += gridDim.x) {
    const long long p0 = t * PLANES;
    const int np = (int)min((long long)PLANES, planes - p0);
    const int n = np * hw;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = (u * THREADS + (int)threadIdx.x) * V;
      if (i + V <= n) {
#pragma unroll
        for (int c = 0; c < Vec<T_X, V>::NCHUNK; ++c) reinterpret_cast<R*>(tile + i)[c] = a[u].u.r[c];
      } else {
        for (int j = i; j < min(n, i + V); ++j) tile[j] = reinterpret_cast<const B*>(x + p0 * hw)[j];
      }
    }
    __syncthreads();
    if (t + gridDim.x < ntiles) pool_tile_fetch<V>(a, x, planes, hw, t + gridDim.x);  // in flight while summing
    pool_tile_sum(out, tile, p0, np, hw);
    __syncthreads();  // the tile is restaged next trip
  }
}
#endif

// PERSIST blocks per SM must be resident together (a block that starts late walks its tiles late).
#if PERSIST
#define TILE_BOUNDS __launch_bounds__(THREADS, PERSIST)
#else
#define TILE_BOUNDS __launch_bounds__(THREADS)
#endif
extern "C" __global__ void TILE_BOUNDS
adaptive_avg_pool2d_nchw_tile(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes, int hw) {
  extern __shared__ uint4 tile_smem[];  // 16-byte aligned
  typename Elem<T_X>::bits* tile = reinterpret_cast<typename Elem<T_X>::bits*>(tile_smem);
#if PERSIST
  if (VEC > 1 && (PLANES * hw) % VEC == 0 && vec_aligned<T_X, VEC>(x)) {
    pool_tile_persist<VEC>(x, out, planes, hw, tile);
  } else {
    for (long long t = blockIdx.x; t < (planes + PLANES - 1) / PLANES; t += gridDim.x) {
      pool_tile_impl<1>(x, out, planes, hw, tile, t);
      __syncthreads();
    }
  }
#else
  if (VEC > 1 && (PLANES * hw) % VEC == 0 && vec_aligned<T_X, VEC>(x))
    pool_tile_impl<VEC>(x, out, planes, hw, tile, blockIdx.x);
  else
    pool_tile_impl<1>(x, out, planes, hw, tile, blockIdx.x);
#endif
}
