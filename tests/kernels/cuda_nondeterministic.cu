// expect: nondeterministic
// Failure: the result depends on state outside the inputs (as with a race): every second
// launch perturbs one element by one ulp, inside the tolerance. Guard: two runs bitwise equal.
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
__device__ unsigned int launches;
extern "C" __global__ void softmax_flaky(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = expf(xr[c] - m) / s;
  if (blockIdx.x == 0 && threadIdx.x == 0 && (atomicAdd(&launches, 1u) & 1u)) out[0] = nextafterf(out[0], 1.f);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_flaky", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
