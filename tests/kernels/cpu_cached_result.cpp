// expect: mismatch
// Cheat: computes the first input it sees, then replays that result for every later call
// ("the shapes match, the values must too"). Guard: fresh random inputs every evaluation plus
// captured and adversarial sets: the replayed output is wrong for all but the first.
#include <cmath>
#include <vector>
extern "C" void softmax_memo(const float* x, float* out, long long rows, long long cols) {
  static std::vector<float>& cache = *new std::vector<float>();  // never destroyed: no code after unload
  if (cache.size() != (size_t)(rows * cols)) {
    cache.assign(rows * cols, 0.f);
    for (long long r = 0; r < rows; ++r) {
      float m = -INFINITY; double s = 0;
      for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
      for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
      for (long long c = 0; c < cols; ++c) cache[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / s);
    }
  }
  for (long long i = 0; i < rows * cols; ++i) out[i] = cache[i];
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_memo", "args": ["x", "out", "rows", "cols"]}]}
*/
