// expect: aliasing
// Cheat: computes softmax in place in its input and then copies it out: the output aliases (and
// destroys) the input. Guard: an input bound to a writable (non-const) pointer parameter.
#include <cmath>
#include <cstring>
extern "C" void softmax_inplace(float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) { xr[c] = std::exp(xr[c] - m); s += xr[c]; }
    for (long long c = 0; c < cols; ++c) xr[c] = (float)(xr[c] / s);
  }
  std::memcpy(out, x, sizeof(float) * rows * cols);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_inplace", "args": ["x", "out", "rows", "cols"]}]}
*/
