// expect: unwritten_output mismatch nondeterministic
// Cheat: counts its launches in device memory that survives between them and stops working after
// 30 (verification makes a few calls per input set, a timing loop many). Guard: every warm-up and
// timed call is checked; the skipped calls show as unwritten output where out held the sentinel,
// as a mismatch where it held garbage (or, if verification already reaches the 30th call, its
// second run differs from the first).
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
__device__ unsigned int launches_seen;  // module memory: zero at load, kept between launches
extern "C" __global__ void softmax_tired(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  __shared__ bool tired;  // one read per block: every thread of the block returns or none does
  if (threadIdx.x == 0) tired = *(volatile unsigned int*)&launches_seen >= 30;
  __syncthreads();
  if (tired) return;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = expf(xr[c] - m) / s;
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&launches_seen, 1u);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_tired", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
