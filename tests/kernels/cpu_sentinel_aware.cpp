// expect: mismatch
// Cheat: does the work only when `out` holds the verification sentinel (0x7FD5A5A5, documented in
// verify.py) and otherwise copies x at memory speed. Guard: the second run of every set gets a
// fresh output allocation (as timed calls do) and is held to the reference, and every timed call
// is checked too, so behaving only under verification fails there.
#include <cmath>
#include <cstdint>
#include <cstring>
extern "C" void softmax_two_faced(const float* x, float* out, long long rows, long long cols) {
  uint32_t bits;
  std::memcpy(&bits, out, 4);
  if (bits != 0x7FD5A5A5u) {
    std::memcpy(out, x, sizeof(float) * rows * cols);
    return;
  }
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_two_faced", "args": ["x", "out", "rows", "cols"]}]}
*/
