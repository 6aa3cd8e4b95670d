// expect: out_of_bounds
// final: true
// Failure: the 32-bit word right after `out` serves as a count of running blocks (each block adds
// one when it starts and takes one away when it ends): a write one element past the end of the
// output. The word ends as it began, so the canary bytes around `out` are intact after every call
// and every output is right.
// Guard: the final check's run with every tensor flush against unmapped memory (launch.GuardedBuffer).
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
extern "C" __global__ void softmax_borrowed_counter(const float* __restrict__ x, float* __restrict__ out,
                                                    long long rows, long long cols) {
  unsigned int* running = reinterpret_cast<unsigned int*>(out + rows * cols);
  if (threadIdx.x == 0) atomicAdd(running, 1u);
  const long long r = blockIdx.x;
  const float* xr = x + r * cols;
  float m = -__int_as_float(0x7f800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = row_reduce(m, true);
  const float shift = m == -__int_as_float(0x7f800000) ? 0.f : m;
  float s = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - shift);
  s = row_reduce(s, false);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = expf(xr[c] - shift) / s;
  __syncthreads();
  if (threadIdx.x == 0) atomicSub(running, 1u);
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_borrowed_counter", "args": ["x", "out", "rows", "cols"], "grid": ["rows"],
              "block": [256]}]}
*/
