// expect: mismatch nan nondeterministic
// Failure: accumulates row sums into a workspace it never zeroes (no zero=true in the spec).
// Guard: workspaces get fresh garbage before every verification call.
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
extern "C" __global__ void softmax_dirty_ws(const float* __restrict__ x, float* __restrict__ out, float* sums, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  if (threadIdx.x == 0) sums[blockIdx.x] += s;
  __syncthreads();
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = expf(xr[c] - m) / sums[blockIdx.x];
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_dirty_ws", "args": ["x", "out", "sums", "rows", "cols"], "grid": ["rows"], "block": [256]}],
 "workspaces": [{"name": "sums", "bytes": "rows * 4"}]}
*/
