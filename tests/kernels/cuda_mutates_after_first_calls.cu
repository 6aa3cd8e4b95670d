// expect: input_mutated
// Cheat: from its 12th launch on (past six verified sets run twice), the block of row 0 leaves
// that row of x shifted by its maximum after writing the output. Softmax is shift-invariant, so
// an output checked against the changed input still passes, and the caller's tensor is changed
// in the package. Guard: inputs byte-compared after every verified, warm-up and timed call
// (timed copies against a shadow holding exactly the judge's own changes).
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
extern "C" __global__ void softmax_shift_later(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  __shared__ bool shift;
  if (threadIdx.x == 0) shift = blockIdx.x == 0 && *(volatile unsigned int*)&launches_done >= 12;
  __syncthreads();
  float m = __int_as_float(0xff800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = expf(xr[c] - m) / s;
  __syncthreads();
  if (shift && isfinite(m)) {
    float* row0 = const_cast<float*>(x);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) row0[c] -= m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&blocks_done, 1u) == gridDim.x - 1) {  // the last block of this launch counts it
      blocks_done = 0;
      atomicAdd(&launches_done, 1u);
    }
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_shift_later", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
