// expect: out_of_bounds
// mode: bounds
// Failure: each row parks its running sum in the first slot of the next row of `out` (overwritten
// when that row is computed), so the last row writes one element past the end of `out`.
// Guard: canary bytes after every tensor in the runner's arena, and a guarded run (guard="end").
#include <cmath>
extern "C" void softmax_park(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float m = -INFINITY;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, row[c]);
    float* parked = out + (r + 1) * cols;  // past the end for the last row
    *parked = 0.f;
    for (long long c = 0; c < cols; ++c) *parked += (float)std::exp((double)row[c] - m);
    const double s = *parked;
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)row[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_park", "args": ["x", "out", "rows", "cols"]}]}
*/
