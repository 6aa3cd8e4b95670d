// layer_norm (RMS = 0) / rms_norm (RMS = 1) over the last `cols` elements of an x whose rows are
// each contiguous but not packed (a transposed view): row r starts at element
// (r / inner) * so + (r % inner) * si; out is contiguous. Rows in parallel (OpenMP, GRAIN rows
// per chunk); layer_norm: exact two-pass mean / variance around the row's first value; rms_norm:
// mean of squares; then a vectorised normalise(+affine) pass. Absent weight / bias arrive as NULL.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

static void strided_row(const T_X* FP_RESTRICT x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* FP_RESTRICT out,
                        long long n, float eps, float weight_offset) {
  float mean = 0.0f, r;
  if (RMS) {  // a sum of squares has no cancellation: fp32 lanes suffice
    float q = 0.0f;
#pragma omp simd reduction(+ : q)
    for (long long i = 0; i < n; ++i) { const float v = to_float(x[i]); q += v * v; }
    r = 1.0f / std::sqrt(q / (float)n + eps);
  } else {
    const float shift = to_float(x[0]);  // keeps the sum small when |mean| >> std
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (long long i = 0; i < n; ++i) s += to_float(x[i]) - shift;
    mean = shift + s / (float)n;
    float q = 0.0f;
#pragma omp simd reduction(+ : q)
    for (long long i = 0; i < n; ++i) { const float d = to_float(x[i]) - mean; q += d * d; }
    r = 1.0f / std::sqrt(q / (float)n + eps);
  }
#pragma omp simd
  for (long long i = 0; i < n; ++i) {
    const float w = weight ? to_float(weight[i]) + (RMS ? weight_offset : 0.0f) : 1.0f;  // no weight: factor 1
    const float b = bias ? to_float(bias[i]) : 0.0f;
    forge_store(out + i, (to_float(x[i]) - mean) * r * w + b);
  }
}

extern "C" void layer_norm_strided_rows(const T_X* x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* out,
                                        long long rows, long long cols, long long inner, long long so, long long si,
                                        float eps) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long r = 0; r < rows; ++r)
    strided_row(x + (r / inner) * so + (r % inner) * si, weight, bias, out + r * cols, cols, eps, 0.0f);
}
