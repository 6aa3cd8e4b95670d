// group_norm (CPU): groups in parallel (OpenMP over N * G). Statistics per group: STATS = 0 exact
// two-pass (mean, then squared deviations), STATS = 1 one pass of sum and sum of squares
// accumulated in double (52-bit mantissa: no cancellation at realistic offsets). Then per
// channel a = rstd * weight and a vectorised (x - mean) * a + bias over HW.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

static void gn_group(const T_X* FP_RESTRICT x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* FP_RESTRICT out,
                     long long cpg, long long hw, long long c0, float eps) {
  const long long n = cpg * hw;
  double mean, var;
  if (STATS == 0) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (long long i = 0; i < n; ++i) s += to_float(x[i]);
    mean = s / (double)n;
    const float fm = (float)mean;
    double q = 0.0;
#pragma omp simd reduction(+ : q)
    for (long long i = 0; i < n; ++i) { const float d = to_float(x[i]) - fm; q += (double)(d * d); }
    var = q / (double)n;
  } else {
    double s = 0.0, q = 0.0;
#pragma omp simd reduction(+ : s, q)
    for (long long i = 0; i < n; ++i) { const double v = to_float(x[i]); s += v; q += v * v; }
    mean = s / (double)n;
    var = q / (double)n - mean * mean;
    if (var < 0.0) var = 0.0;
  }
  const float rstd = (float)(1.0 / std::sqrt(var + (double)eps));
  for (long long c = 0; c < cpg; ++c) {
    const float w = HAS_WEIGHT ? to_float(weight[c0 + c]) : 1.0f;
    const float b = HAS_BIAS ? to_float(bias[c0 + c]) : 0.0f;
    const float a = rstd * w, fm = (float)mean;
    const T_X* FP_RESTRICT xc = x + c * hw;
    T_OUT* FP_RESTRICT oc = out + c * hw;
#pragma omp simd
    for (long long i = 0; i < hw; ++i) forge_store(oc + i, (to_float(xc[i]) - fm) * a + b);
  }
}

extern "C" void group_norm_groups(const T_X* x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* out,
                                  long long N, long long C, long long HW, long long G, float eps) {
  const long long cpg = C / G, gs = cpg * HW;
#pragma omp parallel for schedule(static, GRAIN)
  for (long long g = 0; g < N * G; ++g)
    gn_group(x + g * gs, weight, bias, out + g * gs, cpg, HW, (g % G) * cpg, eps);
}
