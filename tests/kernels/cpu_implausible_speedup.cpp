// expect: implausible_speedup
// Cheat: skips the work when `out` already holds a result (first element not NaN), which is the
// case in a timing loop that reuses output buffers. Verification (NaN-filled outputs) passes;
// the timed calls are then faster than reading the input once could be.
// Guard: a median below 0.8x the bandwidth floor is flagged implausible_speedup for review.
#include <cmath>
extern "C" void softmax_skip(const float* x, float* out, long long rows, long long cols) {
  if (!std::isnan(out[0]) && !std::isnan(out[rows * cols - 1])) return;
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_skip", "args": ["x", "out", "rows", "cols"]}]}
*/
