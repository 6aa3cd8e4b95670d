// adaptive_avg_pool2d to (1, 1) (CPU), NCHW: planes in parallel (OpenMP over N * C, GRAIN planes
// per chunk), a vectorised sum per plane, out = sum / HW.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

extern "C" void adaptive_avg_pool2d_nchw(const T_X* x, T_OUT* out, long long N, long long C, long long HW) {
  const float inv = 1.0f / (float)HW;
#pragma omp parallel for schedule(static, GRAIN)
  for (long long p = 0; p < N * C; ++p) {
    const T_X* FP_RESTRICT xp = x + p * HW;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (long long i = 0; i < HW; ++i) s += to_float(xp[i]);
    forge_store(out + p, s * inv);
  }
}
