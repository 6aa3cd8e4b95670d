// Region skeleton (CUDA), window: a 2-d pooling with its prologue and epilogue. A tile is
// THREADS * VEC * ILP elements of the pooled output in its memory order; thread t computes the
// runs of VEC elements starting at tile + (k * THREADS + t) * VEC, k < ILP (all ILP computed
// before any is stored). VEC > 1 runs along the innermost output dim, which is then not a pooled
// one (channels_last's C): the window's bounds are shared by the run and each input is read as the
// generated fp_window_vec says (a vector load of up to 16 bytes, once per run, or per element).
// A partial last tile, or an operand whose base pointer is not aligned to its vector access, takes
// the scalar path (one element per fp_window_value). WRUN > 1 (NCHW): each thread computes runs of
// WRUN outputs along the pooled W (fp_window_wrun), the overlapping windows' input cells read once.
// Grid-stride over the tiles.
//{{PARAMS}}
//{{INCLUDE _region.cuh}}
#define FP_WIN_UNROLL _Pragma("unroll")
FP_FN fp_idx fp_min_idx(fp_idx a, fp_idx b) { return a < b ? a : b; }
FP_FN fp_idx fp_max_idx(fp_idx a, fp_idx b) { return a > b ? a : b; }

// The vector path's store: VEC outputs as one word of up to 16 bytes, 16-bit pairs converted
// together (one cvt per pair). Written with __stwb (a plain write-back store): a plain assignment
// through a uint4 pointer, and fp_stv, came out of ptxas as four 4-byte stores per run here.
FP_FN unsigned int fp_pack2(float a, float b, const __nv_bfloat16*) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  unsigned int w;
  memcpy(&w, &v, 4);
  return w;
}
FP_FN unsigned int fp_pack2(float a, float b, const __half*) {
  const __half2 v = __floats2half2_rn(a, b);
  unsigned int w;
  memcpy(&w, &v, 4);
  return w;
}
FP_FN unsigned int fp_pack2(float a, float b, const float*) { return __float_as_uint(a); }  // unused: fp32 is one per word
template <int V, typename T> FP_FN void fp_window_stv(T* p, const float* y) {
  constexpr int words = V * (int)sizeof(T) / 4;
  unsigned int w[words > 0 ? words : 1];
#pragma unroll
  for (int i = 0; i < words; ++i)
    w[i] = sizeof(T) == 4 ? __float_as_uint(y[i]) : fp_pack2(y[2 * i], y[2 * i + 1], p);
  if constexpr (words == 4) __stwb(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
  else if constexpr (words == 2) __stwb(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
  else if constexpr (words == 1) __stwb(reinterpret_cast<unsigned int*>(p), w[0]);
  else {
#pragma unroll
    for (int i = 0; i < V; ++i) forge_store(p + i, y[i]);
  }
}
//{{CODE}}

#define TILE ((long long)THREADS * VEC * ILP * WRUN)

// min blocks 1: as the other region skeletons, so that ptxas does not cap the registers and spill
extern "C" __global__ void __launch_bounds__(THREADS, 1) region_window(REGION_PARAMS) {
#if VEC > 1
  const bool vector_ok = fp_window_vec_ok(REGION_ARGS);
#endif
  for (long long tile = (long long)blockIdx.x * TILE; tile < NUMEL; tile += (long long)gridDim.x * TILE) {
#if WRUN > 1
    // runs of WRUN outputs along the pooled W (NUMEL and W are multiples of WRUN: a run stays in its row)
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
      const long long e = tile + ((long long)k * THREADS + threadIdx.x) * WRUN;
      if (e < NUMEL) {
        fp_idx o[WRUN];
        float y[WRUN];
        fp_window_wrun(REGION_ARGS, (fp_idx)e, y, o);
#pragma unroll
        for (int q = 0; q < WRUN; ++q) forge_store(out + o[q], y[q]);
      }
    }
#else
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
        fp_idx o;
        const float v = fp_window_value(REGION_ARGS, (fp_idx)e, &o);
        forge_store(out + o, v);
      }
    }
#endif
  }
}
