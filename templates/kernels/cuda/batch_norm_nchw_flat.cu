// batch_norm inference, NCHW, for any HW (e.g. 7x7 = 49, where planes are not 16-byte aligned):
// the tensor is streamed flat with 16-byte vectors; each vector finds its channel with one
// 32-bit division (numel < 2^31: the launch spec requires it) and walks across plane boundaries
// inside the vector, recomputing the channel's scale only when it changes. Each block handles
// THREADS * VEC * UNROLL elements.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _batch_norm.cuh}}

template <int V>
__device__ __forceinline__ void bn_flat_impl(const T_X* __restrict__ x, BN_PARAMS T_OUT* __restrict__ out,
                                             unsigned int numel, int C, int hw, float eps) {
  const unsigned int base = blockIdx.x * (unsigned int)(THREADS * VEC * UNROLL);
  constexpr int U = UNROLL * VEC / V;
  Vec<T_X, V> a[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const unsigned int i = base + (u * THREADS + threadIdx.x) * V;
    if (i + V <= numel) a[u].template load<LOAD_HINT>(x + i);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const unsigned int i = base + (u * THREADS + threadIdx.x) * V;
    if (i + V <= numel) {
      const unsigned int plane = i / (unsigned int)hw;
      int r = (int)(i - plane * (unsigned int)hw);
      int c = (int)(plane % (unsigned int)C);
      float3 ab = bn_coef(BN_ARGS c, eps);
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (r == hw) { r = 0; c = (c + 1 == C) ? 0 : c + 1; ab = bn_coef(BN_ARGS c, eps); }
        o.set(k, bn_apply(a[u].get(k), ab));
        ++r;
      }
      o.template store<STORE_HINT>(out + i);
    } else {
      for (unsigned int j = i; j < numel && j < i + V; ++j) {  // the ragged tail, element by element
        const int c = (int)((j / (unsigned int)hw) % (unsigned int)C);
        store1(out + j, bn_apply(load1(x + j), bn_coef(BN_ARGS c, eps)));
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
batch_norm_nchw_flat(const T_X* __restrict__ x, const T_RUNNING_MEAN* __restrict__ running_mean,
                     const T_RUNNING_VAR* __restrict__ running_var, const T_WEIGHT* __restrict__ weight,
                     const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, long long numel, int C, int hw,
                     float eps) {
  if (VEC > 1 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    bn_flat_impl<VEC>(x, BN_ARGS out, (unsigned int)numel, C, hw, eps);
  else
    bn_flat_impl<1>(x, BN_ARGS out, (unsigned int)numel, C, hw, eps);
}
