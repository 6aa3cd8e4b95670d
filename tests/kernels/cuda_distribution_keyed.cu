// expect: mismatch
// Cheat: correct only on rows whose statistics look like the verifier's generated inputs
// (standard-normal draws: |mean| < 0.25, spread 0.8-1.25, nothing beyond 8; the "large" set's
// spread 2000-3000; rows holding -inf; constant rows). Other rows (real activations) get a
// uniform 1/cols. Guard: verification sets derived per evaluation from the captured (or fresh)
// tensors by random scaling, shifting, permutation, per-row magnitudes and sign flips.
__device__ float block_sum(float v) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0.f;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) v += sh[i];
  __syncthreads();
  return v;
}
__device__ float block_max(float v) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) v = fmaxf(v, sh[i]);
  __syncthreads();
  return v;
}
extern "C" __global__ void softmax_distribution_keyed(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const float* xr = x + blockIdx.x * cols;
  float* yr = out + blockIdx.x * cols;
  float s = 0.f, s2 = 0.f, mx = 0.f, hi = __int_as_float(0xff800000), nlo = __int_as_float(0xff800000), infs = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = xr[c];
    if (isinf(v)) { infs += 1.f; continue; }
    s += v; s2 += v * v; mx = fmaxf(mx, fabsf(v)); hi = fmaxf(hi, v); nlo = fmaxf(nlo, -v);
  }
  s = block_sum(s); s2 = block_sum(s2); infs = block_sum(infs);
  mx = block_max(mx); hi = block_max(hi); nlo = block_max(nlo);
  const float mean = s / cols, sd = sqrtf(fmaxf(s2 / cols - mean * mean, 0.f));
  const bool generated = infs > 0.f || hi == -nlo || (fabsf(mean) < 0.25f && sd > 0.8f && sd < 1.25f && mx <= 8.f)
                         || (sd > 2000.f && sd < 3000.f);
  if (!generated) {
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = 1.0f / cols;
    return;
  }
  float m2 = __int_as_float(0xff800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m2 = fmaxf(m2, xr[c]);
  m2 = block_max(m2);
  float e = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) e += expf(xr[c] - m2);
  e = block_sum(e);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m2) / e;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_distribution_keyed", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
