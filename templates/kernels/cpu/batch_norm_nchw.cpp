// batch_norm inference (CPU), NCHW: planes in parallel (OpenMP over N * C); per plane the
// channel's a = weight * rsqrt(var + eps), then a vectorised (x - mean) * a + bias.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}

extern "C" void batch_norm_nchw(const T_X* x, const T_RUNNING_MEAN* running_mean, const T_RUNNING_VAR* running_var,
                                const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* out, long long N, long long C,
                                long long HW, float eps) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long p = 0; p < N * C; ++p) {
    const long long c = p % C;
    const float w = HAS_WEIGHT ? to_float(weight[c]) : 1.0f;
    const float bb = HAS_BIAS ? to_float(bias[c]) : 0.0f;
    const float a = w / std::sqrt(to_float(running_var[c]) + eps), m = to_float(running_mean[c]);
    const T_X* FP_RESTRICT xp = x + p * HW;
    T_OUT* FP_RESTRICT op = out + p * HW;
#pragma omp simd
    for (long long i = 0; i < HW; ++i) forge_store(op + i, (to_float(xp[i]) - m) * a + bb);
  }
}
