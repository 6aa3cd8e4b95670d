// forge-pack reference kernel: softmax over the last dim of a contiguous [rows, cols] tensor.
// One block per row; each thread keeps a running (max, sum of exp(x - max)) pair over its
// strided elements, the pairs are merged across the block, then each element is written once.
// Simple and correct (fp32 math, accurate expf), not fast: it is the search's starting point.
// IN_T / OUT_T are set by the dtype prelude forge-pack prepends (float, __nv_bfloat16, __half).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef IN_T
#define IN_T float
#endif
#ifndef OUT_T
#define OUT_T float
#endif

#define REF_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float ref_to_float(float v) { return v; }
__device__ __forceinline__ float ref_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ref_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void ref_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void ref_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void ref_store(__half* p, float v) { *p = __float2half_rn(v); }

// Merge two (max, sum of exp(x - max)) pairs; (-inf, 0) is the identity. Guarding on a zero sum
// (not on an infinite max) keeps exp(-inf - -inf) = NaN out while letting a NaN sum propagate: a
// row with NaN or +inf gives NaN, a fully -inf row ends as 0/0 = NaN, exactly like PyTorch.
__device__ __forceinline__ void ref_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  const float a = (s == 0.f) ? 0.f : s * expf(m - mn);
  const float b = (s2 == 0.f) ? 0.f : s2 * expf(m2 - mn);
  m = mn;
  s = a + b;
}

// One element: -inf (a masked position) contributes exp(-inf) = 0.
__device__ __forceinline__ void ref_update(float& m, float& s, float v) {
  if (v != REF_NEG_INF) ref_merge(m, s, v, 1.f);
}

// Block-wide merge; blockDim.x must be a multiple of 32 (the launch spec rounds it up).
__device__ __forceinline__ void ref_block_merge(float& m, float& s) {
  __shared__ float sm[32], ss[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ref_merge(m, s, m2, s2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = (blockDim.x + 31) >> 5;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    m = lane < nwarps ? sm[lane] : REF_NEG_INF;
    s = lane < nwarps ? ss[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
      ref_merge(m, s, m2, s2);
    }
    if (lane == 0) { sm[0] = m; ss[0] = s; }
  }
  __syncthreads();
  m = sm[0];
  s = ss[0];
}

extern "C" __global__ void reference_softmax(const IN_T* __restrict__ x, OUT_T* __restrict__ out,
                                             long long rows, long long cols) {
  const long long row = blockIdx.x;
  if (row >= rows) return;
  const IN_T* xr = x + row * cols;
  OUT_T* orow = out + row * cols;
  float m = REF_NEG_INF, s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) ref_update(m, s, ref_to_float(xr[c]));
  ref_block_merge(m, s);
  const float inv = 1.f / s;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) ref_store(orow + c, expf(ref_to_float(xr[c]) - m) * inv);
}
