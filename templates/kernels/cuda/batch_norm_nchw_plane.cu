// batch_norm inference, NCHW: grid (N * C planes) x (tiles of a plane); each block computes its
// channel's scale once and streams a tile of THREADS * VEC * UNROLL elements (one read, one
// write). 16-byte vectors when HW % VEC == 0 and the pointers are aligned.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _batch_norm.cuh}}

template <int V>
__device__ __forceinline__ void bn_plane_impl(const T_X* __restrict__ x, BN_PARAMS T_OUT* __restrict__ out, int C,
                                              int hw, float eps) {
  const float3 ab = bn_coef(BN_ARGS (int)(blockIdx.x % (unsigned int)C), eps);
  const int base = blockIdx.y * (THREADS * VEC * UNROLL);
  const T_X* xp = x + (long long)blockIdx.x * hw;
  T_OUT* op = out + (long long)blockIdx.x * hw;
  constexpr int U = UNROLL * VEC / V;
  Vec<T_X, V> a[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = base + (u * THREADS + (int)threadIdx.x) * V;
    if (i < hw) a[u].template load<LOAD_HINT>(xp + i);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = base + (u * THREADS + (int)threadIdx.x) * V;
    if (i < hw) {
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.set(k, bn_apply(a[u].get(k), ab));
      o.template store<STORE_HINT>(op + i);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
batch_norm_nchw_plane(const T_X* __restrict__ x, const T_RUNNING_MEAN* __restrict__ running_mean,
                      const T_RUNNING_VAR* __restrict__ running_var, const T_WEIGHT* __restrict__ weight,
                      const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, int C, int hw, float eps) {
  if (VEC > 1 && hw % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    bn_plane_impl<VEC>(x, BN_ARGS out, C, hw, eps);
  else
    bn_plane_impl<1>(x, BN_ARGS out, C, hw, eps);
}
