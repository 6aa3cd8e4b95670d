// group_norm for huge groups (e.g. an SD3.5 VAE decoder: 32 groups of 4 M elements): one block
// per group would leave most SMs idle, so each group is split over SPLIT blocks.
// Kernel 1 (group_norm_split_stats): every block computes the moments (count, mean, M2) of its
//   `chunk` of a group, relative to the group's first element, into the workspace `ws`
//   (N * G * SPLIT float4).
// Kernel 2 (group_norm_split_apply): every block merges its group's SPLIT partials (Chan's
//   formula, fixed order: bitwise reproducible) and normalises(+affine) one tile of
//   THREADS * VEC * UNROLL * ITEMS elements. Two reads of x and one write in all.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

#define TILE (THREADS * VEC * UNROLL * ITEMS)

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_split_stats(const T_X* __restrict__ x, float4* __restrict__ ws, int gs, int hw, int chunk) {
  __shared__ float red[96];
  const unsigned int grp = blockIdx.x / SPLIT, part = blockIdx.x % SPLIT;
  const int begin = min(gs, (int)part * chunk), end = min(gs, begin + chunk);
  const T_X* xg = x + (long long)grp * gs;
  const float shift = load1(xg);
  Moments st;
  if (VEC > 1 && hw % VEC == 0 && chunk % VEC == 0 && vec_aligned<T_X, VEC>(x))
    st = gn_thread_moments<VEC>(xg, begin, end, shift);
  else
    st = gn_thread_moments<1>(xg, begin, end, shift);
  st = block_moments<THREADS>(st, red);
  if (threadIdx.x == 0) ws[blockIdx.x] = make_float4(st.n, st.mean, st.m2, 0.f);
}

extern "C" __global__ void __launch_bounds__(THREADS)
group_norm_split_apply(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                       const T_BIAS* __restrict__ bias, const float4* __restrict__ ws, T_OUT* __restrict__ out,
                       int gs, int hw, int cpg, int groups, int tiles, float eps) {
  __shared__ float red[96];
  const unsigned int grp = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  GN_GROUP_PTRS(grp)
  Moments st{0.f, 0.f, 0.f};
  for (int p = threadIdx.x; p < SPLIT; p += THREADS) {
    const float4 q = ws[grp * SPLIT + p];
    st = moments_merge(st, Moments{q.x, q.y, q.z});
  }
  st = block_moments<THREADS>(st, red);
  const float mean = load1(xg) + st.mean;
  const float rstd = rsqrtf(__fdividef(st.m2, (float)gs) + eps);
  const int begin = tile * TILE, end = min(gs, begin + TILE);
  const unsigned int c0 = gn_first_channel(grp, groups, cpg);
  if (gn_vec_ok(x, out, hw))
    gn_apply<VEC>(xg, og, weight, bias, begin, end, c0, hw, mean, rstd);
  else
    gn_apply<1>(xg, og, weight, bias, begin, end, c0, hw, mean, rstd);
}
