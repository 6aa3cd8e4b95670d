// expect: mismatch
// Failure: an off-by-one bound writes one element past the end of `out` (a missing tail check).
// Guard: canary bytes around the output buffer, in every evaluation (the final check's out-of-bounds
// run would fault on it too: tests/kernels/cuda_oob_write_past_end.cu is the write canaries miss).
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
extern "C" __global__ void softmax_oob(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c <= cols; c += blockDim.x) {
    if (c < cols) out[blockIdx.x * cols + c] = expf(xr[c] - m) / s;
    else if (blockIdx.x == rows - 1) out[rows * cols] = 0.f;
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_oob", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
