// group_norm (CPU) for few, large groups (fewer groups than cores): parallel over the N * C
// channel planes instead. Pass 1 (parallel over planes): per plane, sum and sum of squares around
// the plane's first value (shifted, in double: no cancellation). Then each group merges its
// planes' moments (Chan's formula). Pass 2 (parallel over planes): (x - mean) * a + bias.
// Plane statistics live in a small heap buffer (2 doubles per plane, plus the shift).
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
#include <vector>

extern "C" void group_norm_planes(const T_X* x, const T_WEIGHT* weight, const T_BIAS* bias, T_OUT* out,
                                  long long N, long long C, long long HW, long long G, float eps) {
  const long long planes = N * C, cpg = C / G;
  std::vector<double> mean(planes), m2(planes);
#pragma omp parallel for schedule(static, GRAIN)
  for (long long p = 0; p < planes; ++p) {
    const T_X* FP_RESTRICT xp = x + p * HW;
    const double k = to_float(xp[0]);
    double s = 0.0, q = 0.0;
#pragma omp simd reduction(+ : s, q)
    for (long long i = 0; i < HW; ++i) { const double d = (double)to_float(xp[i]) - k; s += d; q += d * d; }
    mean[p] = k + s / (double)HW;
    m2[p] = q - s * s / (double)HW;
  }
  std::vector<float> a(planes), b(planes), mu_p(planes);
#pragma omp parallel for schedule(static)
  for (long long g = 0; g < N * G; ++g) {
    double n = 0.0, mu = 0.0, q = 0.0;
    for (long long p = g * cpg; p < (g + 1) * cpg; ++p) {  // Chan's merge, fixed order
      const double nb = (double)HW, d = mean[p] - mu, nn = n + nb;
      mu += d * nb / nn;
      q += m2[p] + d * d * n * nb / nn;
      n = nn;
    }
    const double var = q / n > 0.0 ? q / n : 0.0;
    const float rstd = (float)(1.0 / std::sqrt(var + (double)eps));
    for (long long p = g * cpg; p < (g + 1) * cpg; ++p) {
      const long long c = p % C;
      const float w = HAS_WEIGHT ? to_float(weight[c]) : 1.0f;
      const float bb = HAS_BIAS ? to_float(bias[c]) : 0.0f;
      a[p] = rstd * w;
      b[p] = bb;
      mu_p[p] = (float)mu;
    }
  }
#pragma omp parallel for schedule(static, GRAIN)
  for (long long p = 0; p < planes; ++p) {
    const T_X* FP_RESTRICT xp = x + p * HW;
    T_OUT* FP_RESTRICT op = out + p * HW;
    const float ap = a[p], bp = b[p], mp = mu_p[p];
#pragma omp simd
    for (long long i = 0; i < HW; ++i) forge_store(op + i, (to_float(xp[i]) - mp) * ap + bp);
  }
}
