// Region skeleton (CPU), window: a 2-d pooling with its prologue and epilogue. The pooled output's
// elements in its memory order, CHUNK of them per OpenMP chunk; the generated fp_window_value
// computes one element (its window, every reduction over it, the epilogue) and where it goes;
// with WRUN > 1, fp_window_wrun computes WRUN consecutive outputs along the pooled W at once.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
//{{INCLUDE _region.h}}
#define FP_WIN_UNROLL
static inline fp_idx fp_min_idx(fp_idx a, fp_idx b) { return a < b ? a : b; }
static inline fp_idx fp_max_idx(fp_idx a, fp_idx b) { return a > b ? a : b; }
//{{CODE}}

extern "C" void region_window(REGION_PARAMS) {
#if WRUN > 1
  // runs of WRUN outputs along the pooled W (NUMEL and W are multiples of WRUN: a run stays in its row)
#pragma omp parallel for schedule(static, CHUNK)
  for (long long e = 0; e < NUMEL; e += WRUN) {
    fp_idx o[WRUN];
    float y[WRUN];
    fp_window_wrun(REGION_ARGS, (fp_idx)e, y, o);
    for (int q = 0; q < WRUN; ++q) forge_store(out + o[q], y[q]);
  }
#else
#pragma omp parallel for schedule(static, CHUNK)
  for (long long e = 0; e < NUMEL; ++e) {
    fp_idx o;
    const float v = fp_window_value(REGION_ARGS, (fp_idx)e, &o);
    forge_store(out + o, v);
  }
#endif
}
