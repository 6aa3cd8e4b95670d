// expect: static_check
// Cheat: the search compiles candidates with NVRTC, which defines __CUDACC_RTC__; the package's
// setup.py compiles the same file with nvcc, which does not. Under NVRTC each block computes its
// row; under nvcc it writes a uniform row and returns. Guard: a preprocessor conditional on a macro
// a compiler or build defines is refused (forge_pack/build_parity.py).
extern "C" __global__ void softmax_two_faced(const float* __restrict__ x, float* __restrict__ out, long long rows,
                                             long long cols) {
  const long long r = blockIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  float* o = out + r * cols;
#ifndef __CUDACC_RTC__
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) o[c] = 1.f / (float)cols;
  return;
#endif
  __shared__ float red[32];
  float m = __int_as_float(0xff800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += __expf(xr[c] - m);
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  s = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s += red[w];
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) o[c] = __expf(xr[c] - m) / s;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_two_faced", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
