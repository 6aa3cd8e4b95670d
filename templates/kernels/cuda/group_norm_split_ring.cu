// group_norm for huge groups in ONE kernel with persistent blocks: block b owns chunk b (RING_CHUNK =
// THREADS * VEC * ITEMS elements) of every group, and its loop trip k does two things:
//   1. the moments of its chunk of group k (read from DRAM), published to a workspace; the last of
//      the gridDim.x blocks to publish merges all partials in block order and marks the group ready;
//   2. normalises its chunk of group k - LAG, whose statistics every block published LAG trips ago
//      (so the wait is normally over before it starts), re-reading the chunk from L2: LAG + 1 groups
//      are in flight, and the output is written with STORE_HINT.
// Unlike split_flow (one short-lived block per chunk and phase), no block ever occupies a slot
// while it waits, and each trip streams a DRAM read, an L2 read and a write together.
// The blocks must all be resident at once: the launch bounds the grid at RING_MINB blocks per SM of
// an H200 and __launch_bounds__ keeps the registers low enough for that many; a wait that lasts ~50 ms anyway (a GPU too small or busy) computes the group's moments
// from memory in the waiting block: slow, still correct. Merges are in a fixed order (bitwise
// reproducible). `sync` is a zero-filled int workspace of 3 * N * G ints (arrived, ready, left
// per group) that the kernel leaves zero again; `ws` holds the partials, `gstat` the groups'
// mean and rstd.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

template <int V>
__device__ __forceinline__ void gn_ring_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                             T_OUT* __restrict__ out, float4* __restrict__ ws,
                                             float2* __restrict__ gstat, int* __restrict__ sync, int gs, int hw,
                                             int cpg, int groups, int ngroups, float eps) {
  __shared__ float red[96];
  __shared__ int last;
  __shared__ float2 ms;
  const int nb = (int)gridDim.x, b = (int)blockIdx.x;
  const int begin = min(gs, b * RING_CHUNK), end = min(gs, begin + RING_CHUNK);
  for (int k = 0; k < ngroups + LAG; ++k) {
    if (k < ngroups) {  // 1. moments of chunk b of group k
      const T_X* xg = x + (long long)k * gs;
      const float shift = load1(xg);
      const Moments st = block_moments<THREADS>(gn_thread_moments<V, 0>(xg, begin, end, shift), red);
      if (threadIdx.x == 0) {
        ws[(long long)k * nb + b] = make_float4(st.n, st.mean, st.m2, 0.f);
        __threadfence();
        last = atomicAdd(sync + 3 * k, 1) == nb - 1;
        __threadfence();
      }
      __syncthreads();
      if (last) {  // every partial of group k is in: merge them in block order, publish
        Moments m{0.f, 0.f, 0.f};
        for (int p = threadIdx.x; p < nb; p += THREADS) {
          const float4 w = __ldcg(ws + (long long)k * nb + p);
          m = moments_merge(m, Moments{w.x, w.y, w.z});
        }
        m = block_moments<THREADS>(m, red);
        if (threadIdx.x == 0) {
          __stcg(gstat + k, make_float2(shift + m.mean, rsqrtf(__fdividef(m.m2, (float)gs) + eps)));
          __threadfence();
          atomicExch(sync + 3 * k + 1, 1);
        }
      }
    }
    const int a = k - LAG;
    if (a < 0) continue;
    // 2. normalise chunk b of group a
    GN_GROUP_PTRS(a)
    if (threadIdx.x == 0) {
      int* ready = sync + 3 * a + 1;
      const long long t0 = clock64();
      bool good = true;
      while (*reinterpret_cast<volatile int*>(ready) == 0) {
        __nanosleep(64);
        if (clock64() - t0 > 100000000LL) { good = false; break; }
      }
      __threadfence();
      if (good) {
        ms = __ldcg(gstat + a);
        if (atomicAdd(sync + 3 * a + 2, 1) == nb - 1) {  // the last to leave resets the group's counters
          atomicExch(sync + 3 * a, 0);
          atomicExch(sync + 3 * a + 1, 0);
          atomicExch(sync + 3 * a + 2, 0);
        }
      } else {
        ms = make_float2(0.f, -1.f);  // timed out: this block computes the moments itself
      }
    }
    __syncthreads();
    float2 mr = ms;
    if (mr.y < 0.f) {
      const float shift = load1(xg);
      const Moments st = block_moments<THREADS>(gn_thread_moments<V, 0>(xg, 0, gs, shift), red);
      mr = make_float2(shift + st.mean, rsqrtf(__fdividef(st.m2, (float)gs) + eps));
    }
    gn_apply<V, LOAD_HINT>(xg, og, weight, bias, begin, end, gn_first_channel(a, groups, cpg), hw, mr.x, mr.y);
    __syncthreads();  // `ms` and `red` are reused next trip
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, RING_MINB)
group_norm_split_ring(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                      const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, float4* __restrict__ ws,
                      float2* __restrict__ gstat, int* __restrict__ sync, int gs, int hw, int cpg, int groups,
                      int ngroups, float eps) {
  if (gn_vec_ok(x, out, hw))
    gn_ring_impl<VEC>(x, weight, bias, out, ws, gstat, sync, gs, hw, cpg, groups, ngroups, eps);
  else
    gn_ring_impl<1>(x, weight, bias, out, ws, gstat, sync, gs, hw, cpg, groups, ngroups, eps);
}
