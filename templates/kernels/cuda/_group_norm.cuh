// ---- group_norm helpers ----------------------------------------------------------------------
// x is [N, C, HW] contiguous; group grp = n * G + g holds GS = CPG * HW contiguous elements and
// channels g * CPG .. g * CPG + CPG - 1. out = (x - mean) * a[c] + bias[c], a = rstd * weight[c].
// (x - mean first: folding the mean into a shift, x * a + b, cancels badly when |mean| >> std.)
// Statistics are accumulated relative to the group's first element `shift`, so that sums stay
// small when the data sit far from zero; every block of a group uses the same shift.
// weight / bias are always kernel parameters (NULL when the call has none: HAS_WEIGHT / HAS_BIAS).
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

FP_DEV unsigned int gn_first_channel(unsigned long long grp, int groups, int cpg) {
  return (unsigned int)(grp % (unsigned int)groups) * (unsigned int)cpg;
}

// Moments of (x - shift) over group-local elements [begin, end) seen by this thread, UNROLL
// vectors in flight; each batch of UNROLL * V values is reduced exactly, then Chan-merged.
// On the vector path V divides begin and end, so a vector is either wholly inside or outside.
template <int V, int HINT = LOAD_HINT>
__device__ __forceinline__ Moments gn_thread_moments(const T_X* __restrict__ xg, int begin, int end, float shift) {
  Moments st{0.f, 0.f, 0.f};
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < end) a[u].template load<HINT>(xg + i);
    }
    float vals[UNROLL * V];
    int valid = 0;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      valid += (i < end) ? V : 0;
#pragma unroll
      for (int k = 0; k < V; ++k) vals[u * V + k] = (i < end) ? a[u].get(k) - shift : 0.f;
    }
    st = moments_merge(st, moments_of<UNROLL * V>(vals, valid));
  }
  return st;
}

// out = (x - mean) * rstd * weight[c] + bias[c] over group-local elements [begin, end);
// c0 = first channel of the group. On the vector path HW % V == 0: no vector straddles channels.
template <int V, int HINT = LOAD_HINT>
__device__ __forceinline__ void gn_apply(const T_X* __restrict__ xg, T_OUT* __restrict__ og, WEIGHT_PARAM BIAS_PARAM
                                         int begin, int end, unsigned int c0, int hw, float mean, float rstd) {
  for (int base = begin; base < end; base += THREADS * V * UNROLL) {
    Vec<T_X, V> a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < end) a[u].template load<HINT>(xg + i);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + (u * THREADS + (int)threadIdx.x) * V;
      if (i < end) {
        const unsigned int c = c0 + (unsigned int)i / (unsigned int)hw;
        (void)c;  // unused without weight and bias
        const float sa = rstd * WEIGHT_AT(c), sb = BIAS_AT(c);
        Vec<T_OUT, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) o.set(k, fmaf(a[u].get(k) - mean, sa, sb));
        o.template store<STORE_HINT>(og + i);
      }
    }
  }
}

// x / out of group grp, and whether the 16-byte vector path applies.
#define GN_GROUP_PTRS(grp) \
  const T_X* xg = x + (long long)(grp) * gs; \
  T_OUT* og = out + (long long)(grp) * gs;
FP_DEV bool gn_vec_ok(const void* x, const void* out, int hw) {
  return VEC > 1 && hw % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out);
}

// ---- L2 cache policies for a chunk read twice (split_flow; the split_stream experiment) ----
// Load hints 3 (L2 evict_last) and 4 (L2 evict_first) for 16-byte vectors, through an L2 cache
// policy (sm_80+); other widths, and older GPUs, load plainly (the primary template).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <int PRIORITY> FP_DEV uint4 l2_ld_policy(const uint4* p) {
  unsigned long long policy;
  if (PRIORITY == 3) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint4 r;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(policy));
  return r;
}
template <> FP_DEV uint4 ld_raw<3, uint4>(const uint4* p) { return l2_ld_policy<3>(p); }
template <> FP_DEV uint4 ld_raw<4, uint4>(const uint4* p) { return l2_ld_policy<4>(p); }
#endif
