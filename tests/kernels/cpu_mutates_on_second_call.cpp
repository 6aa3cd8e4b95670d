// expect: input_mutated
// Cheat: uses x as scratch (zeroes it) whenever it is called again on the same buffer, so the
// first call on any input looks clean. Guard: inputs are compared bitwise after both runs.
#include <cmath>
static const float* last_x = nullptr;
extern "C" void softmax_scratch(const float* x_in, float* out, long long rows, long long cols) {
  float* x = const_cast<float*>(x_in);
  const bool again = x_in == last_x;
  last_x = x_in;
  for (long long r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
    if (again)
      for (long long c = 0; c < cols; ++c) xr[c] = 0.f;
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_scratch", "args": ["x", "out", "rows", "cols"]}]}
*/
