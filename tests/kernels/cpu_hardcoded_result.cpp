// expect: mismatch
// Cheat: a hard-coded answer (the uniform distribution) that is exact for constant logits and
// "close" in absolute terms for long rows of small values. Guard: fresh random inputs and a tight
// absolute tolerance for probabilities (atol 1e-8: an all-uniform or all-zero answer fails).
extern "C" void softmax_uniform(const float* x, float* out, long long rows, long long cols) {
  (void)x;
  for (long long i = 0; i < rows * cols; ++i) out[i] = 1.0f / (float)cols;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_uniform", "args": ["x", "out", "rows", "cols"]}]}
*/
