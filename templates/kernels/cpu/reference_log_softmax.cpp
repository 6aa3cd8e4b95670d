// forge-pack reference kernel (CPU): log_softmax over the last dim of a contiguous [rows, cols] tensor.
// Rows in parallel (OpenMP); per row: max, then the sum of exp(x - max) in double, then one write.
// NaN semantics match PyTorch: a row with NaN or +inf, or fully -inf, becomes NaN.
// IN_T / OUT_T (float, forge_bf16, forge_f16) are set by the dtype prelude forge-pack prepends.
#include <cmath>
#include "forge_cpu.h"

#ifndef IN_T
#define IN_T float
#endif
#ifndef OUT_T
#define OUT_T float
#endif

extern "C" void reference_log_softmax(const IN_T* x, OUT_T* out, long long rows, long long cols) {
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r) {
    const IN_T* xr = x + r * cols;
    OUT_T* orow = out + r * cols;
    float m = -INFINITY;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, to_float(xr[c]));
    double s = 0.0;
    for (long long c = 0; c < cols; ++c) s += std::exp((double)to_float(xr[c]) - (double)m);
    const double lse = std::log(s);
    for (long long c = 0; c < cols; ++c) forge_store(orow + c, (float)((double)to_float(xr[c]) - (double)m - lse));
  }
}
