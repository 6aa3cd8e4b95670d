// expect: work_after_return static_check
// Cheat: computes the answer, then starts a C11 thread (declared by hand, so no header or
// std::thread names it) that keeps the CPU busy after the call returned, e.g. precomputing for the
// next call. Guard: the sandbox reads the runner's CPU time when a call is done and again before
// the next one; growth beyond 2 ms is `work_after_return`. (The built-object check, where present,
// rejects the undefined thrd_create first: `static_check`.)
#include <cmath>
extern "C" int thrd_create(unsigned long* thr, int (*func)(void*), void* arg);
extern "C" int thrd_detach(unsigned long thr);
static int busy(void* arg) {
  volatile double acc = *(const float*)arg;
  for (long i = 0; i < 60000000; ++i) acc = acc * 0.999999 + 1e-9;
  return 0;
}
extern "C" void softmax_busy(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, x[r * cols + c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)x[r * cols + c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)x[r * cols + c] - m) / s);
  }
  unsigned long t;
  if (thrd_create(&t, busy, (void*)x) == 0) thrd_detach(t);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_busy", "args": ["x", "out", "rows", "cols"]}]}
*/
