// layer_norm (RMS = 0) / rms_norm (RMS = 1) over the last `cols` elements (CPU): rows in parallel
// (OpenMP, GRAIN rows per chunk). layer_norm: exact two-pass mean / variance, the mean taken
// around the row's first value; rms_norm: mean of squares. Then a vectorised normalise(+affine)
// pass. Absent weight / bias arrive as NULL.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

static void rownorm_row(const T_X* FP_RESTRICT x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* FP_RESTRICT out,
                        long long n, float eps, float weight_offset) {
  if (RMS) {  // a sum of squares has no cancellation: fp32 lanes suffice
    float q = 0.0f;
#pragma omp simd reduction(+ : q)
    for (long long i = 0; i < n; ++i) { const float v = to_float(x[i]); q += v * v; }
    const float r = 1.0f / std::sqrt(q / (float)n + eps);
    if (weight) {
#pragma omp simd
      for (long long i = 0; i < n; ++i)
        forge_store(out + i, to_float(x[i]) * r * (to_float(weight[i]) + weight_offset));
    } else {
#pragma omp simd
      for (long long i = 0; i < n; ++i) forge_store(out + i, to_float(x[i]) * r);
    }
    return;
  }
  // layer_norm: the mean of x - shift (the row's first value) keeps the sum small when
  // |mean| >> std; then the exact sum of squared deviations.
  const float shift = to_float(x[0]);
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (long long i = 0; i < n; ++i) s += to_float(x[i]) - shift;
  const float mean = shift + s / (float)n;
  float q = 0.0f;
#pragma omp simd reduction(+ : q)
  for (long long i = 0; i < n; ++i) { const float d = to_float(x[i]) - mean; q += d * d; }
  const float r = 1.0f / std::sqrt(q / (float)n + eps);
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
