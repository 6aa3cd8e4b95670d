// Region skeleton (CPU), window: a 2-d pooling with its prologue and epilogue. The pooled output's
// elements in its memory order, CHUNK of them per OpenMP chunk; the generated fp_window_value
// computes one element (its window, every reduction over it, the epilogue) and where it goes.
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
//{{INCLUDE _region.h}}
#define FP_WIN_UNROLL
static inline fp_idx fp_min_idx(fp_idx a, fp_idx b) { return a < b ? a : b; }
static inline fp_idx fp_max_idx(fp_idx a, fp_idx b) { return a > b ? a : b; }
//{{CODE}}

extern "C" void region_window(REGION_PARAMS) {
#pragma omp parallel for schedule(static, CHUNK)
  for (long long e = 0; e < NUMEL; ++e) {
    fp_idx o;
    const float v = fp_window_value(REGION_ARGS, (fp_idx)e, &o);
    forge_store(out + o, v);
  }
}
