// group_norm for large groups in ONE kernel with ONE read of x: each group is split over `split`
// blocks (a runtime argument; the launch spec bounds it to what the GPU holds at once). Every
// block keeps its chunk (THREADS * VEC * ITEMS elements, as raw input bits) in registers
// (STAGE = 0: 4 registers per 8 bf16) or in dynamic shared memory (STAGE = 1), computes its
// exact two-pass moments (relative to the group's first element), publishes them to the
// workspace `ws`, waits for the group's other blocks at an inter-block barrier (see the
// prelude), merges the group's partials in a fixed order and writes its normalised(+affine)
// chunk from the kept copy. `sync` is a zero-filled int workspace (1 + 2 * N * G ints) that the
// kernel leaves zero again. If the barrier times out (a GPU too small for a group's blocks) the
// block recomputes the group statistics from memory.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

#define CHUNK (THREADS * VEC * ITEMS)

// Moments of the whole group from its partials (or, after a barrier timeout, from memory).
__device__ __forceinline__ Moments gn_group_moments(const T_X* __restrict__ xg, const float4* __restrict__ ws,
                                                    int* __restrict__ sync, unsigned int grp, int split, int gs,
                                                    float shift, float* red) {
  Moments st{0.f, 0.f, 0.f};
  if (group_arrive_and_wait(sync, grp, split)) {
    for (int p = threadIdx.x; p < split; p += THREADS) {
      const float4 w = __ldcg(ws + (long long)grp * split + p);
      st = moments_merge(st, Moments{w.x, w.y, w.z});
    }
  } else {
    st = gn_thread_moments<1>(xg, 0, gs, shift);
  }
  st = block_moments<THREADS>(st, red);
  group_leave(sync, grp, split);
  return st;
}

template <int V>
__device__ __forceinline__ void gn_split_sync_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                   T_OUT* __restrict__ out, float4* __restrict__ ws,
                                                   int* __restrict__ sync, int gs, int hw, int cpg, int groups,
                                                   int split, float eps) {
  constexpr int NV = ITEMS * VEC / V;
  __shared__ float red[96];
  const unsigned int vid = take_ticket(sync);  // block id in start order
  const unsigned int grp = vid / split;
  const int begin = (vid % split) * CHUNK;
  GN_GROUP_PTRS(grp)
  const float shift = load1(xg);
#if STAGE
  // The chunk waits in (dynamic) shared memory instead of registers: blocks need few registers,
  // so several groups are resident at once and one group's loads overlap another's stores.
  extern __shared__ uint4 stage_smem[];
  Vec<T_X, V>* a = reinterpret_cast<Vec<T_X, V>*>(stage_smem) + threadIdx.x;
#define A(i) a[(i) * THREADS]
#else
  Vec<T_X, V> a[NV];
#define A(i) a[i]
#endif
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int e = begin + (i * THREADS + (int)threadIdx.x) * V;
    if (e < gs) A(i).template load<LOAD_HINT>(xg + e);
  }
  // exact two-pass moments of the chunk, from registers (get_fresh: convert on use, see prelude)
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = begin + (i * THREADS + (int)threadIdx.x) * V < gs;
#pragma unroll
    for (int k = 0; k < V; ++k) s += valid ? A(i).get_fresh(k) - shift : 0.f;
  }
  const float n = (float)min(CHUNK, gs - begin);
  const float cmean = __fdividef(block_sum<THREADS>(s, red), n);
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = begin + (i * THREADS + (int)threadIdx.x) * V < gs;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = A(i).get_fresh(k) - shift - cmean;
      q += valid ? d * d : 0.f;
    }
  }
  q = block_sum<THREADS>(q, red);
  if (threadIdx.x == 0) ws[vid] = make_float4(n, cmean, q, 0.f);
  const Moments st = gn_group_moments(xg, ws, sync, grp, split, gs, shift, red);
  const float mean = shift + st.mean;
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  const unsigned int c0 = gn_first_channel(grp, groups, cpg);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int e = begin + (i * THREADS + (int)threadIdx.x) * V;
    if (e < gs) {
      const unsigned int c = c0 + (unsigned int)e / (unsigned int)hw;
      (void)c;  // unused without weight and bias
      const float sa = rstd * WEIGHT_AT(c), sb = BIAS_AT(c);
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.set(k, fmaf(A(i).get_fresh(k) - mean, sa, sb));
      o.template store<STORE_HINT>(og + e);
    }
  }
#undef A
}

// Misaligned pointers or HW % VEC != 0: same barrier, but statistics and output stream from
// memory element-wise (two reads), so the register-resident path stays lean.
__device__ __forceinline__ void gn_split_sync_streaming(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                        T_OUT* __restrict__ out, float4* __restrict__ ws,
                                                        int* __restrict__ sync, int gs, int hw, int cpg,
                                                        int groups, int split, float eps) {
  __shared__ float red[96];
  const unsigned int vid = take_ticket(sync);
  const unsigned int grp = vid / split;
  const int begin = (vid % split) * CHUNK, end = min(gs, begin + CHUNK);
  GN_GROUP_PTRS(grp)
  const float shift = load1(xg);
  const Moments part = block_moments<THREADS>(gn_thread_moments<1>(xg, begin, end, shift), red);
  if (threadIdx.x == 0) ws[vid] = make_float4(part.n, part.mean, part.m2, 0.f);
  const Moments st = gn_group_moments(xg, ws, sync, grp, split, gs, shift, red);
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  gn_apply<1>(xg, og, weight, bias, begin, end, gn_first_channel(grp, groups, cpg), hw, shift + st.mean, rstd);
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_split_sync(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                      const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, float4* __restrict__ ws,
                      int* __restrict__ sync, int gs, int hw, int cpg, int groups, int split, float eps) {
  if (hw % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    gn_split_sync_impl<VEC>(x, weight, bias, out, ws, sync, gs, hw, cpg, groups, split, eps);
  else
    gn_split_sync_streaming(x, weight, bias, out, ws, sync, gs, hw, cpg, groups, split, eps);
}
