// expect: nan
// Cheat: gives up on "hard" rows (here: any row whose max exceeds 3) and writes NaN, hoping a
// comparison that treats NaN as equal (equal_nan) or skips NaN lets it through.
// Guard: NaN/Inf must match the reference exactly, position by position.
#include <cmath>
extern "C" void softmax_nan_hard_rows(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c)
      out[r * cols + c] = m > 3.f ? NAN : (float)(std::exp((double)x[r * cols + c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_nan_hard_rows", "args": ["x", "out", "rows", "cols"]}]}
*/
