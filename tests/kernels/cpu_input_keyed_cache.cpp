// expect: mismatch
// Cheat: remembers its last answer under a key of 32 sampled input values and replays it when the
// key matches (every verification set is run twice on the same input, and a timing loop repeats
// one input). Guard: one element of x changes before every timed call, and every timed output
// is checked against its inputs: the replayed answer is stale where x changed.
#include <cmath>
#include <cstring>
#include <vector>
extern "C" void softmax_replay(const float* x, float* out, long long rows, long long cols) {
  static std::vector<float>& key_seen = *new std::vector<float>();  // never destroyed: no code after unload
  static std::vector<float>& answer = *new std::vector<float>();
  const long long n = rows * cols;
  std::vector<float> key(32);
  for (int i = 0; i < 32; ++i) key[i] = x[(n - 1) * i / 31];
  if ((long long)answer.size() == n && std::memcmp(key.data(), key_seen.data(), sizeof(float) * 32) == 0) {
    std::memcpy(out, answer.data(), sizeof(float) * n);
    return;
  }
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
  key_seen = key;
  answer.assign(out, out + n);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_replay", "args": ["x", "out", "rows", "cols"]}]}
*/
