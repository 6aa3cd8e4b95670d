// expect: out_of_bounds
// mode: bounds
// Failure: a "previous element" term for a smoothing step that is multiplied by zero: at the first
// element of the first row it reads x[-1], before the start of `x`. The product is always zero
// (unless the stray value is Inf/NaN), so results match.
// Guard: a run with x starting right after a guard page (sandbox, guard="start").
#include <cmath>
extern "C" void softmax_lookbehind(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    const float before = *(row - 1);  // x[-1] for the first row
    float m = -INFINITY;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, row[c]);
    double s = 0;
    for (long long c = 0; c < cols; ++c) s += std::exp((double)row[c] - m);
    const float keep = (r == 0 && std::isfinite(before)) ? 0.f * before : 0.f;
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)row[c] - m) / s) + keep;
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_lookbehind", "args": ["x", "out", "rows", "cols"]}]}
*/
