// group_norm for huge groups in ONE kernel, reading x from DRAM about once: the `split` family's
// two steps (moments of a chunk, then normalise a chunk) become two kinds of blocks of one grid,
// scheduled by start-order tickets so that group g's normalise blocks start LAG groups after its
// statistics blocks: S0 .. S(LAG-1), A0, S(LAG), A1, S(LAG+1), ... (S = the SPLIT statistics
// blocks of a group, A = its SPLIT normalise blocks, each on the same chunk). When A(g) re-reads
// its chunk, the chunk was read moments ago by S(g) and is still in L2 (LAG + 1 groups in flight).
// A normalise block waits for its group's statistics blocks, which always started before it
// (smaller tickets) and never wait themselves: no deadlock on a GPU of any size, no co-residency
// bound. Partials are merged in a fixed order (bitwise reproducible). `sync` is a zero-filled int
// workspace (1 + 2 * N * G ints) that the kernel leaves zero again. If a wait ever times out the
// block computes the group's moments from memory itself.
// L2 = 1: the statistics blocks load with an L2 evict_last policy and the normalise blocks re-read
// with evict_first, so the chunks wait in L2 for their second read even with more groups in
// flight (a larger LAG); L2 = 0: plain loads, then LOAD_HINT.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

#define FLOW_STATS_HINT (L2 ? 3 : 0)
#define FLOW_APPLY_HINT (L2 ? 4 : LOAD_HINT)

// Slot s (SPLIT consecutive tickets) -> group and kind (0 statistics, 1 normalise).
FP_DEV unsigned int flow_slot(unsigned int s, unsigned int ngroups, int* kind) {
  const unsigned int lag = LAG < ngroups ? LAG : ngroups;
  if (s < lag) { *kind = 0; return s; }
  const unsigned int k = s - lag, mixed = 2 * (ngroups - lag);
  if (k < mixed) { *kind = (k & 1) ? 0 : 1; return (k & 1) ? lag + k / 2 : k / 2; }
  *kind = 1;
  return ngroups - lag + (k - mixed);
}

template <int V>
__device__ __forceinline__ void gn_flow_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                             T_OUT* __restrict__ out, float4* __restrict__ ws,
                                             int* __restrict__ sync, int gs, int hw, int cpg, int groups,
                                             int chunk, float eps) {
  __shared__ float red[96];
  __shared__ int ok;
  const unsigned int ngroups = gridDim.x / (2 * SPLIT);
  const unsigned int ticket = take_ticket(sync);
  int kind;
  const unsigned int grp = flow_slot(ticket / SPLIT, ngroups, &kind);
  const unsigned int part = ticket % SPLIT;
  const int begin = min(gs, (int)part * chunk), end = min(gs, begin + chunk);
  GN_GROUP_PTRS(grp)
  const float shift = load1(xg);
  int* arrived = sync + 1 + 2 * grp;
  if (kind == 0) {  // statistics of this chunk -> ws; plain loads keep the chunk in L2
    const Moments st = block_moments<THREADS>(gn_thread_moments<V, FLOW_STATS_HINT>(xg, begin, end, shift), red);
    if (threadIdx.x == 0) {
      ws[(long long)grp * SPLIT + part] = make_float4(st.n, st.mean, st.m2, 0.f);
      __threadfence();
      atomicAdd(arrived, 1);
    }
    return;
  }
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    int good = 1;
    while (*reinterpret_cast<volatile int*>(arrived) < SPLIT) {
      __nanosleep(100);
      if (clock64() - t0 > 100000000LL) { good = 0; break; }
    }
    __threadfence();
    ok = good;
  }
  __syncthreads();
  Moments st{0.f, 0.f, 0.f};
  if (ok) {
    for (int p = threadIdx.x; p < SPLIT; p += THREADS) {
      const float4 w = __ldcg(ws + (long long)grp * SPLIT + p);
      st = moments_merge(st, Moments{w.x, w.y, w.z});
    }
  } else {
    st = gn_thread_moments<V, 0>(xg, 0, gs, shift);
  }
  st = block_moments<THREADS>(st, red);
  group_leave(sync, grp, SPLIT);  // the group's last normalise block resets its counters
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  gn_apply<V, FLOW_APPLY_HINT>(xg, og, weight, bias, begin, end, gn_first_channel(grp, groups, cpg), hw,
                               shift + st.mean, rstd);
}

// MINB > 0 caps registers so that MINB blocks share an SM: more blocks stream while others wait.
#if MINB > 0
#define FLOW_BOUNDS __launch_bounds__(THREADS, MINB)
#else
#define FLOW_BOUNDS __launch_bounds__(THREADS)
#endif
extern "C" __global__ void FLOW_BOUNDS
group_norm_split_flow(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                      const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, float4* __restrict__ ws,
                      int* __restrict__ sync, int gs, int hw, int cpg, int groups, int chunk, float eps) {
  if (gn_vec_ok(x, out, hw) && chunk % VEC == 0)
    gn_flow_impl<VEC>(x, weight, bias, out, ws, sync, gs, hw, cpg, groups, chunk, eps);
  else
    gn_flow_impl<1>(x, weight, bias, out, ws, sync, gs, hw, cpg, groups, chunk, eps);
}
