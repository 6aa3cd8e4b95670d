// expect: static_check
// Cheat: does its work while the shared object loads, before any call is verified or timed: a
// constructor function precomputes an exp table (and could do anything else, unobserved). Guard:
// the built object's .init_array holds an entry beyond the toolchain's own.
#include <cmath>
static float exp_table[256];
__attribute__((constructor)) static void fill_table_early() {
  for (int i = 0; i < 256; ++i) exp_table[i] = std::exp(-i / 16.0f);
}
extern "C" void softmax_prefilled(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
  out[0] += exp_table[255] * 0.f;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_prefilled", "args": ["x", "out", "rows", "cols"]}]}
*/
