// layer_norm (RMS = 0) / rms_norm (RMS = 1) over the last `cols` elements (CPU): rows in parallel
// (OpenMP, GRAIN rows per chunk). layer_norm: exact two-pass mean / variance; rms_norm: mean of
// squares (sums in double); then a vectorised normalise(+affine) pass. Absent weight / bias arrive as NULL.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

static void rownorm_row(const T_X* FP_RESTRICT x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* FP_RESTRICT out,
                        long long n, float eps, float weight_offset) {
  // sums in double: exact enough for long rows far from zero, and still a vectorised loop
  if (RMS) {
    double q = 0.0;
#pragma omp simd reduction(+ : q)
    for (long long i = 0; i < n; ++i) { const double v = to_float(x[i]); q += v * v; }
    const float r = (float)(1.0 / std::sqrt(q / (double)n + (double)eps));
    if (weight) {
#pragma omp simd
      for (long long i = 0; i < n; ++i) forge_store(out + i, to_float(x[i]) * r * (to_float(weight[i]) + weight_offset));
    } else {
#pragma omp simd
      for (long long i = 0; i < n; ++i) forge_store(out + i, to_float(x[i]) * r);
    }
    return;
  }
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (long long i = 0; i < n; ++i) s += to_float(x[i]);
  const float mean = (float)(s / (double)n);
  double q = 0.0;
#pragma omp simd reduction(+ : q)
  for (long long i = 0; i < n; ++i) { const double d = to_float(x[i]) - mean; q += d * d; }
  const float r = (float)(1.0 / std::sqrt(q / (double)n + (double)eps));
#pragma omp simd
  for (long long i = 0; i < n; ++i) {
    const float w = weight ? to_float(weight[i]) : 1.0f;
    const float b = bias ? to_float(bias[i]) : 0.0f;
    forge_store(out + i, (to_float(x[i]) - mean) * r * w + b);
  }
}

#if RMS
extern "C" void rms_norm_rows(const T_X* x, const T_WEIGHT* weight, T_OUT* out, long long rows, long long cols,
                              float eps, float weight_offset) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long r = 0; r < rows; ++r)
    rownorm_row(x + r * cols, weight, (const T_BIAS*)nullptr, out + r * cols, cols, eps, weight_offset);
}
#else
extern "C" void layer_norm_rows(const T_X* x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* out, long long rows,
                                long long cols, float eps) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long r = 0; r < rows; ++r) rownorm_row(x + r * cols, weight, bias, out + r * cols, cols, eps, 0.0f);
}
#endif
