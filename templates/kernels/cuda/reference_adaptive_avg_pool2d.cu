// forge-pack reference kernel: adaptive_avg_pool2d to (1, 1) of an [N, C, H, W] tensor, contiguous
// (NCHW) or channels_last (NHWC in memory, `channels_last` = 1). One thread per (n, c) output,
// summing its HW inputs in double; out is [N, C, 1, 1], memory order n * C + c in both layouts.
// Simple and correct, not fast (NCHW reads are strided across threads): the search's start.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef IN_T
#define IN_T float
#endif

__device__ __forceinline__ float ref_to_float(float v) { return v; }
__device__ __forceinline__ float ref_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ref_to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void ref_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void ref_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void ref_store(__half* p, float v) { *p = __float2half_rn(v); }

extern "C" __global__ void reference_adaptive_avg_pool2d(const IN_T* __restrict__ x, IN_T* __restrict__ out,
                                                         long long N, long long C, long long HW,
                                                         long long channels_last) {
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // n * C + c
  if (idx >= N * C) return;
  const long long n = idx / C, c = idx % C;
  double sum = 0.0;
  if (channels_last) {
    const IN_T* p = x + n * HW * C + c;
    for (long long i = 0; i < HW; ++i) sum += (double)ref_to_float(p[i * C]);
  } else {
    const IN_T* p = x + idx * HW;
    for (long long i = 0; i < HW; ++i) sum += (double)ref_to_float(p[i]);
  }
  ref_store(out + idx, (float)(sum / (double)HW));
}
