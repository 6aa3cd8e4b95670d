// expect: ok
// final: true
// signature: x: f32[512,2048], dim=-1
// Not a cheat: a float4 softmax whose last vector of the last row ends exactly at the last byte of
// `x` and of `out`. With this signature each tensor is 4 MiB, two whole 2 MiB granules, so in the
// guarded run its first and its last byte both touch unmapped memory; every access stays inside.
// Guard: none may fire; a guarded run that rejects this kernel has an off-by-one of its own.
__device__ float row_reduce(float v, bool take_max) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? fmaxf(v, w) : v + w;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = part[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) v = take_max ? fmaxf(v, part[i]) : v + part[i];
  return v;
}
extern "C" __global__ void softmax_vec4_exact(const float* __restrict__ x, float* __restrict__ out,
                                              long long rows, long long cols) {
  const long long r = blockIdx.x;
  const long long quads = cols / 4;  // requires cols % 4 == 0: no tail, the last quad is the row's end
  const float4* xr = reinterpret_cast<const float4*>(x + r * cols);
  float4* outr = reinterpret_cast<float4*>(out + r * cols);
  float m = -__int_as_float(0x7f800000);
  for (long long q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 v = xr[q];
    m = fmaxf(fmaxf(m, fmaxf(v.x, v.y)), fmaxf(v.z, v.w));
  }
  m = row_reduce(m, true);
  const float shift = m == -__int_as_float(0x7f800000) ? 0.f : m;
  float s = 0.f;
  for (long long q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 v = xr[q];
    s += expf(v.x - shift) + expf(v.y - shift) + expf(v.z - shift) + expf(v.w - shift);
  }
  s = row_reduce(s, false);
  for (long long q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 v = xr[q];
    outr[q] = make_float4(expf(v.x - shift) / s, expf(v.y - shift) / s, expf(v.z - shift) / s, expf(v.w - shift) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_vec4_exact", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}],
 "requires": ["cols % 4 == 0"]}
*/
