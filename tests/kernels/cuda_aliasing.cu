// expect: aliasing
// Cheat: computes softmax in place in its input, then copies it to out: the output aliases the
// input. Guard: an input bound to a writable (non-const) pointer parameter is rejected.
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
extern "C" __global__ void softmax_inplace(float* x, float* out, long long rows, long long cols) {
  float* xr = x + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) xr[c] = expf(xr[c] - m) / s;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = xr[c];
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_inplace", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
