// expect: mismatch
// Cheat: claims fp32 output but computes and rounds through bfloat16 (8 significant bits) to go
// faster. Guard: the fp32 tolerance (rtol 1e-4) against a float64 reference, every element.
#include <cmath>
#include "forge_cpu.h"
extern "C" void softmax_bf16_inside(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY; float s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c)
      out[r * cols + c] = forge_bf16_to_float(forge_float_to_bf16(std::exp(x[r * cols + c] - m) / s));
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_bf16_inside", "args": ["x", "out", "rows", "cols"]}]}
*/
