// expect: out_of_bounds
// mode: bounds
// Failure: a software-pipelined loop loads the first element of the next row while finishing this
// one, including after the last row: a read one element past the end of `x`. The value is never
// used, so every output is right; in a package the allocator may place x at the end of a mapping.
// Guard: a run with x flush against a guard page after its end (sandbox, guard="end").
#include <cmath>
extern "C" void softmax_lookahead(const float* x, float* out, long long rows, long long cols) {
  float ahead = x[0];
  for (long long r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float m = ahead;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, row[c]);
    ahead = row[cols];  // next row's first element: one past the end on the last row
    double s = 0;
    for (long long c = 0; c < cols; ++c) s += std::exp((double)row[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)row[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_lookahead", "args": ["x", "out", "rows", "cols"]}]}
*/
