// batch_norm inference (CPU), channels_last: per-channel mean, scale, bias gathered once, then
// pixels in parallel (OpenMP over N * H * W, GRAIN pixels per chunk) with a vectorised loop over C.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
#include <vector>

extern "C" void batch_norm_nhwc(const T_X* x, const T_RUNNING_MEAN* running_mean, const T_RUNNING_VAR* running_var,
                                const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* out, long long N, long long C,
                                long long HW, float eps) {
  std::vector<float> mv(C), av(C), bv(C);
  for (long long c = 0; c < C; ++c) {
    const float w = HAS_WEIGHT ? to_float(weight[c]) : 1.0f;
    mv[c] = to_float(running_mean[c]);
    av[c] = w / std::sqrt(to_float(running_var[c]) + eps);
    bv[c] = HAS_BIAS ? to_float(bias[c]) : 0.0f;
  }
  const float* FP_RESTRICT m = mv.data();
  const float* FP_RESTRICT a = av.data();
  const float* FP_RESTRICT b = bv.data();
#pragma omp parallel for schedule(static, GRAIN)
  for (long long p = 0; p < N * HW; ++p) {
    const T_X* FP_RESTRICT xp = x + p * C;
    T_OUT* FP_RESTRICT op = out + p * C;
#pragma omp simd
    for (long long c = 0; c < C; ++c) forge_store(op + c, (to_float(xp[c]) - m[c]) * a[c] + b[c]);
  }
}
