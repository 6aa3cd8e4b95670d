// softmax / log_softmax over the last dim (CPU), long rows: rows in parallel (OpenMP), and per row
// one pass of online statistics (running max, rescaled sum: BLOCK-element blocks, each block's
// max then its vectorised exp-sum) and one write pass. Two reads of the row instead of three.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

static void softmax_row(const T_X* FP_RESTRICT x, T_OUT* FP_RESTRICT out, long long n) {
  float m = -INFINITY, s = 0.0f;
  for (long long b0 = 0; b0 < n; b0 += BLOCK) {
    const long long b1 = b0 + BLOCK < n ? b0 + BLOCK : n;
    float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
    for (long long i = b0; i < b1; ++i) bm = fp_max(bm, to_float(x[i]));
    if (bm > m) { s *= FP_EXP(m - bm); m = bm; }
    float bs = 0.0f;
    if (m == -INFINITY) {  // only NaN may count while the max is -inf
      for (long long i = b0; i < b1; ++i) { const float v = to_float(x[i]); if (v != v) bs += v; }
    } else {
#pragma omp simd reduction(+ : bs)
      for (long long i = b0; i < b1; ++i) bs += FP_EXP(to_float(x[i]) - m);
    }
    s += bs;
  }
  if (LOG) {
    const float ls = std::log(s);
#pragma omp simd
    for (long long i = 0; i < n; ++i) forge_store(out + i, (to_float(x[i]) - m) - ls);
  } else {
    const float inv = 1.0f / s;
#pragma omp simd
    for (long long i = 0; i < n; ++i) forge_store(out + i, FP_EXP(to_float(x[i]) - m) * inv);
  }
}

extern "C" void softmax_online(const T_X* x, T_OUT* out, long long rows, long long cols) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long r = 0; r < rows; ++r) softmax_row(x + r * cols, out + r * cols, cols);
}
