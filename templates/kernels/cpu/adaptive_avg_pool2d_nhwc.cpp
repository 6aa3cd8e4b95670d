// adaptive_avg_pool2d to (1, 1) (CPU), channels_last: (image, channel block) pairs in parallel;
// each sums its CBLOCK channels over the HW pixels with a vectorised loop along channels
// (contiguous in memory), accumulating in a small stack array of doubles: one float sum per
// channel, value after value, is less accurate than eager's (rejected on large-offset inputs).
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

extern "C" void adaptive_avg_pool2d_nhwc(const T_X* x, T_OUT* out, long long N, long long C, long long HW) {
  const double inv = 1.0 / (double)HW;
  const long long blocks = (C + CBLOCK - 1) / CBLOCK;
#pragma omp parallel for schedule(static, GRAIN)
  for (long long t = 0; t < N * blocks; ++t) {
    const long long n = t / blocks, c0 = (t % blocks) * CBLOCK;
    const long long nc = C - c0 < CBLOCK ? C - c0 : CBLOCK;
    double acc[CBLOCK];
    for (long long c = 0; c < nc; ++c) acc[c] = 0.0;
    for (long long p = 0; p < HW; ++p) {
      const T_X* FP_RESTRICT xp = x + (n * HW + p) * C + c0;
#pragma omp simd
      for (long long c = 0; c < nc; ++c) acc[c] += (double)to_float(xp[c]);
    }
    for (long long c = 0; c < nc; ++c) forge_store(out + n * C + c0 + c, (float)(acc[c] * inv));
  }
}
