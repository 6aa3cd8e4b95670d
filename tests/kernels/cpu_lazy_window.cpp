// expect: unwritten_output mismatch nondeterministic
// Cheat: counts its calls and does nothing on the 13th and 14th: with six input sets run twice,
// those are the warm-up and the first timed call, and a checker that inspects only the last
// timed call per rotated copy never looks at them (at full timing settings the same trick
// leaves most timed calls empty). Guard: every call is checked, warm-up and timed ones in batches
// of one call per copy, so a lazy call anywhere is caught (here already during verification,
// which now makes more than twelve calls).
#include <cmath>
static unsigned long long calls_made = 0;
extern "C" void softmax_lazy_window(const float* x, float* out, long long rows, long long cols) {
  const unsigned long long n = ++calls_made;
  if (n == 13 || n == 14) return;
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
{"kernels": [{"name": "softmax_lazy_window", "args": ["x", "out", "rows", "cols"]}]}
*/
