// forge-pack reference kernel: group_norm over a contiguous [N, C, *spatial] tensor (HW = spatial size).
// One block per (n, group): the group's CPG * HW elements are contiguous. Two passes over the
// group in double precision (mean, then the centred sum of squares: no cancellation even for a
// large mean), then one normalising write. Simple and correct, not fast: the search's start.
// IN_T (x, out) and W_T (weight, bias) are set by the dtype prelude forge-pack prepends.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef IN_T
#define IN_T float
#endif
#ifndef W_T
#define W_T IN_T
#endif

__device__ __forceinline__ float ref_to_float(float v) { return v; }
__device__ __forceinline__ float ref_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ref_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void ref_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void ref_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void ref_store(__half* p, float v) { *p = __float2half_rn(v); }

// Block-wide sum in double; blockDim.x must be a multiple of 32. Fixed order: deterministic.
__device__ __forceinline__ double ref_block_sum(double v) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = (blockDim.x + 31) >> 5;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? partial[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

extern "C" __global__ void reference_group_norm(const IN_T* __restrict__ x, const W_T* __restrict__ weight,
                                                const W_T* __restrict__ bias, IN_T* __restrict__ out,
                                                long long C, long long HW, long long G, float eps) {
  const long long group = blockIdx.x;  // n * G + g
  const long long cpg = C / G;
  const long long count = cpg * HW;
  const long long base = group * count;  // (n * C + g * cpg) * HW
  const long long c0 = (group % G) * cpg;
  double sum = 0.0;
  for (long long i = threadIdx.x; i < count; i += blockDim.x) sum += (double)ref_to_float(x[base + i]);
  const double mean = ref_block_sum(sum) / (double)count;
  double sq = 0.0;
  for (long long i = threadIdx.x; i < count; i += blockDim.x) {
    const double d = (double)ref_to_float(x[base + i]) - mean;
    sq += d * d;
  }
  const double var = ref_block_sum(sq) / (double)count;  // biased, like PyTorch
  const float rstd = (float)(1.0 / sqrt(var + (double)eps));
  const float meanf = (float)mean;
  for (long long i = threadIdx.x; i < count; i += blockDim.x) {
    const long long c = c0 + i / HW;
    const float w = weight ? ref_to_float(weight[c]) : 1.f;
    const float b = bias ? ref_to_float(bias[c]) : 0.f;
    ref_store(out + base + i, (ref_to_float(x[base + i]) - meanf) * rstd * w + b);
  }
}
