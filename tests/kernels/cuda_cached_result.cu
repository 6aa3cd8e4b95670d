// expect: mismatch
// Cheat: keeps each row's first result in device memory that survives between launches and
// replays it. Guard: fresh random inputs every evaluation, captured and adversarial sets.
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
__device__ float cache[1 << 21];
__device__ int row_cached[4096];
extern "C" __global__ void softmax_memo(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const long long r = blockIdx.x;
  const bool fits = r < 4096 && (r + 1) * cols <= (1 << 21);
  if (fits && row_cached[r]) {
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = cache[r * cols + c];
    return;
  }
  const float* xr = x + r * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float p = expf(xr[c] - m) / s;
    out[r * cols + c] = p;
    if (fits) cache[r * cols + c] = p;
  }
  __syncthreads();
  if (fits && threadIdx.x == 0) row_cached[r] = 1;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_memo", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
