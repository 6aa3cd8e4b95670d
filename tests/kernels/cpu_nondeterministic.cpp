// expect: nondeterministic
// Failure: the result depends on state outside the inputs (as a race or a reduction in
// scheduling order would): every second call perturbs one element by one ulp, well inside the
// tolerance. Guard: two runs on the same input must be bitwise equal.
#include <cmath>
static unsigned long long calls = 0;
extern "C" void softmax_flaky(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / s);
  }
  if (calls++ % 2) out[0] = std::nextafter(out[0], 1.0f);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_flaky", "args": ["x", "out", "rows", "cols"]}]}
*/
