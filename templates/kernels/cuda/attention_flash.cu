// attention (CUDA, bf16/fp16): FlashAttention-2 style forward on tensor cores.
// A block owns BLOCK_M query rows of one (batch, head) and, with O_SPLIT > 1, one slice of DO output
// channels (each slice's block recomputes the logits: head_dim 512 keeps its accumulators in
// registers that way). Each of its WARPS warps owns 16 of those rows. K and V tiles of BLOCK_N keys
// stream through shared memory with cp.async (STAGES = 2: the next tile loads while this one is
// used). Per tile: S = Q K^T by mma.sync m16n8k16 (fp32 accumulate), scaled, soft-capped, masked
// (the additive mask read straight into the accumulator layout; causal and the key tail by index),
// an online softmax in fp32 (exp2 of the difference times log2(e); rows reduced over a quad's 4 lanes), then the
// probabilities, rounded to the input type, are the A operand of O += P V (fp32 accumulate; V's
// B fragments by ldmatrix.trans where LDMATRIX >= 1, else by 16-bit shared loads; Q's and K's
// fragments by ldmatrix where LDMATRIX is 2, else by 32-bit shared loads).
// Causal (top-left aligned: key j visible to row i when j <= i) stops at the block's last row and
// skips the tiles a warp cannot see; a sliding window W (causal, window > 0: key j also hidden from row i
// when j <= i - W) starts at the block's first row's first key. GQA: query head h reads key/value head h / G.
// A row with no live key writes 0 when MASKED_ZERO (SDPA), else NaN (softmax of an all -inf row).
//{{PARAMS}}
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define PAD 8                        // halves of padding per shared row: 16-byte aligned, no bank conflicts
#define LDQ (HEAD_DIM + PAD)         // shared row stride of Q and K tiles
#define DO (HEAD_DIM / O_SPLIT)      // output channels per block
#define LDV (DO + PAD)               // shared row stride of V tiles
#define THREADS (WARPS * 32)
#define NTILE (BLOCK_N / 8)          // 8-key column tiles of S per warp
#define OTILE (DO / 8)               // 8-channel column tiles of O per warp
#define KSTEPS (HEAD_DIM / 16)       // k-steps of Q K^T
#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000)  // no math.h under NVRTC

typedef unsigned short h16;          // one bf16 / fp16 element as raw bits

#if HAS_MASK
static __device__ __forceinline__ float h2f(h16 b) {
#if IS_BF16
  return __uint_as_float(((unsigned int)b) << 16);
#else
  return __half2float(__ushort_as_half(b));
#endif
}
#endif

static __device__ __forceinline__ unsigned int pack2(float lo, float hi) {
#if IS_BF16
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
#else
  __half2 v = __floats2half2_rn(lo, hi);
#endif
  return *reinterpret_cast<unsigned int*>(&v);
}

static __device__ __forceinline__ void mma16816(float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
#if IS_BF16
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Four 8x8 b16 tiles from shared memory, each transposed: r[i] of lane L holds rows 2(L%4), 2(L%4)+1
// of tile i at column L/4, which is an m16n8k16 B fragment of a row-major [k][n] tile.
#if LDMATRIX >= 2
// Four 8x8 b16 tiles from shared memory: r[i] of lane L holds row L/4, columns 2(L%4), 2(L%4)+1 of
// tile i (an m16n8k16 A fragment of a row-major tile, or a B fragment of a [n][k] one).
static __device__ __forceinline__ void ldsm_x4(unsigned int* r, const h16* row) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
#endif
#if LDMATRIX >= 1
static __device__ __forceinline__ void ldsm_x4_trans(unsigned int* r, const h16* row) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
#endif

// 16 bytes global -> shared, asynchronously; `valid` 0 writes zeros and reads nothing.
static __device__ __forceinline__ void cp16(void* smem, const void* gmem, bool valid) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// rows x cols (cols a multiple of 8) of a [.., rows, cols] slab with row stride `ld` -> shared, 16 B each
template <int COLS, int LDS>
static __device__ __forceinline__ void load_tile(h16* dst, const h16* src, long long ld, int rows, int valid_rows) {
  constexpr int CHUNKS = COLS / 8;
  for (int c = threadIdx.x; c < rows * CHUNKS; c += THREADS) {
    const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
    const bool ok = r < valid_rows;
    cp16(dst + r * LDS + col, ok ? src + r * ld + col : src, ok);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
attention_flash(const T_X* __restrict__ q, const T_K* __restrict__ k, const T_V* __restrict__ v,
                const T_MASK* __restrict__ mask, T_OUT* __restrict__ out, long long B, long long H, long long L,
                long long S, long long D, long long G, long long q_sb, long long q_sh, long long q_sl,
                long long k_sb, long long k_sh, long long k_sl, long long v_sb, long long v_sh, long long v_sl,
                long long o_sb, long long o_sh, long long o_sl, long long m_sb, long long m_sh, long long m_sl,
                long long causal, long long window, float scale, float softcap) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  h16* Qs = reinterpret_cast<h16*>(smem_raw);
  h16* Ks = Qs + BLOCK_M * LDQ;
  h16* Vs = Ks + STAGES * BLOCK_N * LDQ;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row group and column pair
  const long long b = blockIdx.z, h = blockIdx.y / O_SPLIT;
  const int dsl = (int)(blockIdx.y % O_SPLIT) * DO;  // first output channel of this block
  const long long hk = h / G;
  const long long m0 = (long long)blockIdx.x * BLOCK_M;
  const int rows_here = (int)((L - m0) < BLOCK_M ? (L - m0) : BLOCK_M);

  const h16* qg = reinterpret_cast<const h16*>(q) + b * q_sb + h * q_sh + m0 * q_sl;
  const h16* kg = reinterpret_cast<const h16*>(k) + b * k_sb + hk * k_sh;
  const h16* vg = reinterpret_cast<const h16*>(v) + b * v_sb + hk * v_sh + dsl;

  // keys past the block's last row are invisible to all of it under causal; with a window, so are the
  // keys before its first row's window: the block runs tiles first_tile .. last_tile - 1
  const bool windowed = WINDOWED && causal && window > 0;  // WINDOWED 0: none of the window's code is compiled
  const long long kv_end = causal ? ((m0 + rows_here) < S ? (m0 + rows_here) : S) : S;
  const long long kv_begin = (windowed && m0 - window + 1 > 0) ? m0 - window + 1 : 0;
  const int first_tile = (int)(kv_begin / BLOCK_N);
  const int last_tile = (int)((kv_end + BLOCK_N - 1) / BLOCK_N);
  const int ntiles = last_tile > first_tile ? last_tile - first_tile : 0;

  load_tile<HEAD_DIM, LDQ>(Qs, qg, q_sl, BLOCK_M, rows_here);
  cp_commit();
  if (ntiles > 0) {
    const long long n1 = (long long)first_tile * BLOCK_N;
    const int valid = (int)((S - n1) < BLOCK_N ? (S - n1) : BLOCK_N);
    load_tile<HEAD_DIM, LDQ>(Ks, kg + n1 * k_sl, k_sl, BLOCK_N, valid);
    load_tile<DO, LDV>(Vs, vg + n1 * v_sl, v_sl, BLOCK_N, valid);
  }
  cp_commit();

  const int wr = warp * 16;                 // the warp's first row in the block
  const long long row0 = m0 + wr + g;       // this thread's two rows: row0 and row0 + 8
  float o[OTILE][4];
#pragma unroll
  for (int i = 0; i < OTILE; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float mrow[2] = {NEG_INF, NEG_INF};   // running max of each row
  float lrow[2] = {0.0f, 0.0f};             // this thread's share of the running sum

  for (int n = 0; n < ntiles; ++n) {
    const int st = STAGES > 1 ? (n & 1) : 0;
    if (STAGES > 1 && n + 1 < ntiles) {     // the next tile loads while this one is used
      const long long n1 = (long long)(first_tile + n + 1) * BLOCK_N;
      const int valid = (int)((S - n1) < BLOCK_N ? (S - n1) : BLOCK_N);
      load_tile<HEAD_DIM, LDQ>(Ks + (st ^ 1) * BLOCK_N * LDQ, kg + n1 * k_sl, k_sl, BLOCK_N, valid);
      load_tile<DO, LDV>(Vs + (st ^ 1) * BLOCK_N * LDV, vg + n1 * v_sl, v_sl, BLOCK_N, valid);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const long long n0 = (long long)(first_tile + n) * BLOCK_N;
    const h16* Kt = Ks + st * BLOCK_N * LDQ;
    const h16* Vt = Vs + st * BLOCK_N * LDV;
    // a warp whose rows all precede the tile sees none of it (causal), nor one past the last row, nor one
    // whose keys all precede its first row's window
    const bool skip = (causal && n0 > m0 + wr + 15) || wr >= rows_here ||
                      (windowed && n0 + BLOCK_N <= m0 + wr - window + 1);
    if (!skip) {
      float s[NTILE][4];
#pragma unroll
      for (int i = 0; i < NTILE; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        unsigned int a[4];
#if LDMATRIX >= 2
        // Q rows 0-7 / 8-15 of the warp by columns 0-7 / 8-15 of the k-step: tile L/8 is rows
        // (L/8 & 1) * 8 + L%8, columns (L/8 >> 1) * 8
        ldsm_x4(a, Qs + (wr + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDQ + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int nt = 0; nt < NTILE; nt += 2) {
          // keys of column tiles nt and nt+1 by d 0-7 / 8-15: tile L/8 is keys (nt + (L/8 >> 1)) * 8 + L%8,
          // d (L/8 & 1) * 8
          unsigned int bk[4];
          ldsm_x4(bk, Kt + ((nt + (lane >> 4)) * 8 + (lane & 7)) * LDQ + ks * 16 + ((lane >> 3) & 1) * 8);
          mma16816(s[nt], a, bk[0], bk[1]);
          mma16816(s[nt + 1], a, bk[2], bk[3]);
        }
#else
        const h16* qa = Qs + (wr + g) * LDQ + ks * 16 + t * 2;
        a[0] = *reinterpret_cast<const unsigned int*>(qa);
        a[1] = *reinterpret_cast<const unsigned int*>(qa + 8 * LDQ);
        a[2] = *reinterpret_cast<const unsigned int*>(qa + 8);
        a[3] = *reinterpret_cast<const unsigned int*>(qa + 8 * LDQ + 8);
#pragma unroll
        for (int nt = 0; nt < NTILE; ++nt) {
          const h16* kb = Kt + (nt * 8 + g) * LDQ + ks * 16 + t * 2;
          mma16816(s[nt], a, *reinterpret_cast<const unsigned int*>(kb), *reinterpret_cast<const unsigned int*>(kb + 8));
        }
#endif
      }
      // logits, masked, in natural units (a finfo.min mask times log2(e) would overflow to -inf and
      // turn HF's uniform fully-masked rows into empty ones); the max of each of the thread's rows
      float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
      for (int nt = 0; nt < NTILE; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const long long row = row0 + (e >= 2 ? 8 : 0);
          const long long col = n0 + nt * 8 + t * 2 + (e & 1);
          float x = s[nt][e] * scale;
          if (softcap > 0.0f) x = tanhf(x / softcap) * softcap;
#if HAS_MASK
          if (col < S && row < L) x += h2f(__ldg(reinterpret_cast<const h16*>(mask) + b * m_sb + h * m_sh + row * m_sl + col));
#endif
          if (col >= S || (causal && (col > row || (windowed && row - col >= window)))) x = NEG_INF;
          s[nt][e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(mrow[r], mx[r]);
        const float m_use = m_new == NEG_INF ? 0.0f : m_new;  // all -inf so far: every p is 0
        alpha[r] = exp2f((mrow[r] - m_use) * LOG2E);
        mrow[r] = m_new;
        lrow[r] *= alpha[r];
      }
#pragma unroll
      for (int nt = 0; nt < NTILE; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float m_use = mrow[e >> 1] == NEG_INF ? 0.0f : mrow[e >> 1];
          const float p = exp2f((s[nt][e] - m_use) * LOG2E);
          s[nt][e] = p;
          lrow[e >> 1] += p;
        }
      }
#pragma unroll
      for (int ot = 0; ot < OTILE; ++ot) {
        o[ot][0] *= alpha[0]; o[ot][1] *= alpha[0];
        o[ot][2] *= alpha[1]; o[ot][3] *= alpha[1];
      }
      // O += P V: the S accumulator layout of two column tiles is the A operand layout of one k-step
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        unsigned int a[4];
        a[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#if LDMATRIX >= 1
        // four 8x8 tiles of V transposed by ldmatrix: keys 0-7 and 8-15 of this k-step for channel
        // tiles ot and ot+1; lane L gives the address of row L%8 of tile L/8
        const int mi = lane / 8;
        const h16* vrow = Vt + (kk * 16 + (mi & 1) * 8 + lane % 8) * LDV + (mi >> 1) * 8;
#pragma unroll
        for (int ot = 0; ot < OTILE; ot += 2) {
          unsigned int bv[4];
          ldsm_x4_trans(bv, vrow + ot * 8);
          mma16816(o[ot], a, bv[0], bv[1]);
          mma16816(o[ot + 1], a, bv[2], bv[3]);
        }
#else
        const h16* vb = Vt + (kk * 16 + t * 2) * LDV + g;
#pragma unroll
        for (int ot = 0; ot < OTILE; ++ot) {
          const h16* p0 = vb + ot * 8;
          const unsigned int b0 = (unsigned int)p0[0] | ((unsigned int)p0[LDV] << 16);
          const unsigned int b1 = (unsigned int)p0[8 * LDV] | ((unsigned int)p0[9 * LDV] << 16);
          mma16816(o[ot], a, b0, b1);
        }
#endif
      }
    }
    __syncthreads();  // every warp is done with this stage before a later iteration refills it
    if (STAGES == 1 && n + 1 < ntiles) {
      const long long n1 = (long long)(first_tile + n + 1) * BLOCK_N;
      const int valid = (int)((S - n1) < BLOCK_N ? (S - n1) : BLOCK_N);
      load_tile<HEAD_DIM, LDQ>(Ks, kg + n1 * k_sl, k_sl, BLOCK_N, valid);
      load_tile<DO, LDV>(Vs, vg + n1 * v_sl, v_sl, BLOCK_N, valid);
      cp_commit();
    }
  }
  if (ntiles == 0) cp_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const long long row = row0 + r * 8;
    if (row >= L) continue;
    const float l = lrow[r];
    const bool live = l > 0.0f || l != l;  // a NaN sum (a NaN logit) stays NaN, as in PyTorch
    const float inv = live ? 1.0f / l : (MASKED_ZERO ? 0.0f : __int_as_float(0x7fffffff));
    h16* orow = reinterpret_cast<h16*>(out) + b * o_sb + h * o_sh + row * o_sl + dsl + t * 2;
#pragma unroll
    for (int ot = 0; ot < OTILE; ++ot) {
      const float x0 = live ? o[ot][r * 2] * inv : inv, x1 = live ? o[ot][r * 2 + 1] * inv : inv;
      *reinterpret_cast<unsigned int*>(orow + ot * 8) = pack2(x0, x1);
    }
  }
}
