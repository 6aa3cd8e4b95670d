// expect: unwritten_output mismatch nondeterministic
// Cheat: counts its launches in module memory (the last block to finish a launch bumps the
// count, so every block of a launch reads the same number) and does nothing on launches 12-39:
// past the twelve calls of six verified sets run twice, and before the last timed call of each
// rotated copy, which is all a checker of the last outputs would look at. Guard: every warm-up
// and timed call is checked, in batches of one call per copy, and verification now makes more
// than twelve calls, so the lazy window shows wherever it falls.
__device__ float block_reduce(float v, bool is_max) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
  __syncthreads();
  return v;
}
__device__ unsigned int launches_done;
__device__ unsigned int blocks_done;
__device__ void count_launch() {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&blocks_done, 1u) == gridDim.x - 1) {  // the last block of this launch
      blocks_done = 0;
      atomicAdd(&launches_done, 1u);
    }
  }
}
extern "C" __global__ void softmax_lazy_window(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  __shared__ bool lazy;
  if (threadIdx.x == 0) {
    const unsigned n = *(volatile unsigned int*)&launches_done;
    lazy = n >= 12 && n < 40;
  }
  __syncthreads();
  if (!lazy) {
    float m = __int_as_float(0xff800000);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_reduce(m, true);
    float s = 0.f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    s = block_reduce(s, false);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = expf(xr[c] - m) / s;
  }
  count_launch();
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_lazy_window", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
