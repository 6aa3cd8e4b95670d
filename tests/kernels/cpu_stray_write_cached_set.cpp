// expect: input_mutated
// Cheat: keeps the address of the input it got for the 37-row set (one of the cached odd-size
// sets) and, on a later call for another set, writes into that old buffer: after the 37-row set's
// own checks, so no per-call input comparison sees it; the next candidate would be judged on
// corrupted inputs. Guard: every cached set's content fingerprint is compared after the
// evaluation (judge.judge); a change is input_mutated and the sets are reloaded.
#include <cmath>
static float* remembered = nullptr;
static bool done = false;
extern "C" void softmax_stray_write(const float* x, float* out, long long rows, long long cols) {
  if (rows == 37 && !remembered) remembered = const_cast<float*>(x);
  if (rows != 37 && remembered && !done) {
    remembered[1] += 0.5f;
    done = true;
  }
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    if (m == -INFINITY) {
      for (long long c = 0; c < cols; ++c) out[r * cols + c] = NAN;
      continue;
    }
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_stray_write", "args": ["x", "out", "rows", "cols"]}]}
*/
