// expect: crash
// Failure: hits a trap instruction (an assert compiled to __builtin_trap, SIGILL).
extern "C" void softmax_trap(const float* x, float* out, long long rows, long long cols) {
  (void)x; (void)out; (void)cols;
  if (rows > 0) __builtin_trap();
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_trap", "args": ["x", "out", "rows", "cols"]}]}
*/
