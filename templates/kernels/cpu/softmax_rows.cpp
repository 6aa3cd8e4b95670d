// softmax / log_softmax over the last dim (CPU): rows in parallel (OpenMP, GRAIN rows per chunk);
// per row a max pass, a sum-of-exp pass and a write pass, each a vectorised loop. With an fp32
// output the sum pass stores exp(x - max) into out and the write pass only scales it (no second
// exp). NaN semantics match PyTorch: a row with NaN or +inf, or fully -inf, becomes NaN.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
#include <type_traits>

static void softmax_row(const T_X* FP_RESTRICT x, T_OUT* FP_RESTRICT out, long long n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (long long i = 0; i < n; ++i) m = fp_max(m, to_float(x[i]));
  float s = 0.0f;
  if (!LOG && std::is_same<T_OUT, float>::value) {
    float* o = reinterpret_cast<float*>(out);
#pragma omp simd reduction(+ : s)
    for (long long i = 0; i < n; ++i) { const float e = FP_EXP(to_float(x[i]) - m); o[i] = e; s += e; }
    const float inv = 1.0f / s;
#pragma omp simd
    for (long long i = 0; i < n; ++i) o[i] *= inv;
    return;
  }
#pragma omp simd reduction(+ : s)
  for (long long i = 0; i < n; ++i) s += FP_EXP(to_float(x[i]) - m);
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

extern "C" void softmax_rows(const T_X* x, T_OUT* out, long long rows, long long cols) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long r = 0; r < rows; ++r) softmax_row(x + r * cols, out + r * cols, cols);
}
