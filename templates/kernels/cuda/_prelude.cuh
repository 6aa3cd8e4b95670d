// ---------------------------------------------------------------------------------------------
// forge-pack CUDA template prelude: element conversion, 16-byte vector access with cache hints,
// warp/block reductions, mergeable statistics and an inter-block group barrier.
// It is pasted verbatim into every template kernel so that each candidate source stands alone
// (only <cuda_fp16.h> and <cuda_bf16.h> are included; no torch headers).
// ---------------------------------------------------------------------------------------------
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define FP_DEV __device__ __forceinline__

#ifndef FP_INF
#define FP_INF __int_as_float(0x7f800000)
#endif

// ---- element types: raw bits <-> float --------------------------------------------------------
template <typename T> struct Elem;
template <> struct Elem<float> {
  typedef unsigned int bits;
  static __device__ __forceinline__ float to_f(unsigned int b) { return __uint_as_float(b); }
  static __device__ __forceinline__ unsigned int from_f(float v) { return __float_as_uint(v); }
};
template <> struct Elem<__nv_bfloat16> {
  typedef unsigned short bits;
  // bf16 -> f32 is exact: the bf16 bits are the high half of the f32 bits.
  static __device__ __forceinline__ float to_f(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
  }
  static __device__ __forceinline__ unsigned short from_f(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
template <> struct Elem<__half> {
  typedef unsigned short bits;
  static __device__ __forceinline__ float to_f(unsigned short b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ unsigned short from_f(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

template <typename T> FP_DEV float load1(const T* p) {
  return Elem<T>::to_f(__ldg(reinterpret_cast<const typename Elem<T>::bits*>(p)));
}

template <typename T> FP_DEV void store1(T* p, float v) {
  *reinterpret_cast<typename Elem<T>::bits*>(p) = Elem<T>::from_f(v);
}

// ---- raw memory access with cache hints ------------------------------------------------------
// Load hint: 0 plain ld.global, 1 read-only path (__ldg, ld.global.nc),
//            2 streaming (__ldcs, ld.global.cs: evict-first, for data read exactly once).
// Store hint: 0 plain st.global, 1 streaming (__stcs, st.global.cs).
template <int BYTES> struct Raw;
template <> struct Raw<2> { typedef unsigned short type; };
template <> struct Raw<4> { typedef unsigned int type; };
template <> struct Raw<8> { typedef uint2 type; };
template <> struct Raw<16> { typedef uint4 type; };

template <int HINT, typename R> FP_DEV R ld_raw(const R* p) {
  if (HINT == 1) return __ldg(p);
  if (HINT == 2) return __ldcs(p);
  return *p;
}
template <int HINT, typename R> FP_DEV void st_raw(R* p, const R& v) {
  if (HINT == 1) __stcs(p, v);
  else *p = v;
}

// N consecutive elements of T held as raw bits (16-byte chunks at most per memory instruction).
// 16-bit elements stay packed two per 32-bit register (a bf16 vector of 8 is 4 registers) until
// get() converts one of them to float.
template <typename T, int N> struct Vec {
  typedef typename Elem<T>::bits B;
  static constexpr int BYTES = (int)sizeof(B) * N;
  static constexpr int CHUNK = BYTES < 16 ? BYTES : 16;
  static constexpr int NCHUNK = BYTES / CHUNK;
  static constexpr int NWORD = BYTES >= 4 ? BYTES / 4 : 1;
  typedef typename Raw<CHUNK>::type R;
  union { R r[NCHUNK]; unsigned int w[NWORD]; B b[N]; } u;

  template <int HINT> __device__ __forceinline__ void load(const T* p) {
    const R* q = reinterpret_cast<const R*>(p);
#pragma unroll
    for (int c = 0; c < NCHUNK; ++c) u.r[c] = ld_raw<HINT>(q + c);
  }
  template <int HINT> __device__ __forceinline__ void store(T* p) const {
    R* q = reinterpret_cast<R*>(p);
#pragma unroll
    for (int c = 0; c < NCHUNK; ++c) st_raw<HINT>(q + c, u.r[c]);
  }
  __device__ __forceinline__ float get(int k) const {
    if (sizeof(B) == 4 || BYTES < 4) return Elem<T>::to_f(u.b[k]);
    const unsigned int word = u.w[k >> 1];
    return Elem<T>::to_f((B)((k & 1) ? (word >> 16) : (word & 0xffffu)));
  }
  // get() through an opaque register copy: for chunks kept in registers across several passes,
  // so the compiler cannot hoist all conversions and keep every element alive as a float.
  __device__ __forceinline__ float get_fresh(int k) const {
    if (sizeof(B) == 4 || BYTES < 4) {
      unsigned int b = u.b[k];
      asm volatile("" : "+r"(b));
      return Elem<T>::to_f((B)b);
    }
    unsigned int word = u.w[k >> 1];
    asm volatile("" : "+r"(word));
    return Elem<T>::to_f((B)((k & 1) ? (word >> 16) : (word & 0xffffu)));
  }
  __device__ __forceinline__ void set(int k, float v) {
    if (sizeof(B) == 4 || BYTES < 4) { u.b[k] = Elem<T>::from_f(v); return; }
    const unsigned int bits = Elem<T>::from_f(v);
    unsigned int& word = u.w[k >> 1];
    word = (k & 1) ? ((word & 0xffffu) | (bits << 16)) : ((word & 0xffff0000u) | bits);
  }
};

// True when p can be accessed with V-element vectors of T (vector path), else use the scalar path.
template <typename T, int V> FP_DEV bool vec_aligned(const void* p) {
  constexpr unsigned long long B = sizeof(typename Elem<T>::bits) * V;
  constexpr unsigned long long A = B < 16 ? B : 16;
  return (reinterpret_cast<unsigned long long>(p) % A) == 0;
}

// ---- reductions ------------------------------------------------------------------------------
// WIDTH-lane groups inside a warp (WIDTH a power of two <= 32); every lane gets the result.
template <int WIDTH> FP_DEV float group_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, WIDTH);
  return v;
}
template <int WIDTH> FP_DEV float group_max(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, WIDTH));
  return v;
}

// Block-wide reductions for a 1-D block of NT threads (a multiple of 32). `red` is a __shared__
// float[32]; the leading barrier makes back-to-back calls safe. Every thread gets the result and
// the reduction order is fixed, so results are bitwise reproducible.
template <int NT> __device__ __forceinline__ float block_sum(float v, float* red) {
  v = group_sum<32>(v);
  if (NT == 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = ((threadIdx.x & 31) < NT / 32) ? red[threadIdx.x & 31] : 0.f;
  return group_sum<32>(v);
}
template <int NT> __device__ __forceinline__ float block_max(float v, float* red) {
  v = group_max<32>(v);
  if (NT == 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = ((threadIdx.x & 31) < NT / 32) ? red[threadIdx.x & 31] : -FP_INF;
  return group_max<32>(v);
}

// Online-softmax statistics: running max m and sum s of exp(x - m). A max of -inf means
// "no finite contribution yet" and must not produce exp(-inf - -inf) = NaN.
struct MaxSum { float m, s; };
template <typename ExpF> FP_DEV MaxSum maxsum_merge(MaxSum a, MaxSum b, ExpF ex) {
  const float m = fmaxf(a.m, b.m);
  if (m == -FP_INF) return MaxSum{m, a.s + b.s};
  // A side with max -inf has s == 0, or NaN when it saw a NaN: keep it as is (fmaxf drops NaN,
  // so NaN travels through the sums and makes the whole row NaN, as in PyTorch).
  const float sa = (a.m == -FP_INF) ? a.s : a.s * ex(a.m - m);
  const float sb = (b.m == -FP_INF) ? b.s : b.s * ex(b.m - m);
  return MaxSum{m, sa + sb};
}
template <int WIDTH, typename ExpF> FP_DEV MaxSum group_maxsum(MaxSum v, ExpF ex) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) {
    MaxSum w{__shfl_xor_sync(0xffffffffu, v.m, o, WIDTH), __shfl_xor_sync(0xffffffffu, v.s, o, WIDTH)};
    v = maxsum_merge(v, w, ex);
  }
  return v;
}
template <int NT, typename ExpF>
__device__ __forceinline__ MaxSum block_maxsum(MaxSum v, float* red_m, float* red_s, ExpF ex) {
  v = group_maxsum<32>(v, ex);
  if (NT == 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) { red_m[threadIdx.x >> 5] = v.m; red_s[threadIdx.x >> 5] = v.s; }
  __syncthreads();
  const int l = threadIdx.x & 31;
  v = (l < NT / 32) ? MaxSum{red_m[l], red_s[l]} : MaxSum{-FP_INF, 0.f};
  return group_maxsum<32>(v, ex);
}

// Mean/variance statistics (count n, mean, M2 = sum of squared deviations), merged with Chan's
// formula: robust where sum/sum-of-squares in fp32 would cancel catastrophically.
struct Moments { float n, mean, m2; };
FP_DEV Moments moments_merge(Moments a, Moments b) {
  const float n = a.n + b.n;
  if (b.n == 0.f) return a;
  if (a.n == 0.f) return b;
  const float d = b.mean - a.mean;
  const float fb = __fdividef(b.n, n);
  return Moments{n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}
template <int WIDTH> FP_DEV Moments group_moments(Moments v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) {
    Moments w{__shfl_xor_sync(0xffffffffu, v.n, o, WIDTH), __shfl_xor_sync(0xffffffffu, v.mean, o, WIDTH),
              __shfl_xor_sync(0xffffffffu, v.m2, o, WIDTH)};
    v = moments_merge(v, w);
  }
  return v;
}
// `red` is a __shared__ float[96].
template <int NT> __device__ __forceinline__ Moments block_moments(Moments v, float* red) {
  v = group_moments<32>(v);
  if (NT == 32) return v;
  __syncthreads();
  const int l = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (l == 0) { red[w] = v.n; red[32 + w] = v.mean; red[64 + w] = v.m2; }
  __syncthreads();
  v = (l < NT / 32) ? Moments{red[l], red[32 + l], red[64 + l]} : Moments{0.f, 0.f, 0.f};
  return group_moments<32>(v);
}
// Moments of K values known to a thread: exact two-pass in registers (count = valid values).
template <int K> FP_DEV Moments moments_of(const float (&v)[K], int valid) {
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) s += (k < valid) ? v[k] : 0.f;
  if (valid <= 0) return Moments{0.f, 0.f, 0.f};
  const float n = (float)valid, mean = __fdividef(s, n);
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) { const float d = v[k] - mean; q += (k < valid) ? d * d : 0.f; }
  return Moments{n, mean, q};
}

// ---- inter-block group barrier ---------------------------------------------------------------
// Used by the single-read "split_sync" kernels: the blocks of one group (one row, one norm
// group) each hold a chunk in registers, publish partial statistics, wait for their siblings,
// then finish from registers. `sync` is a zero-filled int workspace of 1 + 2 * groups ints:
// sync[0] is a ticket that hands out block ids in start order (so a block only ever waits for
// blocks that have already started, or that will start as soon as a slot frees); group g counts
// arrivals in sync[1 + 2g] and departures in sync[2 + 2g]. Every counter is reset by its last
// user, so the workspace is zero again after every launch.
// Deadlock freedom needs the blocks of one group to fit on the GPU at once (the launch spec
// bounds blocks per group); a wait longer than ~50 ms takes the kernel's slow fallback instead.
__device__ __forceinline__ unsigned int take_ticket(int* sync) {
  __shared__ unsigned int ticket;
  if (threadIdx.x == 0) {
    ticket = atomicAdd(reinterpret_cast<unsigned int*>(sync), 1u);
    if (ticket == gridDim.x * gridDim.y - 1) atomicExch(sync, 0);  // every block has its ticket
  }
  __syncthreads();
  return ticket;
}
// Call after this block's partial is written (by thread 0 or by all). False on timeout.
__device__ __forceinline__ bool group_arrive_and_wait(int* sync, unsigned int group, int members) {
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) {
    int* arrived = sync + 1 + 2 * group;
    __threadfence();
    atomicAdd(arrived, 1);
    const long long t0 = clock64();
    int good = 1;
    while (*reinterpret_cast<volatile int*>(arrived) < members) {
      __nanosleep(64);
      if (clock64() - t0 > 100000000LL) { good = 0; break; }
    }
    __threadfence();
    ok = good;
  }
  __syncthreads();
  return ok != 0;
}
// Call once every thread of this block is done reading the group's partials.
__device__ __forceinline__ void group_leave(int* sync, unsigned int group, int members) {
  __syncthreads();
  if (threadIdx.x == 0) {
    int* arrived = sync + 1 + 2 * group;
    if (atomicAdd(arrived + 1, 1) == members - 1) {  // the last to leave resets both counters
      atomicExch(arrived, 0);
      atomicExch(arrived + 1, 0);
    }
  }
}
// ---------------------------------------------------------------------------------------------
