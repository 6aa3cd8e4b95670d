// forge-pack region kernels (CUDA): element access and the math the generated expressions call
// (region_lower's op table), fp32 throughout, NaN propagated as PyTorch does. Stand-alone: only
// <cuda_fp16.h> and <cuda_bf16.h> are included.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define FP_FN __device__ __forceinline__
// The generated code's index type: FP_IDX_T is int where the iteration space and every operand's
// furthest element lie below 2^30 (set per region by search/families/region.py), so that index
// division by the constant sizes is 32-bit; long long otherwise (and when no define is given).
#ifndef FP_IDX_T
#define FP_IDX_T long long
#endif
typedef FP_IDX_T fp_idx;
#define FP_RESTRICT __restrict__
#define FP_INF __int_as_float(0x7f800000)
#undef FP_NAN  // <math.h>'s classification constant under nvcc; here the NaN value
#define FP_NAN __int_as_float(0x7fc00000)

// One element: a plain load (ld.global.nc where the compiler proves it read-only, as for the FP_RESTRICT
// inputs), which the compiler may merge with another load of the same address: x * x loads x once (fp32 used
// __ldg, an `asm volatile` that pins every load where it is written: x * x loaded x twice). A 16-bit element is
// a plain load of its raw bits, not cuda_bf16.h / cuda_fp16.h's own __ldg overloads:
// those are plain `asm` statements, which the compiler treats as free of side effects and may execute
// ahead of the condition guarding them. A window kernel's predicated reads of padding cells
// (`ok ? fp_ld(..) : 0`) were hoisted that way and read before the input's start (an illegal address
// on the H100). __ldg of the raw unsigned short (an `asm volatile`) is safe too, but pins every load
// where it is written: the window kernel at wrun 2, ilp 4, 1024 threads then spilled.
FP_FN float fp_ld(const float* p) { return *p; }
FP_FN float fp_ld(const __nv_bfloat16* p) { return __uint_as_float((unsigned)*reinterpret_cast<const unsigned short*>(p) << 16); }
FP_FN float fp_ld(const __half* p) { return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p))); }
FP_FN void forge_store(float* p, float v) { *p = v; }
FP_FN void forge_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
FP_FN void forge_store(__half* p, float v) { *p = __float2half_rn(v); }
FP_FN float fp_round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
FP_FN float fp_round_f16(float v) { return __half2float(__float2half_rn(v)); }
#if defined(FAST_MATH) && FAST_MATH
FP_FN float fp_exp(float v) { return __expf(v); }
#else
FP_FN float fp_exp(float v) { return expf(v); }
#endif
FP_FN float fp_log(float v) { return logf(v); }
FP_FN float fp_sqrt(float v) { return sqrtf(v); }
FP_FN float fp_rsqrt(float v) { return rsqrtf(v); }
FP_FN float fp_tanh(float v) { return tanhf(v); }
FP_FN float fp_erf(float v) { return erff(v); }
FP_FN float fp_abs(float v) { return fabsf(v); }
FP_FN float fp_pow(float a, float b) { return powf(a, b); }
FP_FN float fp_trunc(float v) { return truncf(v); }
FP_FN float fp_sigmoid(float v) { return 1.0f / (1.0f + fp_exp(-v)); }
FP_FN float fp_silu(float v) { return v / (1.0f + fp_exp(-v)); }
FP_FN float fp_relu(float v) { return v < 0.0f ? 0.0f : v; }
FP_FN float fp_gelu(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
FP_FN float fp_gelu_tanh(float v) { return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v))); }
FP_FN float fp_cos(float v) { return cosf(v); }
FP_FN float fp_sin(float v) { return sinf(v); }
FP_FN float fp_expm1(float v) { return expm1f(v); }
FP_FN float fp_log1p(float v) { return log1pf(v); }
FP_FN float fp_clamp_lo(float v, float lo) { return v < lo ? lo : v; }
FP_FN float fp_clamp_hi(float v, float hi) { return v > hi ? hi : v; }
FP_FN float fp_maxnan(float a, float b) { return (a != a || a > b) ? a : b; }
FP_FN float fp_minnan(float a, float b) { return (a != a || a < b) ? a : b; }

// op 0 sum, 1 max, 2 min
template <int OP> FP_FN float fp_comb(float a, float b) {
  return OP == 0 ? a + b : (OP == 1 ? fp_maxnan(a, b) : fp_minnan(a, b));
}

// Reduce over the GROUP threads of one row (GROUP = THREADS / ROWS_PER_BLOCK, a power of two):
// shuffles inside a warp, then the group's warps through shared memory. Every thread gets the result.

template <int OP, int GROUP> FP_FN float fp_group_reduce(float v, float* sh) {
#pragma unroll
  for (int o = (GROUP < 32 ? GROUP : 32) / 2; o > 0; o >>= 1) v = fp_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (GROUP <= 32) return v;
  const int warp = threadIdx.x >> 5, per = GROUP >= 32 ? GROUP / 32 : 1, first = (warp / per) * per;  // per: 1 keeps the dead branch of a small GROUP free of a division by zero
  __syncthreads();  // the scratch of the previous reduction has been read by every thread
  if ((threadIdx.x & 31) == 0) sh[warp] = v;
  __syncthreads();
  float t = sh[first];
  for (int k = 1; k < per; ++k) t = fp_comb<OP>(t, sh[first + k]);
  return t;
}

// Vector access: V elements of T moved as raw words of up to 16 bytes (uint4: 8 x bf16/f16, 4 x
// fp32), converted to / from fp32 per lane. The caller guarantees that p is aligned to one word
// (fp_aligned on the base pointer at run time, the element offset a multiple of V statically).
template <int B> struct fp_word;
template <> struct fp_word<2> { typedef unsigned short t; };
template <> struct fp_word<4> { typedef unsigned int t; };
template <> struct fp_word<8> { typedef uint2 t; };
template <> struct fp_word<16> { typedef uint4 t; };
template <int V, typename T> struct fp_vec_shape {
  static constexpr int bytes = V * (int)sizeof(T) < 16 ? V * (int)sizeof(T) : 16;  // per access
  static constexpr int per = bytes / (int)sizeof(T);                               // elements per access
};
FP_FN float fp_f(float v) { return v; }
FP_FN float fp_f(__nv_bfloat16 v) { return __bfloat162float(v); }
FP_FN float fp_f(__half v) { return __half2float(v); }
FP_FN void fp_to(float v, float& d) { d = v; }
FP_FN void fp_to(float v, __nv_bfloat16& d) { d = __float2bfloat16_rn(v); }
FP_FN void fp_to(float v, __half& d) { d = __float2half_rn(v); }

template <int V, typename T> FP_FN bool fp_aligned(const T* p) {
  return ((unsigned long long)p % (unsigned long long)fp_vec_shape<V, T>::bytes) == 0;
}

template <int V, typename T> FP_FN void fp_ldv(const T* p, float* y) {
  typedef fp_vec_shape<V, T> S;
  typedef typename fp_word<S::bytes>::t W;
#pragma unroll
  for (int a = 0; a < V / S::per; ++a) {
    const W w = __ldg(reinterpret_cast<const W*>(p) + a);
    T e[S::per];
    memcpy(e, &w, S::bytes);
#pragma unroll
    for (int i = 0; i < S::per; ++i) y[a * S::per + i] = fp_f(e[i]);
  }
}

template <int V, typename T> FP_FN void fp_stv(T* p, const float* y) {
  typedef fp_vec_shape<V, T> S;
  typedef typename fp_word<S::bytes>::t W;
#pragma unroll
  for (int a = 0; a < V / S::per; ++a) {
    T e[S::per];
#pragma unroll
    for (int i = 0; i < S::per; ++i) fp_to(y[a * S::per + i], e[i]);
    W w;
    memcpy(&w, e, S::bytes);
    reinterpret_cast<W*>(p)[a] = w;
  }
}
