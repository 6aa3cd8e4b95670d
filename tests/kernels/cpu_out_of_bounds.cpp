// expect: out_of_bounds
// Failure: an off-by-one loop bound writes one element past the end of `out`.
// Guard: canary bytes around every tensor in the runner's arena (forge_pack/sandbox.py), checked
// after each call; before the sandbox, the verifier's canaries around out gave `mismatch`.
#include <cmath>
extern "C" void softmax_oob(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c <= cols; ++c) {
      const long long i = r * cols + c;
      if (c < cols) out[i] = (float)(std::exp((double)x[i] - m) / s);
      else if (r == rows - 1) out[i] = 0.f;
    }
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_oob", "args": ["x", "out", "rows", "cols"]}]}
*/
