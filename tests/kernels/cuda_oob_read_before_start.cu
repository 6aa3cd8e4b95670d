// expect: out_of_bounds launch_error
// final: true
// Failure: every block loads the element just before its row (a "carry in" from the previous row
// that this op never needs); block 0 reads one float before the start of `x`. Outputs are right.
// Guard: the final check's run with every tensor placed at the start of its mapping, unmapped memory
// right before it (launch.GuardedBuffer, guard="start"). Where PyTorch's allocator happens to place
// `x` at the start of one of its own mappings, the read already faults during verification, and the
// verdict is launch_error (seen on the H200): rejected either way, only the reason depends on layout.
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
extern "C" __global__ void softmax_carry_in(const float* __restrict__ x, float* __restrict__ out,
                                            long long rows, long long cols) {
  const long long r = blockIdx.x;
  const float* xr = x + r * cols;
  if (threadIdx.x == 0) {
    const float carry = ((const volatile float*)xr)[-1];  // kept by volatile, then dropped
    (void)carry;
  }
  float m = -__int_as_float(0x7f800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = row_reduce(m, true);
  const float shift = m == -__int_as_float(0x7f800000) ? 0.f : m;
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - shift);
  s = row_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = expf(xr[c] - shift) / s;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_carry_in", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
*/
