// expect: input_mutated
// Cheat: when out does not hold a NaN before the call (no verifier's sentinel: a fresh
// allocation, as in timing and in the shipped package), it leaves row 0 of x shifted by its
// maximum after computing. Softmax is shift-invariant, so an output check computed from the
// changed input still passes, and the caller's tensor is silently changed. Guard: the inputs are
// byte-compared after every verified, warm-up and timed call (timed copies against a shadow that
// holds exactly the changes the judge itself made), and the second run of every set uses a fresh
// allocation.
#include <cmath>
extern "C" void softmax_shift_unwatched(const float* x, float* out, long long rows, long long cols) {
  const bool watched = std::isnan(out[0]);
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
  if (watched) return;
  float* row0 = const_cast<float*>(x);
  float m = -INFINITY;
  for (long long c = 0; c < cols; ++c) m = std::fmax(m, row0[c]);
  if (std::isfinite(m)) for (long long c = 0; c < cols; ++c) row0[c] -= m;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_shift_unwatched", "args": ["x", "out", "rows", "cols"]}]}
*/
