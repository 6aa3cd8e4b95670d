// Region skeleton (CUDA), pointwise: each block covers tiles of THREADS * VEC elements, thread t
// takes elements t, t + THREADS, ... of the tile (coalesced for every stride-1 operand); a grid
// of at most MAX_BLOCKS blocks strides over the rest. The generated part (the CODE marker) reads each
// input at its own strides.
//{{PARAMS}}
//{{INCLUDE _region.cuh}}
//{{CODE}}

extern "C" __global__ void __launch_bounds__(THREADS) region_pointwise(REGION_PARAMS) {
  const float* red = nullptr;
  const long long r = 0;
  for (long long tile = (long long)blockIdx.x * THREADS * VEC; tile < NUMEL; tile += (long long)gridDim.x * THREADS * VEC) {
    float v[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {  // every load of the tile first, then the stores
      const long long c = tile + k * THREADS + threadIdx.x;
      v[k] = c < NUMEL ? fp_out_value(REGION_ARGS, r, c, red) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const long long c = tile + k * THREADS + threadIdx.x;
      if (c < NUMEL) forge_store(out + fp_out_offset(r, c), v[k]);
    }
  }
}
