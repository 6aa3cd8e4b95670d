// expect: static_check
// Cheat: honest in the search's build, which passes no NDEBUG, and a shortcut in the package's
// build, whose setup.py compiles with Python's flags (-DNDEBUG): there it normalises every row by
// its first element only. The verified program is not the shipped one. Guard: a preprocessor
// conditional on a macro a compiler or build defines is refused (forge_pack/build_parity.py).
#include <cmath>
extern "C" void softmax_two_faced(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = xr[0];
#ifndef NDEBUG
    for (long long c = 1; c < cols; ++c) m = std::fmax(m, xr[c]);
#endif
    double s = 0;
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_two_faced", "args": ["x", "out", "rows", "cols"]}]}
*/
