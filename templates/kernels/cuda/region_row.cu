// Region skeleton (CUDA), row: ROWS_PER_BLOCK rows per block, GROUP = THREADS / ROWS_PER_BLOCK
// threads per row; one pass over the row per reduction (fp32 accumulation, a shuffle +
// shared-memory reduction over the group), a later pass using the earlier results; then the
// epilogue writes the row (or, PER_ROW, its one value). Vector path: lane l takes the runs of VEC
// columns starting at (l + k * GROUP) * VEC, each operand read as the generated fp_elem_vec<j> /
// fp_out_vec say (a vector load of up to 16 bytes, once per run, or per element), the last
// COLS % VEC columns element by element. When an operand's base pointer is not aligned to its
// vector access, every row takes the scalar path (VEC columns in flight, strided by GROUP).
// CACHE: one row per thread (ROWS_PER_BLOCK = THREADS, no vector path) and every loop over its COLS
// columns unrolled. The later passes and the epilogue load the same addresses of the same read-only
// (restrict) inputs as the first pass, with no store between them that may alias, so the compiler keeps
// the row's inputs in registers and the kernel reads them once: the strided rows of a reduction over
// NCHW's channels (64 columns H*W apart; a warp's 32 neighbouring rows make one coalesced load per
// column), which the other path reads once per pass and once more for the epilogue.
//{{PARAMS}}
//{{INCLUDE _region.cuh}}
//{{CODE}}

#define GROUP (THREADS / ROWS_PER_BLOCK)

#define COLS_VEC (COLS / VEC * VEC)

#if CACHE
static_assert(ROWS_PER_BLOCK == THREADS, "CACHE keeps one row per thread");
#define FP_PASS(j)                                                                          \
  {                                                                                         \
    float acc = FP_INIT##j;                                                                 \
    _Pragma("unroll") for (int c = 0; c < (int)COLS; ++c)                                   \
      acc = FP_COMBINE##j(acc, fp_elem##j(REGION_ARGS, r, c, red));                        \
    red[j] = FP_FINAL##j(acc);                                                              \
  }
#else
#define FP_PASS(j)                                                                          \
  {                                                                                         \
    float acc = FP_INIT##j;                                                                 \
    if (live && vector_ok) {                                                                \
      _Pragma("unroll 2") for (fp_idx c0 = (fp_idx)lane * VEC; c0 < COLS_VEC;                   \
                               c0 += (fp_idx)GROUP * VEC) {                                \
        float e[VEC];                                                                       \
        fp_elem_vec##j(REGION_ARGS, r, c0, red, e);                                         \
        _Pragma("unroll") for (int k = 0; k < VEC; ++k) acc = FP_COMBINE##j(acc, e[k]);      \
      }                                                                                     \
      for (fp_idx c = COLS_VEC + lane; c < COLS; c += GROUP)                                \
        acc = FP_COMBINE##j(acc, fp_elem##j(REGION_ARGS, r, c, red));                      \
    } else if (live) { /* misaligned: the cold path, kept small (not unrolled) */            \
      for (fp_idx c0 = lane; c0 < COLS; c0 += (fp_idx)GROUP * VEC) {                        \
        _Pragma("unroll 1") for (int k = 0; k < VEC; ++k) {                                 \
          const fp_idx c = c0 + (fp_idx)k * GROUP;                                          \
          if (c < COLS) acc = FP_COMBINE##j(acc, fp_elem##j(REGION_ARGS, r, c, red));      \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
    red[j] = FP_FINAL##j((fp_group_reduce<FP_OP##j, GROUP>(acc, scratch)));                 \
  }
#endif

// min blocks 1: without it ptxas capped some row kernels at 32 registers and spilled
extern "C" __global__ void __launch_bounds__(THREADS, 1) region_row(REGION_PARAMS) {
#if CACHE
  for (long long r0 = (long long)blockIdx.x * THREADS + threadIdx.x; r0 < ROWS; r0 += (long long)gridDim.x * THREADS) {
    const fp_idx r = (fp_idx)r0;
#else
  __shared__ float scratch[32];
  const int lane = threadIdx.x % GROUP;
  const bool vector_ok = fp_vec_aligned(REGION_ARGS);
  for (long long r0 = (long long)blockIdx.x * ROWS_PER_BLOCK; r0 < ROWS; r0 += (long long)gridDim.x * ROWS_PER_BLOCK) {
    const fp_idx r = (fp_idx)(r0 + threadIdx.x / GROUP);
    const bool live = r < ROWS;
#endif
    float red[NRED + 1];
#if NRED > 0
    FP_PASS(0)
#endif
#if NRED > 1
    FP_PASS(1)
#endif
#if NRED > 2
    FP_PASS(2)
#endif
#if NRED > 3
    FP_PASS(3)
#endif
#if NRED > 4
    FP_PASS(4)
#endif
#if NRED > 5
    FP_PASS(5)
#endif
#if NRED > 6
    FP_PASS(6)
#endif
#if NRED > 7
    FP_PASS(7)
#endif
#if CACHE && PER_ROW
    forge_store(out + fp_out_offset(r, 0), fp_out_value(REGION_ARGS, r, 0, red));
#elif CACHE
    _Pragma("unroll") for (int c = 0; c < (int)COLS; ++c)
      forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
#else
    if (!live) continue;
#if PER_ROW
    if (lane == 0) forge_store(out + fp_out_offset(r, 0), fp_out_value(REGION_ARGS, r, 0, red));
#else
    if (vector_ok) {
      for (fp_idx c0 = (fp_idx)lane * VEC; c0 < COLS_VEC; c0 += (fp_idx)GROUP * VEC) {
        float y[VEC];
        fp_out_vec(REGION_ARGS, r, c0, red, y);
        fp_store_vec(REGION_ARGS, r, c0, y);
      }
      for (fp_idx c = COLS_VEC + lane; c < COLS; c += GROUP) forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
    } else {
      for (fp_idx c = lane; c < COLS; c += GROUP) forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
    }
#endif
#endif
  }
}
