// expect: compile_error
// Failure: does not compile; the NVRTC log is the verdict's detail.
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
extern "C" __global__ void softmax_broken(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  out[0] = x[0] +;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_broken", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
