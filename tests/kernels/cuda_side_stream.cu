// expect: static_check
// Cheat: launches the real work as a child kernel (dynamic parallelism) that runs outside the
// timed stream order. Guard: device-side launches, streams and runtime calls are rejected before
// compiling; the tool launches everything on torch's current stream and syncs device-wide.
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
__global__ void child(const float* x, float* out, long long n) {
  for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i];
}
extern "C" __global__ void softmax_later(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  if (blockIdx.x == 0 && threadIdx.x == 0) child<<<1, 256>>>(x, out, rows * cols);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_later", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
