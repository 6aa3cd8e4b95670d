// group_norm for large groups in ONE kernel with ONE read of x: each group is split over `split`
// blocks (a runtime argument; the launch spec bounds it to what the GPU holds at once); every
// block keeps its chunk (THREADS * VEC * ITEMS elements, as raw input bits: 4 registers per 8
// bf16) in registers, computes its exact two-pass moments, publishes them to the workspace `ws`,
// waits for the group's other blocks at an inter-block barrier (see the prelude), merges the
// group's partials in a fixed order and writes its normalised(+affine) chunk from registers.
// `sync` is a zero-filled int workspace (1 + 2 * N * G ints) that the kernel leaves zero again.
// If the barrier times out (a GPU too small for a group's blocks) the block recomputes the group
// statistics from memory.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

#define CHUNK (THREADS * VEC * ITEMS)

template <int V>
__device__ __forceinline__ void gn_split_sync_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                   T_OUT* __restrict__ out, float4* __restrict__ ws, int* __restrict__ sync,
                                                   int gs, int hw, int cpg, int groups, int split, float eps) {
  constexpr int NV = ITEMS * VEC / V;
  __shared__ float red[96];
  const unsigned int vid = take_ticket(sync);  // block id in start order
  const unsigned int grp = vid / split;
  const int part = vid % split;
  const int begin = part * CHUNK;
  const T_X* xg = x + (long long)grp * gs;
  Vec<T_X, V> a[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int e = begin + (i * THREADS + (int)threadIdx.x) * V;
    if (e < gs) a[i].template load<LOAD_HINT>(xg + e);
  }
  // exact two-pass moments of the chunk, from registers
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = begin + (i * THREADS + (int)threadIdx.x) * V < gs;
#pragma unroll
    for (int k = 0; k < V; ++k) s += valid ? a[i].get_fresh(k) : 0.f;
  }
  const float n = (float)min(CHUNK, gs - begin);
  const float cmean = __fdividef(block_sum<THREADS>(s, red), n);
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = begin + (i * THREADS + (int)threadIdx.x) * V < gs;
#pragma unroll
    for (int k = 0; k < V; ++k) { const float d = a[i].get_fresh(k) - cmean; q += valid ? d * d : 0.f; }
  }
  q = block_sum<THREADS>(q, red);
  if (threadIdx.x == 0) ws[vid] = make_float4(n, cmean, q, 0.f);
  Moments st{0.f, 0.f, 0.f};
  if (group_arrive_and_wait(sync, grp, split)) {
    for (int p = threadIdx.x; p < split; p += THREADS) {
      const float4 w = __ldcg(ws + (long long)grp * split + p);
      st = moments_merge(st, Moments{w.x, w.y, w.z});
    }
  } else {
    st = gn_thread_moments<1>(xg, 0, gs);  // slow fallback: the whole group from memory
  }
  st = block_moments<THREADS>(st, red);
  group_leave(sync, grp, split);
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  const int c0 = (int)((unsigned int)grp % (unsigned int)groups) * cpg;
  T_OUT* og = out + (long long)grp * gs;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int e = begin + (i * THREADS + (int)threadIdx.x) * V;
    if (e < gs) {
      const int c = c0 + e / hw;
      (void)c;  // unused without weight and bias
      const float sa = rstd * WEIGHT_AT(c);
      const float sb = BIAS_AT(c) - st.mean * sa;
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.set(k, fmaf(a[i].get_fresh(k), sa, sb));
      o.template store<STORE_HINT>(og + e);
    }
  }
}

// Misaligned pointers or HW % VEC != 0: same barrier, but statistics and output stream from
// memory element-wise (two reads), so the register-resident path stays lean.
__device__ __forceinline__ void gn_split_sync_streaming(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                        T_OUT* __restrict__ out, float4* __restrict__ ws,
                                                        int* __restrict__ sync, int gs, int hw, int cpg, int groups,
                                                        int split, float eps) {
  __shared__ float red[96];
  const unsigned int vid = take_ticket(sync);
  const unsigned int grp = vid / split;
  const int begin = (vid % split) * CHUNK, end = min(gs, begin + CHUNK);
  const T_X* xg = x + (long long)grp * gs;
  Moments st = block_moments<THREADS>(gn_thread_moments<1>(xg, begin, end), red);
  if (threadIdx.x == 0) ws[vid] = make_float4(st.n, st.mean, st.m2, 0.f);
  st = Moments{0.f, 0.f, 0.f};
  if (group_arrive_and_wait(sync, grp, split)) {
    for (int p = threadIdx.x; p < split; p += THREADS) {
      const float4 w = __ldcg(ws + (long long)grp * split + p);
      st = moments_merge(st, Moments{w.x, w.y, w.z});
    }
  } else {
    st = gn_thread_moments<1>(xg, 0, gs);
  }
  st = block_moments<THREADS>(st, red);
  group_leave(sync, grp, split);
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  gn_apply<1>(xg, out + (long long)grp * gs, WEIGHT_ARG BIAS_ARG begin, end, (int)((unsigned int)grp % (unsigned int)groups) * cpg, hw,
              st.mean, rstd);
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_split_sync(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out,
                      float4* __restrict__ ws, int* __restrict__ sync, int gs, int hw, int cpg, int groups, int split,
                      float eps) {
  if (hw % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    gn_split_sync_impl<VEC>(x, WEIGHT_ARG BIAS_ARG out, ws, sync, gs, hw, cpg, groups, split, eps);
  else
    gn_split_sync_streaming(x, WEIGHT_ARG BIAS_ARG out, ws, sync, gs, hw, cpg, groups, split, eps);
}
