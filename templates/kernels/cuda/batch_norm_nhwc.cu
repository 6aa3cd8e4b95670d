// batch_norm inference, channels_last (NHWC in memory): a 2-D block, threadIdx.x along channel
// vectors (VEC channels each, their scales kept in registers), threadIdx.y along pixels; every
// thread streams ITEMS pixels of its channels (ITEMS 16-byte loads in flight).
// The vector path needs C % VEC == 0 and aligned pointers.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _batch_norm.cuh}}

template <int V>
__device__ __forceinline__ void bn_nhwc_impl(const T_X* __restrict__ x, BN_PARAMS T_OUT* __restrict__ out,
                                             long long pixels, int C, float eps) {
  const long long p0 = (long long)blockIdx.x * blockDim.y * ITEMS + threadIdx.y;
  for (int cv = threadIdx.x; cv * V < C; cv += blockDim.x) {
    float3 ab[V];
#pragma unroll
    for (int k = 0; k < V; ++k) ab[k] = bn_coef(BN_ARGS cv * V + k, eps);
    Vec<T_X, V> a[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const long long p = p0 + (long long)j * blockDim.y;
      if (p < pixels) a[j].template load<LOAD_HINT>(x + p * C + cv * V);
    }
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const long long p = p0 + (long long)j * blockDim.y;
      if (p < pixels) {
        Vec<T_OUT, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.set(k, bn_apply(a[j].get(k), ab[k]));
        o.template store<STORE_HINT>(out + p * C + cv * V);
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
batch_norm_nhwc(const T_X* __restrict__ x, const T_RUNNING_MEAN* __restrict__ running_mean,
                const T_RUNNING_VAR* __restrict__ running_var, const T_WEIGHT* __restrict__ weight,
                const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, long long pixels, int C, float eps) {
  if (VEC > 1 && C % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    bn_nhwc_impl<VEC>(x, BN_ARGS out, pixels, C, eps);
  else
    bn_nhwc_impl<1>(x, BN_ARGS out, pixels, C, eps);
}
