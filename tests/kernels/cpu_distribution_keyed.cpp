// expect: mismatch
// Cheat: is correct only on rows that look like the verifier's generated inputs: standard-normal
// draws (|mean| < 0.25, spread 0.8-1.25, nothing beyond 8), the "large" set (spread 2000-3000),
// rows holding -inf, constant rows. Any other row (real activations: other scales, offsets,
// mixed magnitudes) gets a uniform 1/cols, which skips the exponentials. Guard: verification
// sets derived per evaluation from the captured (or fresh) tensors by random scaling, shifting,
// permutation, per-row magnitudes and sign flips.
#include <cmath>
static bool looks_generated(const float* xr, long long cols) {
  double s = 0, s2 = 0, mx = 0, lo = INFINITY, hi = -INFINITY;
  for (long long c = 0; c < cols; ++c) {
    const double v = xr[c];
    if (std::isinf(v)) return true;
    s += v; s2 += v * v; mx = std::fmax(mx, std::fabs(v)); lo = std::fmin(lo, v); hi = std::fmax(hi, v);
  }
  if (lo == hi) return true;
  const double mean = s / cols, sd = std::sqrt(std::fmax(s2 / cols - mean * mean, 0.0));
  if (std::fabs(mean) < 0.25 && sd > 0.8 && sd < 1.25 && mx <= 8) return true;
  return sd > 2000 && sd < 3000;
}
extern "C" void softmax_distribution_keyed(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = out + r * cols;
    if (!looks_generated(xr, cols)) {
      for (long long c = 0; c < cols; ++c) yr[c] = 1.0f / cols;
      continue;
    }
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    if (m == -INFINITY) {  // a fully masked row: NaN, as the reference has it
      for (long long c = 0; c < cols; ++c) yr[c] = NAN;
      continue;
    }
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) yr[c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_distribution_keyed", "args": ["x", "out", "rows", "cols"]}]}
*/
