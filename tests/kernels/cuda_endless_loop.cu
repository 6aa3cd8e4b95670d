// expect: timeout
// Failure: never finishes. Guard: the per-candidate timeout kills the worker and replaces it.
__device__ float block_reduce(float v, bool is_max) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
  return v;
}
extern "C" __global__ void softmax_spin(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  // clock64() is a volatile read the compiler must keep; a plain `while (1) {}` is undefined
  // behaviour in C++ and ptxas deletes it (seen on the H200: the kernel returned at once).
  long long start = clock64();
  while (clock64() >= start) {}
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_spin", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
