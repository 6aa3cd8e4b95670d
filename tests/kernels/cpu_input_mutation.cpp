// expect: input_mutated
// Cheat: uses the input as scratch space (stores exp(x - max) into x) to save an allocation.
// Guard: every input is compared bitwise with a saved copy after the call.
#include <cmath>
extern "C" void softmax_scratch(const float* x_, float* out, long long rows, long long cols) {
  float* x = const_cast<float*>(x_);
  for (long long r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) { xr[c] = std::exp(xr[c] - m); s += xr[c]; }
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(xr[c] / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_scratch", "args": ["x", "out", "rows", "cols"]}]}
*/
