// adaptive_avg_pool2d to (1, 1), NCHW, small planes (7x7 = 49), as a pipelined stream: a grid of
// BLOCKS blocks per multiprocessor (persistent, each takes every gridDim.x-th tile of PLANES
// consecutive planes) keeps STAGES tiles in flight in a ring of shared-memory buffers. On sm_90+
// each tile is one bulk asynchronous copy (cp.async.bulk: one thread issues it, the copy engine
// moves the bytes, an mbarrier counts them in), so loads never stop while the block sums the
// tile before it: THREADS / PLANES threads per plane add it from shared memory, then the buffer
// is refilled with the tile STAGES ahead.
// A tile goes through the bulk path when its bytes are a multiple of 16 and x is 16-byte aligned
// (every full tile then is); otherwise, before sm_90, and for the last partial tile, the same
// tiles are loaded element-wise (correct, not pipelined).
// Dynamic shared memory: STAGES * round_up(PLANES * HW * sizeof(x), 16) bytes.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}

typedef typename Elem<T_X>::bits PoolB;

FP_DEV void pool_sum_tile(const PoolB* tile, T_OUT* __restrict__ out, long long p0, int np, int hw) {
  constexpr int TPP = THREADS / PLANES;  // threads per plane (a power of two <= 32)
  const int p = (int)threadIdx.x / TPP, l = (int)threadIdx.x % TPP;
  float acc = 0.f;
  if (p < np)
    for (int i = l; i < hw; i += TPP) acc += Elem<T_X>::to_f(tile[p * hw + i]);
  acc = group_sum<TPP>(acc);
  if (l == 0 && p < np) store1(out + p0 + p, __fdividef(acc, (float)hw));
}

// One tile through plain element loads (any alignment, any size), then summed.
FP_DEV void pool_plain_tile(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long p0, int np, int hw,
                            PoolB* tile) {
  const PoolB* src = reinterpret_cast<const PoolB*>(x) + p0 * hw;
  const int n = np * hw;
  for (int i = (int)threadIdx.x; i < n; i += THREADS) tile[i] = ld_raw<LOAD_HINT>(src + i);
  __syncthreads();
  pool_sum_tile(tile, out, p0, np, hw);
  __syncthreads();
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
FP_DEV unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
FP_DEV void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
FP_DEV void bar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\n\t.reg .pred done;\n"
               "POOL_WAIT:\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
               "@!done bra POOL_WAIT;\n}" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
adaptive_avg_pool2d_nchw_bulk(const T_X* __restrict__ x, T_OUT* __restrict__ out, long long planes, int hw) {
  extern __shared__ uint4 pool_smem[];  // STAGES buffers, each 16-byte aligned
  PoolB* bufs = reinterpret_cast<PoolB*>(pool_smem);
  const long long ntiles = planes / PLANES;  // full tiles; planes % PLANES are the partial last tile
  const unsigned tile_bytes = (unsigned)(PLANES * hw * (int)sizeof(PoolB));
  const int stride = (int)(((tile_bytes + 15u) & ~15u) / sizeof(PoolB));  // elements per buffer
  long long t = blockIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ unsigned long long full[STAGES];
  if (tile_bytes % 16u == 0 && (reinterpret_cast<unsigned long long>(x) & 15ull) == 0) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) {
        const long long ts = t + (long long)s * gridDim.x;
        if (ts < ntiles) bulk_load(bufs + s * stride, x + ts * PLANES * hw, tile_bytes, &full[s]);
      }
    }
    int s = 0;
    unsigned phase = 0;
    for (; t < ntiles; t += gridDim.x) {
      bar_wait(&full[s], phase);
      pool_sum_tile(bufs + s * stride, out, t * PLANES, PLANES, hw);
      __syncthreads();  // every thread is done with buffer s before it is refilled
      const long long tn = t + (long long)STAGES * gridDim.x;
      if (threadIdx.x == 0 && tn < ntiles) bulk_load(bufs + s * stride, x + tn * PLANES * hw, tile_bytes, &full[s]);
      if (++s == STAGES) { s = 0; phase ^= 1u; }
    }
  }
#endif
  for (; t < ntiles; t += gridDim.x) pool_plain_tile(x, out, t * PLANES, PLANES, hw, bufs);
  // the partial last tile: the block whose turn it would be
  if (planes % PLANES && (long long)blockIdx.x == ntiles % gridDim.x)
    pool_plain_tile(x, out, ntiles * PLANES, (int)(planes % PLANES), hw, bufs);
}
