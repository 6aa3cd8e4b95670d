// expect: mismatch nan nondeterministic
// Failure: accumulates row sums into a workspace it never zeroes (the spec does not ask for
// zero=true). Guard: workspaces are filled with fresh garbage before every verification call.
#include <cmath>
extern "C" void softmax_dirty_ws(const float* x, float* out, double* sums, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) sums[r] += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / sums[r]);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_dirty_ws", "args": ["x", "out", "sums", "rows", "cols"]}],
 "workspaces": [{"name": "sums", "bytes": "rows * 8"}]}
*/
