// Region skeleton (CUDA), window: a 2-d pooling with its prologue and epilogue. A tile is
// THREADS * VEC * ILP elements of the pooled output in its memory order; thread t computes the
// runs of VEC elements starting at tile + (k * THREADS + t) * VEC, k < ILP (all ILP computed
// before any is stored). VEC > 1 runs along the innermost output dim, which is then not a pooled
// one (channels_last's C): the window's bounds are shared by the run and each input is read as the
// generated fp_window_vec says (a vector load of up to 16 bytes, once per run, or per element).
// A partial last tile, or an operand whose base pointer is not aligned to its vector access, takes
// the scalar path (one element per fp_window_value). Grid-stride over the tiles.
//{{PARAMS}}
//{{INCLUDE _region.cuh}}
#define FP_WIN_UNROLL _Pragma("unroll")
FP_FN long long fp_min_ll(long long a, long long b) { return a < b ? a : b; }
FP_FN long long fp_max_ll(long long a, long long b) { return a > b ? a : b; }
//{{CODE}}

#define TILE ((long long)THREADS * VEC * ILP)

// min blocks 1: as the other region skeletons, so that ptxas does not cap the registers and spill
extern "C" __global__ void __launch_bounds__(THREADS, 1) region_window(REGION_PARAMS) {
#if VEC > 1
  const bool vector_ok = fp_window_vec_ok(REGION_ARGS);
#endif
  for (long long tile = (long long)blockIdx.x * TILE; tile < NUMEL; tile += (long long)gridDim.x * TILE) {
#if VEC > 1
    if (vector_ok && tile + TILE <= NUMEL) {
      float y[ILP][VEC];
#pragma unroll
      for (int k = 0; k < ILP; ++k) fp_window_vec(REGION_ARGS, tile + ((long long)k * THREADS + threadIdx.x) * VEC, y[k]);
#pragma unroll
      for (int k = 0; k < ILP; ++k) fp_window_store_vec(REGION_ARGS, tile + ((long long)k * THREADS + threadIdx.x) * VEC, y[k]);
      continue;
    }
#endif
#if VEC > 1
#pragma unroll 1  // the cold path (the last tile, or a misaligned launch): kept small
#else
#pragma unroll
#endif
    for (int k = 0; k < VEC * ILP; ++k) {
      const long long e = tile + (long long)k * THREADS + threadIdx.x;
      if (e < NUMEL) {
        long long o;
        const float v = fp_window_value(REGION_ARGS, e, &o);
        forge_store(out + o, v);
      }
    }
  }
}
