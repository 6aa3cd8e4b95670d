// expect: input_mutated
// Cheat: uses the input as scratch space (stores exp(x - max) into x).
// Guard: every input is compared bitwise with a saved copy after the call.
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
extern "C" __global__ void softmax_scratch(const float* __restrict__ x_, float* __restrict__ out, long long rows, long long cols) {
  float* xr = const_cast<float*>(x_) + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) xr[c] = expf(xr[c] - m);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = xr[c] / s;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_scratch", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
