// expect: nan mismatch
// (nan on adversarial:large, or mismatch where a derived:mixed set, with rows scaled up to 1e3, fails first)
// Shortcut: softmax as exp(x) / sum(exp(x)) with no running maximum subtracted: one pass fewer
// over each row, and exact on the model's own activations and on unit-scale random draws. Once a
// logit passes ~88, exp overflows float to inf and the row turns into inf/inf = NaN.
// Guard: the adversarial "large" input set against a float64 reference, with NaN/Inf parity.
#include <cmath>
extern "C" void softmax_skip_max(const float* x, float* out, long long rows, long long cols) {
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* o = out + r * cols;
    double total = 0.0;
    for (long long c = 0; c < cols; ++c) total += std::exp(xr[c]);
    const float inv = (float)(1.0 / total);
    for (long long c = 0; c < cols; ++c) o[c] = std::exp(xr[c]) * inv;
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_skip_max", "args": ["x", "out", "rows", "cols"]}]}
*/
