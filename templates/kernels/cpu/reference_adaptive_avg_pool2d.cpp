// forge-pack reference kernel (CPU): adaptive_avg_pool2d to (1, 1) of an [N, C, H, W] tensor,
// contiguous (NCHW) or channels_last (NHWC in memory, `channels_last` = 1). Sums in double;
// out is [N, C, 1, 1] in memory order n * C + c. IN_T comes from the dtype prelude.
#include "forge_cpu.h"

#ifndef IN_T
#define IN_T float
#endif

extern "C" void reference_adaptive_avg_pool2d(const IN_T* x, IN_T* out, long long N, long long C, long long HW,
                                              long long channels_last) {
#pragma omp parallel for schedule(static)
  for (long long idx = 0; idx < N * C; ++idx) {
    const long long n = idx / C, c = idx % C;
    double sum = 0.0;
    if (channels_last) {
      const IN_T* p = x + n * HW * C + c;
      for (long long i = 0; i < HW; ++i) sum += (double)to_float(p[i * C]);
    } else {
      const IN_T* p = x + idx * HW;
      for (long long i = 0; i < HW; ++i) sum += (double)to_float(p[i]);
    }
    forge_store(out + idx, (float)(sum / (double)HW));
  }
}
