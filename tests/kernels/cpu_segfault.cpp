// expect: crash
// Failure: dereferences a null pointer. Guard: the worker process dies, the verdict is `crash`,
// the worker is replaced and the next candidate is judged normally.
extern "C" void softmax_segv(const float* x, float* out, long long rows, long long cols) {
  volatile float* p = nullptr;
  (void)x; (void)rows; (void)cols;
  out[0] = *p;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_segv", "args": ["x", "out", "rows", "cols"]}]}
*/
