// expect: static_check
// Cheat: returns at once and finishes the work on a detached thread (the CPU analogue of work
// on a side stream): the timed call measures nothing. Guard: candidates may not start threads
// (OpenMP only, which joins before returning); rejected before compiling.
#include <cmath>
#include <thread>
extern "C" void softmax_later(const float* x, float* out, long long rows, long long cols) {
  std::thread([=] {
    for (long long r = 0; r < rows; ++r) {
      float m = -INFINITY; double s = 0;
      for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
      for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
      for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / s);
    }
  }).detach();
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_later", "args": ["x", "out", "rows", "cols"]}]}
*/
