// expect: mismatch
// Cheat: skips the work when `out` already holds a result (first element not NaN), which is the
// case in a timing loop whose output buffers come back from the allocator with the last answer.
// Guard: the second run of every set gets a fresh output allocation instead of the NaN sentinel
// and is held to the reference; one element of x changes before every timed call and every timed
// output is checked against its inputs: a skipped call leaves a stale answer.
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
