// expect: mismatch
// Cheat: claims fp32 output but rounds through bfloat16 and uses the fast __expf.
// Guard: the fp32 tolerance against a float64 reference, every element.
#include <cuda_bf16.h>
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
extern "C" __global__ void softmax_bf16_inside(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x)
    out[blockIdx.x * cols + c] = __bfloat162float(__float2bfloat16(__expf(xr[c] - m) / s));
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_bf16_inside", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
