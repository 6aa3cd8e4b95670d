// group_norm: one block per (n, group). One-pass statistics (per-thread Welford/Chan merge of
// vector batches, exact within a batch: robust where fp32 sum / sum-of-squares would cancel),
// then a normalise(+affine) pass that re-reads the group (from L2 when it fits).
// 16-byte vectors when HW % VEC == 0 and the pointers are aligned, else element-wise.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

template <int V>
__device__ __forceinline__ void gn_welford_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM T_OUT* __restrict__ out,
                                                int gs, int hw, int cpg, int groups, float eps) {
  __shared__ float red[96];
  const long long grp = blockIdx.x;
  const T_X* xg = x + grp * gs;
  Moments st = gn_thread_moments<V>(xg, 0, gs);
  st = block_moments<THREADS>(st, red);
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  gn_apply<V>(xg, out + grp * gs, WEIGHT_ARG BIAS_ARG 0, gs, (int)((unsigned int)grp % (unsigned int)groups) * cpg, hw, st.mean, rstd);
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_welford(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, int gs, int hw,
                   int cpg, int groups, float eps) {
  if (VEC > 1 && hw % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    gn_welford_impl<VEC>(x, WEIGHT_ARG BIAS_ARG out, gs, hw, cpg, groups, eps);
  else
    gn_welford_impl<1>(x, WEIGHT_ARG BIAS_ARG out, gs, hw, cpg, groups, eps);
}
