// expect: nan
// Cheat: writes NaN for "hard" rows (max above 3), hoping NaN compares as equal.
// Guard: NaN/Inf must match the reference exactly, position by position.
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
extern "C" __global__ void softmax_nan_hard_rows(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x)
    out[blockIdx.x * cols + c] = m > 3.f ? __int_as_float(0x7fffffff) : expf(xr[c] - m) / s;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_nan_hard_rows", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
