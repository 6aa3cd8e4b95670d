// group_norm: one block per (n, group), classic two-pass statistics: the mean (of x - shift),
// then the sum of squared deviations from it (exact, no cancellation), then the normalise pass.
// Three reads of the group (the later ones from L2 when the group fits): for small groups.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

// sum of (x - center) or of (x - center)^2 over the group, this thread's share
template <int V, bool SQUARE>
__device__ __forceinline__ float gn_pass(const T_X* __restrict__ xg, int gs, float center) {
  float acc = 0.f;
  for (int base = 0; base < gs; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < gs) a[u].template load<LOAD_HINT>(xg + i);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < gs) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float d = a[u].get(k) - center;
          acc += SQUARE ? d * d : d;
        }
      }
    }
  }
  return acc;
}

template <int V>
__device__ __forceinline__ void gn_two_pass_impl(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                 T_OUT* __restrict__ out, int gs, int hw, int cpg, int groups,
                                                 float eps) {
  __shared__ float red[32];
  const unsigned int grp = blockIdx.x;
  GN_GROUP_PTRS(grp)
  const float shift = load1(xg);
  const float mean = shift + __fdividef(block_sum<THREADS>(gn_pass<V, false>(xg, gs, shift), red), (float)gs);
  const float m2 = block_sum<THREADS>(gn_pass<V, true>(xg, gs, mean), red);
  const float rstd = rsqrtf(__fdividef(m2, (float)gs) + eps);
  gn_apply<V>(xg, og, WEIGHT_ARG BIAS_ARG 0, gs, gn_first_channel(grp, groups, cpg), hw, mean, rstd);
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_two_pass(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias,
                    T_OUT* __restrict__ out, int gs, int hw, int cpg, int groups, float eps) {
  if (gn_vec_ok(x, out, hw))
    gn_two_pass_impl<VEC>(x, weight, bias, out, gs, hw, cpg, groups, eps);
  else
    gn_two_pass_impl<1>(x, weight, bias, out, gs, hw, cpg, groups, eps);
}
