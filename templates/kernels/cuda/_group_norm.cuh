// ---- group_norm helpers ----------------------------------------------------------------------
// x is [N, C, HW] contiguous; group grp = n * G + g holds GS = CPG * HW contiguous elements and
// channels g * CPG .. g * CPG + CPG - 1. out = x * a[c] + b[c] with a = rstd * weight[c] and
// b = bias[c] - mean * a (weight / bias optional: HAS_WEIGHT, HAS_BIAS).
// weight / bias are always kernel parameters (NULL when the call has none: HAS_WEIGHT / HAS_BIAS = 0).
#define WEIGHT_PARAM const T_WEIGHT* __restrict__ weight,
#define WEIGHT_ARG weight,
#define BIAS_PARAM const T_BIAS* __restrict__ bias,
#define BIAS_ARG bias,
#if HAS_WEIGHT
#define WEIGHT_AT(c) load1(weight + (c))
#else
#define WEIGHT_AT(c) 1.f
#endif
#if HAS_BIAS
#define BIAS_AT(c) load1(bias + (c))
#else
#define BIAS_AT(c) 0.f
#endif

// Moments of group-local elements [begin, end) seen by this thread (UNROLL vectors in flight).
// On the vector path V divides begin and end, so a vector is either wholly inside or outside.
template <int V>
__device__ __forceinline__ Moments gn_thread_moments(const T_X* __restrict__ xg, int begin, int end) {
  Moments st{0.f, 0.f, 0.f};
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < end) a[u].template load<LOAD_HINT>(xg + i);
    }
    float vals[UNROLL * V];
    int valid = 0;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      valid += (i < end) ? V : 0;
#pragma unroll
      for (int k = 0; k < V; ++k) vals[u * V + k] = (i < end) ? a[u].get(k) : 0.f;
    }
    st = moments_merge(st, moments_of<UNROLL * V>(vals, valid));
  }
  return st;
}

// out = x * a + b over group-local elements [begin, end); c0 = first channel of the group.
// On the vector path HW % V == 0, so a vector never straddles two channels.
template <int V>
__device__ __forceinline__ void gn_apply(const T_X* __restrict__ xg, T_OUT* __restrict__ og, WEIGHT_PARAM BIAS_PARAM
                                         int begin, int end, int c0, int hw, float mean, float rstd) {
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < end) a[u].template load<LOAD_HINT>(xg + i);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < end) {
        const int c = c0 + i / hw;
        (void)c;  // unused without weight and bias
        const float sa = rstd * WEIGHT_AT(c);
        const float sb = BIAS_AT(c) - mean * sa;
        Vec<T_OUT, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.set(k, fmaf(a[u].get(k), sa, sb));
        o.template store<STORE_HINT>(og + i);
      }
    }
  }
}
