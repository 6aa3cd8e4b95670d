// Region skeleton (CUDA), pointwise: a tile is THREADS * VEC * ILP elements of the flat iteration
// index. On the vector path thread t computes the runs of VEC elements starting at
// tile + (k * THREADS + t) * VEC, k < ILP (all ILP runs loaded before any is stored, so ILP
// vector loads per operand are in flight); each operand is read as the generated fp_out_vec
// says: once per run (broadcast), one vector load per run (16 bytes at most per access), or per
// element. A partial last tile, or any operand whose base pointer is not aligned to its vector
// access, takes the scalar path: thread t takes elements t, t + THREADS, ... of the tile
// (coalesced for every stride-1 operand). One tile per block, or (GRID_STRIDE) a grid of a few
// blocks per SM striding over the tiles; the launch sets the grid, the loop serves both.
//{{PARAMS}}
//{{INCLUDE _region.cuh}}
//{{CODE}}

#define TILE ((long long)THREADS * VEC * ILP)

// min blocks 1: without it ptxas capped some kernels at 32 registers and spilled
extern "C" __global__ void __launch_bounds__(THREADS, 1) region_pointwise(REGION_PARAMS) {
  const float* red = nullptr;
  const long long r = 0;
  const bool vector_ok = fp_vec_aligned(REGION_ARGS);
  for (long long tile = (long long)blockIdx.x * TILE; tile < NUMEL; tile += (long long)gridDim.x * TILE) {
    if (vector_ok && tile + TILE <= NUMEL) {
      float y[ILP][VEC];
#pragma unroll
      for (int k = 0; k < ILP; ++k) fp_out_vec(REGION_ARGS, r, tile + ((long long)k * THREADS + threadIdx.x) * VEC, red, y[k]);
#pragma unroll
      for (int k = 0; k < ILP; ++k) fp_store_vec(REGION_ARGS, r, tile + ((long long)k * THREADS + threadIdx.x) * VEC, y[k]);
    } else {
#pragma unroll 1  // the cold path (the last tile, or a misaligned launch): kept small
      for (int k = 0; k < VEC * ILP; ++k) {
        const long long c = tile + (long long)k * THREADS + threadIdx.x;
        if (c < NUMEL) forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
      }
    }
  }
}
