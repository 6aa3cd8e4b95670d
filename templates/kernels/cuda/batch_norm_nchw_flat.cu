// batch_norm inference, NCHW, for any HW (e.g. 7x7 = 49, where planes are not 16-byte aligned):
// the tensor is streamed flat with 16-byte vectors; each vector finds its channel with one
// 32-bit division and walks across plane boundaries inside the vector, recomputing scale/shift only
// when the channel changes. Each block handles THREADS * VEC * UNROLL elements.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _batch_norm.cuh}}

template <int V>
__device__ __forceinline__ void bn_flat_impl(const T_X* __restrict__ x, BN_PARAMS T_OUT* __restrict__ out,
                                             long long numel, int C, int hw, float eps) {
  const long long base = (long long)blockIdx.x * (THREADS * VEC * UNROLL);
  constexpr int U = UNROLL * VEC / V;
  Vec<T_X, V> a[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = base + (long long)(u * THREADS + (int)threadIdx.x) * V;
    if (i + V <= numel) a[u].template load<LOAD_HINT>(x + i);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = base + (long long)(u * THREADS + (int)threadIdx.x) * V;
    if (i + V <= numel) {
      // 32-bit division (numel < 2^31: the launch spec requires it) is far cheaper than 64-bit
      const unsigned int plane = (unsigned int)i / (unsigned int)hw;
      int r = (int)((unsigned int)i - plane * (unsigned int)hw);
      int c = (int)(plane % (unsigned int)C);
      float2 ab = bn_coef(BN_ARGS c, eps);
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (r == hw) { r = 0; c = (c + 1 == C) ? 0 : c + 1; ab = bn_coef(BN_ARGS c, eps); }
        o.set(k, fmaf(a[u].get(k), ab.x, ab.y));
        ++r;
      }
      o.template store<STORE_HINT>(out + i);
    } else {
      for (long long j = i; j < numel && j < i + V; ++j) {  // the ragged tail, element by element
        const int c = (int)(((unsigned int)j / (unsigned int)hw) % (unsigned int)C);
        const float2 ab = bn_coef(BN_ARGS c, eps);
        store1(out + j, fmaf(load1(x + j), ab.x, ab.y));
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
batch_norm_nchw_flat(const T_X* __restrict__ x, const T_RUNNING_MEAN* __restrict__ running_mean, const T_RUNNING_VAR* __restrict__ running_var,
    const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, long long numel, int C, int hw,
                     float eps) {
  if (VEC > 1 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    bn_flat_impl<VEC>(x, BN_ARGS out, numel, C, hw, eps);
  else
    bn_flat_impl<1>(x, BN_ARGS out, numel, C, hw, eps);
}
