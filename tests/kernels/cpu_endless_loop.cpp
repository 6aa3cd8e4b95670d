// expect: timeout
// Failure: never returns. Guard: the per-candidate timeout kills the worker (and replaces it).
extern "C" void softmax_spin(const float* x, float* out, long long rows, long long cols) {
  volatile int spin = 1;
  (void)x; (void)out; (void)rows; (void)cols;
  while (spin) {}
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_spin", "args": ["x", "out", "rows", "cols"]}]}
*/
