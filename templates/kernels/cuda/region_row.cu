// Region skeleton (CUDA), row: ROWS_PER_BLOCK rows per block, GROUP = THREADS / ROWS_PER_BLOCK
// threads per row; one pass over the row per reduction (fp32 accumulation, a shuffle +
// shared-memory reduction over the group), a later pass using the earlier results; then the
// epilogue writes the row (or, PER_ROW, its one value). Vector path: lane l takes the runs of VEC
// columns starting at (l + k * GROUP) * VEC, each operand read as the generated fp_elem_vec<j> /
// fp_out_vec say (a vector load of up to 16 bytes, once per run, or per element), the last
// COLS % VEC columns element by element. When an operand's base pointer is not aligned to its
// vector access, every row takes the scalar path (VEC columns in flight, strided by GROUP).
// CACHE: a lane's RUNS runs of its row (a compile-time count, every loop over them unrolled) are read once
// into registers (fp_load_run: every input leaf of the row's values, fp_run) before the first pass, and every
// pass and the epilogue compute from them (fp_elem_vec<j>_run, fp_out_vec_run): the row is read once, not once
// per pass and again for the epilogue. A lane's last, partial run reads a clamped, valid run and drops it; a
// dead row's lanes read the last row and store nothing, so no load is conditional. One row per thread (GROUP 1)
// serves the strided rows of a reduction over NCHW's channels (64 columns H*W apart; a warp's 32 neighbouring
// rows make one coalesced load per column). The last COLS % VEC columns and a misaligned launch (the scalar
// path) are read as without CACHE.
//{{PARAMS}}
//{{INCLUDE _region.cuh}}
//{{CODE}}

#define GROUP (THREADS / ROWS_PER_BLOCK)

#define COLS_VEC (COLS / VEC * VEC)

#if CACHE
#define RUNS ((COLS_VEC + GROUP * VEC - 1) / (GROUP * VEC))
#define TAIL_RUNS ((COLS - COLS_VEC + GROUP - 1) / GROUP)
#define FP_RUN(k) (((fp_idx)lane + (fp_idx)(k) * GROUP) * VEC)
#define FP_CLAMPED(c0) ((c0) < COLS_VEC ? (c0) : (fp_idx)(COLS_VEC - VEC))
#define FP_CACHED_PASS(j)                                                                   \
  {                                                                                         \
    float acc = FP_INIT##j;                                                                 \
    _Pragma("unroll") for (int k = 0; k < RUNS; ++k) {                                      \
      const fp_idx c0 = FP_RUN(k);                                                          \
      float e[VEC];                                                                         \
      fp_elem_vec##j##_run(run[k], rr, FP_CLAMPED(c0), red, e);                             \
      if (c0 < COLS_VEC) _Pragma("unroll") for (int v = 0; v < VEC; ++v) acc = FP_COMBINE##j(acc, e[v]); \
    }                                                                                       \
    _Pragma("unroll") for (int t = 0; t < TAIL_RUNS; ++t) {                                 \
      const fp_idx c = COLS_VEC + lane + (fp_idx)t * GROUP;                                 \
      if (c < COLS) acc = FP_COMBINE##j(acc, fp_elem##j(REGION_ARGS, rr, c, red));          \
    }                                                                                       \
    red[j] = FP_FINAL##j((fp_group_reduce<FP_OP##j, GROUP>(acc, scratch)));                 \
  }
#endif

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

// P(j) for every reduction j < NRED, in order
#if NRED > 0
#define FP_P0(P) P(0)
#else
#define FP_P0(P)
#endif
#if NRED > 1
#define FP_P1(P) P(1)
#else
#define FP_P1(P)
#endif
#if NRED > 2
#define FP_P2(P) P(2)
#else
#define FP_P2(P)
#endif
#if NRED > 3
#define FP_P3(P) P(3)
#else
#define FP_P3(P)
#endif
#if NRED > 4
#define FP_P4(P) P(4)
#else
#define FP_P4(P)
#endif
#if NRED > 5
#define FP_P5(P) P(5)
#else
#define FP_P5(P)
#endif
#if NRED > 6
#define FP_P6(P) P(6)
#else
#define FP_P6(P)
#endif
#if NRED > 7
#define FP_P7(P) P(7)
#else
#define FP_P7(P)
#endif
#define FP_ALL_PASSES(P) FP_P0(P) FP_P1(P) FP_P2(P) FP_P3(P) FP_P4(P) FP_P5(P) FP_P6(P) FP_P7(P)

// min blocks 1: without it ptxas capped some row kernels at 32 registers and spilled
extern "C" __global__ void __launch_bounds__(THREADS, 1) region_row(REGION_PARAMS) {
  __shared__ float scratch[32];
  const int lane = threadIdx.x % GROUP;
  const bool vector_ok = fp_vec_aligned(REGION_ARGS);
  for (long long r0 = (long long)blockIdx.x * ROWS_PER_BLOCK; r0 < ROWS; r0 += (long long)gridDim.x * ROWS_PER_BLOCK) {
    const fp_idx r = (fp_idx)(r0 + threadIdx.x / GROUP);
    const bool live = r < ROWS;
    float red[NRED + 1];
#if CACHE
    if (vector_ok) {  // the same for every thread of the launch
      const fp_idx rr = live ? r : (fp_idx)(ROWS - 1);
      fp_run run[RUNS > 0 ? RUNS : 1];
      _Pragma("unroll") for (int k = 0; k < RUNS; ++k) fp_load_run(REGION_ARGS, rr, FP_CLAMPED(FP_RUN(k)), run[k]);
      FP_ALL_PASSES(FP_CACHED_PASS)
#if PER_ROW
      if (live && lane == 0) forge_store(out + fp_out_offset(r, 0), fp_out_value(REGION_ARGS, r, 0, red));
#else
      _Pragma("unroll") for (int k = 0; k < RUNS; ++k) {
        const fp_idx c0 = FP_RUN(k);
        float y[VEC];
        fp_out_vec_run(run[k], rr, FP_CLAMPED(c0), red, y);
        if (live && c0 < COLS_VEC) fp_store_vec(REGION_ARGS, r, c0, y);
      }
      _Pragma("unroll") for (int t = 0; t < TAIL_RUNS; ++t) {
        const fp_idx c = COLS_VEC + lane + (fp_idx)t * GROUP;
        if (live && c < COLS) forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
      }
#endif
      continue;
    }
#endif
    FP_ALL_PASSES(FP_PASS)
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
  }
}
