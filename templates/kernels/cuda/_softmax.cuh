// ---- softmax / log_softmax helpers (LOG = 0: softmax, 1: log_softmax) ------------------------
// FAST_EXP 0: expf (accurate); 1: __expf (MUFU.EX2 after a multiply by log2(e), ~2 ulp);
// 2: exp2f(d * log2(e)). The difference d = x - max is formed first: it is exact for the
// elements that matter, whereas pre-scaling x itself by log2(e) would put an error of
// |x| * 2^-24 into the exponent (1e-3 relative for logits of magnitude 1e4).
#if FAST_EXP == 2
FP_DEV float sm_exp(float d) { return exp2f(d * 1.4426950408889634f); }
#elif FAST_EXP == 1
FP_DEV float sm_exp(float d) { return __expf(d); }
#else
FP_DEV float sm_exp(float d) { return expf(d); }
#endif
struct SmExp { __device__ __forceinline__ float operator()(float v) const { return sm_exp(v); } };

// Online statistics of V values folded into a running (max, sum): rescale only when the
// max grows. While the max is still -inf only NaN may be added (exp(-inf - -inf) would be NaN).
template <int V> FP_DEV void sm_accumulate(MaxSum& st, const float (&xs)[V]) {
  float lm = st.m;
#pragma unroll
  for (int k = 0; k < V; ++k) lm = fmaxf(lm, xs[k]);
  if (lm > st.m) { st.s *= sm_exp(st.m - lm); st.m = lm; }
  if (st.m == -FP_INF) {
#pragma unroll
    for (int k = 0; k < V; ++k) st.s += (xs[k] != xs[k]) ? xs[k] : 0.f;
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) st.s += sm_exp(xs[k] - st.m);
  }
}

// log_softmax output: x - max - log(sum exp(x - max)).
FP_DEV float sm_finish_log(float x, float m, float log_sum) { return (x - m) - log_sum; }
