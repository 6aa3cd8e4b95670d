// Standalone probe: how fast can adaptive_avg_pool2d to (1,1) read a bf16 (256,2048,7,7) NCHW
// tensor on this GPU, timed with the evaluator's protocol (zero-write a buffer twice the L2 size,
// event, kernel, event; median of REPS)? Times a read-only ceiling (each thread sums 16-byte
// vectors, one float per block written) next to pooling designs: the shipped nchw_tile (register
// loads staged in shared memory), the same tile fed by cp.async, by one cp.async.bulk per block,
// a register-only design with shared-memory float atomics, and persistent warps each streaming
// 32-plane tiles through their own cp.async ring. Every pooling variant is checked
// against a one-thread-per-plane reference. A few rows are repeated with a flush that reads the
// buffer instead of zero-writing it, which leaves L2 clean instead of full of dirty lines, and the
// read-only ceiling is repeated with each load cache operator and L2 eviction policy.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o pool_probe bench/pool_probe.cu && ./pool_probe > out.md
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

typedef __nv_bfloat16 bf16;
static const long long PLANES_N = 256LL * 2048, HW = 49, NEL = PLANES_N * HW, NVEC = NEL / 8;

__device__ __forceinline__ float sum8(uint4 v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    s += f.x + f.y;
  }
  return s;
}

template <int T> __device__ __forceinline__ float block_sum(float v) {
  __shared__ float red[32];
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (T > 32) {
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < T / 32 ? red[threadIdx.x] : 0.f;
    if (threadIdx.x < 32)
      for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

// ---- read-only ceiling: block b reads vectors [b*T*U, (b+1)*T*U) ---------------------------------
template <int T, int U> __global__ void __launch_bounds__(T) read_flat(const uint4* __restrict__ x, float* sink, long long nvec) {
  const long long base = (long long)blockIdx.x * T * U + threadIdx.x;
  uint4 a[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = base + (long long)u * T;
    a[u] = i < nvec ? __ldcs(x + i) : make_uint4(0, 0, 0, 0);
  }
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < U; ++u) s += sum8(a[u]);
  s = block_sum<T>(s);
  if (threadIdx.x == 0) sink[blockIdx.x] = s;
}

// ---- read-only ceiling, persistent grid-stride ----------------------------------------------------
template <int T, int U> __global__ void __launch_bounds__(T) read_persist(const uint4* __restrict__ x, float* sink, long long nvec) {
  float s = 0.f;
  for (long long base = (long long)blockIdx.x * T * U + threadIdx.x; base < nvec; base += (long long)gridDim.x * T * U) {
    uint4 a[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = base + (long long)u * T;
      a[u] = i < nvec ? __ldcs(x + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) s += sum8(a[u]);
  }
  s = block_sum<T>(s);
  if (threadIdx.x == 0) sink[blockIdx.x] = s;
}

// ---- read-only ceiling with each load cache operator / L2 eviction policy: can a reading kernel avoid
// evicting the flush's dirty lines (and paying their write-back)? MODE: 0 ld.global (.ca), 1 .cg,
// 2 .cs, 3 .lu, 4 .nc.L1::no_allocate, 5 L2::cache_hint evict_first, 6 L2::cache_hint evict_last,
// 7 L2::cache_hint evict_unchanged, 8 .nc.L2::256B prefetch
template <int MODE> __device__ __forceinline__ uint4 ld_hint(const uint4* p, unsigned long long pol) {
  uint4 v;
#define LDV(OP)                                                                                  \
  asm volatile(OP " {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p))
#define LDP(OP)                                                                                          \
  asm volatile(OP " {%0,%1,%2,%3}, [%4], %5;" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol))
  if (MODE == 0) LDV("ld.global.v4.u32");
  else if (MODE == 1) LDV("ld.global.cg.v4.u32");
  else if (MODE == 2) LDV("ld.global.cs.v4.u32");
  else if (MODE == 3) LDV("ld.global.lu.v4.u32");
  else if (MODE == 4) LDV("ld.global.nc.L1::no_allocate.v4.u32");
  else if (MODE == 8) LDV("ld.global.nc.L2::256B.v4.u32");
  else LDP("ld.global.L2::cache_hint.v4.u32");
#undef LDV
#undef LDP
  return v;
}
template <int MODE> __device__ __forceinline__ unsigned long long make_policy() {
  unsigned long long pol = 0;
  if (MODE == 5) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  if (MODE == 6) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  if (MODE == 7) asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
template <int T, int U, int MODE> __global__ void __launch_bounds__(T) read_hint(const uint4* __restrict__ x, float* sink, long long nvec) {
  const unsigned long long pol = make_policy<MODE>();
  const long long base = (long long)blockIdx.x * T * U + threadIdx.x;
  uint4 a[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = base + (long long)u * T;
    a[u] = i < nvec ? ld_hint<MODE>(x + i, pol) : make_uint4(0, 0, 0, 0);
  }
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < U; ++u) s += sum8(a[u]);
  s = block_sum<T>(s);
  if (threadIdx.x == 0) sink[blockIdx.x] = s;
}

// ---- the pooling reduction from a staged tile (P planes of HW bf16 in shared memory) ---------------
template <int T, int P> __device__ __forceinline__ void reduce_tile(const bf16* tile, bf16* out, long long p0, int np) {
  constexpr int TPP = T / P;
  const int p = threadIdx.x / TPP, l = threadIdx.x % TPP;
  float acc = 0.f;
  if (p < np)
    for (int i = l; i < HW; i += TPP) acc += __bfloat162float(tile[p * HW + i]);
#pragma unroll
  for (int o = TPP / 2; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (l == 0 && p < np) out[p0 + p] = __float2bfloat16(acc * (1.f / HW));
}

// one batch of U coalesced 16-byte loads per thread (vector base + u*T + thread), all in flight
template <int T, int U, int NV> __device__ __forceinline__ void load_batch(const uint4* xt, int base, uint4 (&a)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = base + u * T + threadIdx.x;
    if (i < NV) a[u] = __ldcs(xt + i);
  }
}

// shipped design: U register loads per thread, raw bits to shared memory
template <int T, int P, int U> __global__ void __launch_bounds__(T) tile_ld(const bf16* __restrict__ x, bf16* __restrict__ out) {
  __shared__ uint4 tile[P * HW / 8];
  const long long p0 = (long long)blockIdx.x * P;
  const uint4* xt = reinterpret_cast<const uint4*>(x + p0 * HW);
  constexpr int NV = P * HW / 8;
  for (int base = 0; base < NV; base += T * U) {
    uint4 a[U];
    load_batch<T, U, NV>(xt, base, a);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * T + threadIdx.x;
      if (i < NV) tile[i] = a[u];
    }
  }
  __syncthreads();
  reduce_tile<T, P>(reinterpret_cast<const bf16*>(tile), out, p0, P);
}

// the tile fed by cp.async (16 bytes, L2 only): no registers held while loads are in flight
template <int T, int P> __global__ void __launch_bounds__(T) tile_cp(const bf16* __restrict__ x, bf16* __restrict__ out) {
  __shared__ __align__(16) uint4 tile[P * HW / 8];
  const long long p0 = (long long)blockIdx.x * P;
  const uint4* xt = reinterpret_cast<const uint4*>(x + p0 * HW);
  constexpr int NV = P * HW / 8;
  for (int i = threadIdx.x; i < NV; i += T) {
    unsigned s = (unsigned)__cvta_generic_to_shared(tile + i);
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(xt + i));
  }
  asm volatile("cp.async.wait_all;\n" ::);
  __syncthreads();
  reduce_tile<T, P>(reinterpret_cast<const bf16*>(tile), out, p0, P);
}

// the tile fed by one bulk copy (the TMA engine) per block, completion on an mbarrier
template <int T, int P> __global__ void __launch_bounds__(T) tile_bulk(const bf16* __restrict__ x, bf16* __restrict__ out) {
  __shared__ __align__(128) uint4 tile[P * HW / 8];
  __shared__ __align__(8) unsigned long long bar;
  const long long p0 = (long long)blockIdx.x * P;
  constexpr unsigned BYTES = P * HW * 2;
  const unsigned sb = (unsigned)__cvta_generic_to_shared(&bar), st = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(sb));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sb), "r"(BYTES));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(st),
                 "l"(x + p0 * HW), "r"(BYTES), "r"(sb)
                 : "memory");
  }
  __syncthreads();
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(done)
                 : "r"(sb)
                 : "memory");
  reduce_tile<T, P>(reinterpret_cast<const bf16*>(tile), out, p0, P);
}

// persistent warps, each with its own STAGES-deep ring of 32-plane tiles fed by cp.async: no block
// barrier, and the next tiles stream in while the warp sums the current one (lane l sums plane l;
// plane l starts at byte 98 l, so the 32 lanes' 2-byte reads fall in distinct banks or share a word)
__device__ __forceinline__ void cp16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem)
               : "memory");
}
template <int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32) warp_pipe(const bf16* __restrict__ x, bf16* __restrict__ out, int ntiles) {
  extern __shared__ __align__(16) uint4 ring_smem[];
  constexpr int TV = 32 * HW / 8;  // 16-byte vectors per 32-plane tile (196)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4* ring = ring_smem + warp * STAGES * TV;
  const int gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int st = 0; st < STAGES; ++st) {
    const int t = gw + st * nw;
    if (t < ntiles)
      for (int i = lane; i < TV; i += 32) cp16(ring + st * TV + i, xv + (long long)t * TV + i);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  int st = 0;
  for (int t = gw; t < ntiles; t += nw) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
    __syncwarp();
    const bf16* tile = reinterpret_cast<const bf16*>(ring + st * TV);
    float acc = 0.f;
#pragma unroll 7
    for (int i = 0; i < HW; ++i) acc += __bfloat162float(tile[lane * HW + i]);
    out[(long long)t * 32 + lane] = __float2bfloat16(acc * (1.f / HW));
    __syncwarp();  // every lane has read this stage before it is refilled
    const int tn = t + STAGES * nw;
    if (tn < ntiles)
      for (int i = lane; i < TV; i += 32) cp16(ring + st * TV + i, xv + (long long)tn * TV + i);
    asm volatile("cp.async.commit_group;\n" ::: "memory");  // empty groups keep the count uniform
    st = st + 1 == STAGES ? 0 : st + 1;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// register-only: each vector's (at most two) plane partials go to shared float accumulators
template <int T, int P, int U> __global__ void __launch_bounds__(T) tile_atomic(const bf16* __restrict__ x, bf16* __restrict__ out) {
  __shared__ float acc[P];
  for (int i = threadIdx.x; i < P; i += T) acc[i] = 0.f;
  __syncthreads();
  const long long p0 = (long long)blockIdx.x * P;
  const uint4* xt = reinterpret_cast<const uint4*>(x + p0 * HW);
  constexpr int NV = P * HW / 8;
  for (int base = 0; base < NV; base += T * U) {
    uint4 a[U];
    load_batch<T, U, NV>(xt, base, a);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * T + threadIdx.x;
      if (i < NV) {
        const int e = i * 8, pa = e / HW, cut = (pa + 1) * HW - e;  // elements [0, cut) belong to pa
        const bf16* h = reinterpret_cast<const bf16*>(&a[u]);
        float sa = 0.f, sb = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float f = __bfloat162float(h[k]);
          if (k < cut) sa += f; else sb += f;
        }
        atomicAdd(&acc[pa], sa);
        if (cut < 8) atomicAdd(&acc[pa + 1], sb);
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += T) out[p0 + i] = __float2bfloat16(acc[i] * (1.f / HW));
}

__global__ void ref_pool(const bf16* x, float* ref, long long planes) {
  const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= planes) return;
  float s = 0.f;
  for (int i = 0; i < HW; ++i) s += __bfloat162float(x[p * HW + i]);
  ref[p] = s / HW;
}

__global__ void fill(bf16* x, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)(i * 2654435761ull) ^ (unsigned)(i >> 13);
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    x[i] = __float2bfloat16(((h & 0xffff) / 65536.f) * 4.f - 2.f);
  }
}
__global__ void empty_kernel() {}

int main() {
  int dev = 0, l2 = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  bf16 *x, *out;
  float *sink, *ref;
  void* flush;
  const size_t flush_bytes = 2 * (size_t)l2;
  CK(cudaMalloc(&x, NEL * 2));
  CK(cudaMalloc(&out, PLANES_N * 2));
  CK(cudaMalloc(&ref, PLANES_N * 4));
  CK(cudaMalloc(&sink, 1 << 24));
  CK(cudaMalloc(&flush, flush_bytes));
  fill<<<4096, 256>>>(x, NEL);
  ref_pool<<<(PLANES_N + 255) / 256, 256>>>(x, ref, PLANES_N);
  CK(cudaDeviceSynchronize());
  std::vector<float> href(PLANES_N);
  CK(cudaMemcpy(href.data(), ref, PLANES_N * 4, cudaMemcpyDeviceToHost));

  const int REPS = 60;
  cudaEvent_t s[REPS], e[REPS];
  for (int i = 0; i < REPS; ++i) {
    CK(cudaEventCreate(&s[i]));
    CK(cudaEventCreate(&e[i]));
  }
  const double bytes = NEL * 2.0 + PLANES_N * 2.0;
  // copy bandwidth, as the evaluator measures its floor: a 1 GiB device-to-device copy
  double copy_gbs = 0;
  {
    void *a, *b;
    const size_t n = 1ull << 30;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    std::vector<float> t;
    for (int i = 0; i < 10; ++i) {
      CK(cudaEventRecord(s[i]));
      CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(e[i]));
    }
    CK(cudaDeviceSynchronize());
    for (int i = 2; i < 10; ++i) {
      float ms;
      CK(cudaEventElapsedTime(&ms, s[i], e[i]));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    copy_gbs = 2.0 * n / (t[t.size() / 2] * 1e-3) / 1e9;
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  int rt = 0, drv = 0;
  CK(cudaRuntimeGetVersion(&rt));
  CK(cudaDriverGetVersion(&drv));
  printf("# avgpool read probe on %s (%d SMs, L2 %d MB, CUDA runtime %d, driver %d)\n\n", prop.name, sms, l2 >> 20, rt, drv);
  printf("`nvcc -O3 -std=c++17 -arch=sm_90 -o pool_probe bench/pool_probe.cu && ./pool_probe`; input bf16 (256,2048,7,7) "
         "= %.1f MB; copy bandwidth (1 GiB cudaMemcpy D2D, read + write) %.0f GB/s; floor %.2f us; protocol: "
         "memset a %d MB buffer, event, kernel, event (rows marked clean L2 read that buffer instead); %d calls each\n\n",
         NEL * 2 / 1e6, copy_gbs, bytes / copy_gbs / 1e3, (int)(flush_bytes >> 20), REPS);
  printf("| kernel | grid x block | us (median) | us (min) | %% of copy BW | max err |\n|---|---|---|---|---|---|\n");

  // flush: the evaluator's zero-write (L2 left full of dirty lines that the kernel's reads evict to
  // DRAM), or a read of the same buffer (L2 left clean): the difference is the write-back cost
  bool clean_flush = false;
  auto do_flush = [&] {
    if (clean_flush)
      read_persist<256, 4><<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(flush), sink + (1 << 20), flush_bytes / 16);
    else
      CK(cudaMemsetAsync(flush, 0, flush_bytes));
  };
  auto timeit = [&](const std::string& name, int grid, int block, std::function<void()> k, bool check) {
    for (int i = 0; i < 3; ++i) {
      do_flush();
      k();
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < REPS; ++i) {
      do_flush();
      CK(cudaEventRecord(s[i]));
      k();
      CK(cudaEventRecord(e[i]));
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < REPS; ++i) {
      float ms;
      CK(cudaEventElapsedTime(&ms, s[i], e[i]));
      t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    double err = -1;
    if (check) {
      std::vector<bf16> h(PLANES_N);
      CK(cudaMemcpy(h.data(), out, PLANES_N * 2, cudaMemcpyDeviceToHost));
      err = 0;
      for (long long i = 0; i < PLANES_N; ++i) err = std::max(err, (double)fabsf(__bfloat162float(h[i]) - href[i]));
      CK(cudaMemset(out, 0xff, PLANES_N * 2));
    }
    const double med = t[REPS / 2];
    printf("| %s%s | %d x %d | %.2f | %.2f | %.0f%% | %s |\n", name.c_str(), clean_flush ? " (clean L2)" : "", grid, block, med, t[0],
           100.0 * bytes / copy_gbs / 1e3 / med, check ? std::to_string(err).c_str() : "-");
    fflush(stdout);
  };
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  timeit("empty kernel", 1, 32, [&] { empty_kernel<<<1, 32>>>(); }, false);
#define FLAT(T, U)                                                                                  \
  {                                                                                                 \
    int g = (int)((NVEC + T * U - 1) / (T * U));                                                    \
    timeit("read_flat T=" #T " U=" #U, g, T, [&] { read_flat<T, U><<<g, T>>>(xv, sink, NVEC); }, false); \
  }
  FLAT(32, 8) FLAT(128, 4) FLAT(256, 4) FLAT(256, 8) FLAT(512, 4) FLAT(512, 8) FLAT(1024, 4) FLAT(64, 8) FLAT(128, 8) FLAT(256, 16)
#define HINT(T, U, M, NAME)                                                                                        \
  {                                                                                                           \
    int g = (int)((NVEC + T * U - 1) / (T * U));                                                              \
    timeit("read_hint " NAME " T=" #T " U=" #U, g, T, [&] { read_hint<T, U, M><<<g, T>>>(xv, sink, NVEC); }, false); \
  }
  HINT(1024, 4, 0, "ld.ca") HINT(1024, 4, 1, "ld.cg") HINT(1024, 4, 2, "ld.cs") HINT(1024, 4, 3, "ld.lu")
  HINT(1024, 4, 4, "nc.no_allocate") HINT(1024, 4, 5, "L2 evict_first") HINT(1024, 4, 6, "L2 evict_last")
  HINT(1024, 4, 7, "L2 evict_unchanged") HINT(1024, 4, 8, "nc.L2::256B") HINT(256, 4, 5, "L2 evict_first")
#define PERS(T, U, K)                                                                                        \
  {                                                                                                          \
    int g = sms * K;                                                                                         \
    timeit("read_persist T=" #T " U=" #U, g, T, [&] { read_persist<T, U><<<g, T>>>(xv, sink, NVEC); }, false); \
  }
  PERS(256, 4, 8) PERS(512, 4, 4) PERS(1024, 4, 2) PERS(256, 8, 8) PERS(512, 8, 4) PERS(1024, 2, 2)
#define TLD(T, P, U) \
  timeit("tile_ld T=" #T " P=" #P " U=" #U, PLANES_N / P, T, [&] { tile_ld<T, P, U><<<PLANES_N / P, T>>>(x, out); }, true);
  TLD(128, 64, 4) TLD(64, 32, 4) TLD(32, 32, 8) TLD(256, 128, 4) TLD(128, 128, 8)
#define TCP(T, P) timeit("tile_cp T=" #T " P=" #P, PLANES_N / P, T, [&] { tile_cp<T, P><<<PLANES_N / P, T>>>(x, out); }, true);
  TCP(32, 32) TCP(64, 32) TCP(128, 64) TCP(256, 128) TCP(128, 128) TCP(256, 256)
#define TBK(T, P) timeit("tile_bulk T=" #T " P=" #P, PLANES_N / P, T, [&] { tile_bulk<T, P><<<PLANES_N / P, T>>>(x, out); }, true);
  TBK(32, 32) TBK(64, 64) TBK(128, 64) TBK(128, 128) TBK(256, 256) TBK(64, 32)
#define TAT(T, P, U) \
  timeit("tile_atomic T=" #T " P=" #P " U=" #U, PLANES_N / P, T, [&] { tile_atomic<T, P, U><<<PLANES_N / P, T>>>(x, out); }, true);
  TAT(128, 64, 4) TAT(256, 128, 4) TAT(128, 128, 8) TAT(256, 256, 8)
#define WPIPE(W, S)                                                                                          \
  {                                                                                                          \
    const int smem = W * S * 32 * (int)HW * 2, ntiles = (int)(PLANES_N / 32);                                \
    CK(cudaFuncSetAttribute(warp_pipe<W, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));             \
    int per_sm = 0;                                                                                          \
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, warp_pipe<W, S>, W * 32, smem));               \
    const int g = sms * per_sm;                                                                              \
    timeit("warp_pipe warps=" #W " stages=" #S, g, W * 32,                                                   \
           [&] { warp_pipe<W, S><<<g, W * 32, smem>>>(x, out, ntiles); }, true);                              \
  }
  WPIPE(4, 2) WPIPE(8, 2) WPIPE(8, 3) WPIPE(16, 2) WPIPE(4, 4)
  clean_flush = true;
  timeit("empty kernel", 1, 32, [&] { empty_kernel<<<1, 32>>>(); }, false);
  FLAT(256, 8) FLAT(1024, 4) HINT(1024, 4, 5, "L2 evict_first") TLD(128, 64, 4) TCP(128, 64) TBK(64, 64)
  clean_flush = false;
  timeit("empty kernel (after)", 1, 32, [&] { empty_kernel<<<1, 32>>>(); }, false);
  return 0;
}
