// expect: unwritten_output
// Cheat: computes only the first half of the rows and leaves the rest of `out` as it was
// (hoping it still holds a previous result, or zeros). Guard: NaN sentinel in out before each call.
#include <cmath>
extern "C" void softmax_half(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows / 2; ++r) {
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_half", "args": ["x", "out", "rows", "cols"]}]}
*/
