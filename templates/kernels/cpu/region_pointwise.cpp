// Region skeleton (CPU), pointwise: one generated expression per output element over the
// region's iteration space, chunks of CHUNK elements in parallel, the inner loop vectorisable.
// The generated part (the CODE marker) reads each input at its own strides (broadcasts read stride 0).
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
//{{INCLUDE _region.h}}
//{{CODE}}

extern "C" void region_pointwise(REGION_PARAMS) {
  const float* red = nullptr;
  const long long r = 0;
#pragma omp parallel for schedule(static)
  for (long long b = 0; b < NUMEL; b += CHUNK) {
    const long long e = b + CHUNK < NUMEL ? b + CHUNK : NUMEL;
#pragma omp simd
    for (long long c = b; c < e; ++c) forge_store(out + fp_out_offset(r, c), fp_out_value(REGION_ARGS, r, c, red));
  }
}
