// expect: compile_error
// Failure: does not compile. The compiler log becomes the verdict's detail, not an exception.
extern "C" void softmax_broken(const float* x, float* out, long long rows, long long cols) {
  out[0] = x[0] +;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_broken", "args": ["x", "out", "rows", "cols"]}]}
*/
