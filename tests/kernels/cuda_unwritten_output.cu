// expect: unwritten_output
// Cheat: only the first half of the rows is computed; the rest of `out` is left as it was.
// Guard: NaN sentinel in out before each call, every element checked.
__device__ float block_reduce(float v, bool is_max) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(0xffffffffu, v, o); v = is_max ? fmaxf(v, w) : v + w; }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
  return v;
}
extern "C" __global__ void softmax_half(const float* __restrict__ x, float* __restrict__ out, long long rows, long long cols) {
  const long long r = blockIdx.x;
  if (r >= rows / 2) return;
  float m = -1e30f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[r * cols + c]);
  m = block_reduce(m, true);
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(x[r * cols + c] - m);
  s = block_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = expf(x[r * cols + c] - m) / s;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_half", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
