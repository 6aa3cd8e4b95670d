// Region skeleton (CPU), row: rows in parallel (GRAIN rows per OpenMP chunk); per row, one pass
// over its COLS elements per reduction (a later pass may use the earlier results, as softmax's
// sum uses its max), fp32 accumulation, then the epilogue writes the row (or, PER_ROW, one value).
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
//{{INCLUDE _region.h}}
//{{CODE}}

#define FP_PASS_SUM(j)                                                          \
  {                                                                             \
    float acc = FP_INIT##j;                                                     \
    _Pragma("omp simd reduction(+ : acc)")                                      \
    for (long long c = 0; c < COLS; ++c) acc += fp_elem##j(REGION_ARGS, r, c, red); \
    red[j] = FP_FINAL##j(acc);                                                  \
  }
#define FP_PASS_ORDERED(j)                                                      \
  {                                                                             \
    float acc = FP_INIT##j;                                                     \
    for (long long c = 0; c < COLS; ++c) acc = FP_COMBINE##j(acc, fp_elem##j(REGION_ARGS, r, c, red)); \
    red[j] = FP_FINAL##j(acc);                                                  \
  }

extern "C" void region_row(REGION_PARAMS) {
#pragma omp parallel for schedule(static, GRAIN)
  for (long long r = 0; r < ROWS; ++r) {
    float red[NRED + 1];
#if NRED > 0
#if FP_SUM0
    FP_PASS_SUM(0)
#else
    FP_PASS_ORDERED(0)
#endif
#endif
#if NRED > 1
#if FP_SUM1
    FP_PASS_SUM(1)
#else
    FP_PASS_ORDERED(1)
#endif
#endif
#if NRED > 2
#if FP_SUM2
    FP_PASS_SUM(2)
#else
    FP_PASS_ORDERED(2)
#endif
#endif
#if NRED > 3
#if FP_SUM3
    FP_PASS_SUM(3)
#else
    FP_PASS_ORDERED(3)
#endif
#endif
#if NRED > 4
#if FP_SUM4
    FP_PASS_SUM(4)
#else
    FP_PASS_ORDERED(4)
#endif
#endif
#if NRED > 5
#if FP_SUM5
    FP_PASS_SUM(5)
#else
    FP_PASS_ORDERED(5)
#endif
#endif
#if NRED > 6
#if FP_SUM6
    FP_PASS_SUM(6)
#else
    FP_PASS_ORDERED(6)
#endif
#endif
#if NRED > 7
#if FP_SUM7
    FP_PASS_SUM(7)
#else
    FP_PASS_ORDERED(7)
#endif
#endif
#if PER_ROW
    forge_store(out + fp_out_offset(r, 0), fp_out_value(REGION_ARGS, r, 0, red));
#else
#pragma omp simd
    for (long long c = 0; c < COLS; ++c) forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
#endif
  }
}
