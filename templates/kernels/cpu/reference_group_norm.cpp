// forge-pack reference kernel (CPU): group_norm over a contiguous [N, C, *spatial] tensor.
// Groups in parallel (OpenMP); per group two passes in double (mean, centred sum of squares),
// then one normalising write. IN_T (x, out) and W_T (weight, bias) come from the dtype prelude.
#include <cmath>
#include "forge_cpu.h"

#ifndef IN_T
#define IN_T float
#endif
#ifndef W_T
#define W_T IN_T
#endif

extern "C" void reference_group_norm(const IN_T* x, const W_T* weight, const W_T* bias, IN_T* out,
                                     long long N, long long C, long long HW, long long G, float eps) {
  const long long cpg = C / G, count = cpg * HW;
#pragma omp parallel for schedule(static)
  for (long long group = 0; group < N * G; ++group) {
    const long long base = group * count, c0 = (group % G) * cpg;
    double sum = 0.0;
    for (long long i = 0; i < count; ++i) sum += (double)to_float(x[base + i]);
    const double mean = sum / (double)count;
    double sq = 0.0;
    for (long long i = 0; i < count; ++i) {
      const double d = (double)to_float(x[base + i]) - mean;
      sq += d * d;
    }
    const double rstd = 1.0 / std::sqrt(sq / (double)count + (double)eps);  // biased variance, like PyTorch
    for (long long ci = 0; ci < cpg; ++ci) {
      const long long c = c0 + ci;
      const double w = weight ? (double)to_float(weight[c]) : 1.0;
      const double b = bias ? (double)to_float(bias[c]) : 0.0;
      for (long long i = ci * HW; i < (ci + 1) * HW; ++i)
        forge_store(out + base + i, (float)(((double)to_float(x[base + i]) - mean) * rstd * w + b));
    }
  }
}
