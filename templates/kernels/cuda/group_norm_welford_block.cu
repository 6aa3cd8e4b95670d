// group_norm: one block per (n, group). One-pass statistics (per-thread batches reduced exactly,
// merged with Chan's formula: robust where fp32 sum / sum-of-squares would cancel), then a
// normalise(+affine) pass that re-reads the group (from L2 when it fits).
// 16-byte vectors when HW % VEC == 0 and the pointers are aligned, else element-wise.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

template <int V>
__device__ __forceinline__ void gn_welford_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                T_OUT* __restrict__ out, int gs, int hw, int cpg, int groups,
                                                float eps) {
  __shared__ float red[96];
  const unsigned int grp = blockIdx.x;
  GN_GROUP_PTRS(grp)
  const float shift = load1(xg);
  const Moments st = block_moments<THREADS>(gn_thread_moments<V>(xg, 0, gs, shift), red);
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  gn_apply<V>(xg, og, WEIGHT_ARG BIAS_ARG 0, gs, gn_first_channel(grp, groups, cpg), hw, shift + st.mean, rstd);
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_welford(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias,
                   T_OUT* __restrict__ out, int gs, int hw, int cpg, int groups, float eps) {
  if (gn_vec_ok(x, out, hw))
    gn_welford_impl<VEC>(x, weight, bias, out, gs, hw, cpg, groups, eps);
  else
    gn_welford_impl<1>(x, weight, bias, out, gs, hw, cpg, groups, eps);
}
