// softmax / log_softmax over rows too long for one block (LOG = 0: softmax, 1: log_softmax) with
// ONE read of x from DRAM, by a persistent grid of SM x BPS blocks (all resident at once) split into
// TEAMS teams, as group_norm_resident does for norm groups. Team t walks rows t, t + TEAMS, ...; each
// of its blocks owns the same slice of every row (`slice` columns) and keeps it on chip between the
// statistics and the write, in one of BUFS buffers: REGS 16-byte vectors per thread in registers and
// SLOTS in dynamic shared memory (cp.async). Per row a block
//   1. folds each of its vectors into an online (max, sum of exp) as the vector lands,
//   2. publishes the block's (max, sum) to the workspace `ws` (one flagged 64-bit word) and waits for
//      the words of the row's other blocks,
//   3. merges the row's partials in a fixed order (bitwise reproducible),
//   4. writes each vector from chip (exp(x - max) / sum, or x - max - log(sum)) and at once starts
//      loading the same slot of the buffer's next row into it, so the next row's reads overlap this
//      row's writes.
// The difference to `split_sync`: the blocks stay (no block per chunk and row, no ticket), and a
// block's next row streams in while it writes this one. The grid must be resident at once (the launch
// spec sizes it to the GPU the search ran on). If a wait times out (a smaller GPU), the block
// computes that row's statistics from memory. Misaligned pointers or cols % VEC != 0 take the same
// schedule reading x twice element-wise. `ws` is a zero-filled workspace of one 64-bit word per block
// and row (its partial and flag).
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _softmax.cuh}}
//{{INCLUDE _resident.cuh}}

// The row's (max, sum): publish this block's partial (word `rank` of the team's `team` blocks at wr),
// then warp 0 waits for every word of the row and merges them in a fixed order. After a wait times
// out the block computes the row's statistics from memory instead.
__device__ __forceinline__ MaxSum team_row_stats(const T_X* __restrict__ xr, unsigned long long* __restrict__ wr,
                                                 int team, int rank, MaxSum part, int cols, float* red_m,
                                                 float* red_s, MaxSum* stat) {
  __shared__ int ok;
  if (threadIdx.x == 0) res_publish(wr + rank, part.m, part.s);
  if (threadIdx.x < 32) {
    int good = 1, polls = 0;  // res_await's budget, per lane
    MaxSum st{-FP_INF, 0.f};
    for (int p = threadIdx.x; p < team && good; p += 32) {
      unsigned long long w;
      if (!res_await(wr + p, polls, w)) { good = 0; break; }
      st = maxsum_merge(st, MaxSum{res_lo(w), res_hi(w)}, SmExp());
    }
    good = __all_sync(0xffffffffu, good);
    if (good) {
      st = group_maxsum<32>(st, SmExp());
      if (threadIdx.x == 0) *stat = st;
    }
    if (threadIdx.x == 0) ok = good;
  }
  __syncthreads();
  if (!ok) {
    MaxSum st{-FP_INF, 0.f};
    for (int c = threadIdx.x; c < cols; c += THREADS) {
      float xs[1] = {load1(xr + c)};
      sm_accumulate<1>(st, xs);
    }
    st = block_maxsum<THREADS>(st, red_m, red_s, SmExp());
    if (threadIdx.x == 0) *stat = st;
  }
  __syncthreads();
  return *stat;
}

template <int V>
FP_DEV void res_sm_fold(MaxSum& st, const Vec<T_X, V>& a) {
  float xs[V];
#pragma unroll
  for (int k = 0; k < V; ++k) xs[k] = a.get(k);
  sm_accumulate<V>(st, xs);
}

// out from x and the row's statistics: softmax exp(x - m) * inv (inv = 1 / sum), log_softmax
// x - m - log_sum. A row of -inf has m = -inf: exp(NaN) and NaN - log_sum give NaN, as PyTorch does.
template <int V>
FP_DEV void res_sm_write(const Vec<T_X, V>& a, T_OUT* __restrict__ orow, int e, float m, float inv, float log_sum) {
  Vec<T_OUT, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float v = a.get(k);
    o.set(k, LOG ? sm_finish_log(v, m, log_sum) : sm_exp(v - m) * inv);
  }
  o.template store<STORE_HINT>(orow + e);
}

// Row r from the buffer: statistics as the vectors land, the team's merge, then every vector written
// and at once refilled with row rn's (when rn < rows). The other buffer's SLOTS commit groups
// (BUFS = 2) were issued after this one's, so they may stay in flight.
template <int V>
FP_DEV void res_sm_step(Vec<T_X, V>* r, Vec<T_X, V>* sm, const T_X* __restrict__ x, T_OUT* __restrict__ out,
                        unsigned long long* __restrict__ ws, int row, int rn, int rows, int begin, int end, int cols,
                        int team, int rank, float* red_m, float* red_s, MaxSum* stat) {
  MaxSum st{-FP_INF, 0.f};
#pragma unroll
  for (int i = 0; i < REGS; ++i)
    if (RES_E(i) < end) res_sm_fold<V>(st, r[i]);
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    res_wait((BUFS - 1) * SLOTS + SLOTS - 1 - s);
    if (RES_E(REGS + s) < end) res_sm_fold<V>(st, sm[s * THREADS]);
  }
  st = block_maxsum<THREADS>(st, red_m, red_s, SmExp());
  const MaxSum rs = team_row_stats(x + (long long)row * cols, ws + (long long)row * team, team, rank, st, cols,
                                   red_m, red_s, stat);
  const float inv = __fdividef(1.f, rs.s), log_sum = logf(rs.s);
  T_OUT* orow = out + (long long)row * cols;
  const bool more = rn < rows;
  const T_X* xn = x + (long long)rn * cols;
#pragma unroll
  for (int i = 0; i < REGS; ++i) {
    if (RES_E(i) < end) {
      res_sm_write<V>(r[i], orow, RES_E(i), rs.m, inv, log_sum);
      if (more) r[i].template load<LOAD_HINT>(xn + RES_E(i));
    }
  }
#pragma unroll 2  // few vectors at a time: registers go to the next row's loads, not to these
  for (int s = 0; s < SLOTS; ++s) {
    if (RES_E(REGS + s) < end) {
      const Vec<T_X, V> a = sm[s * THREADS];
      res_sm_write<V>(a, orow, RES_E(REGS + s), rs.m, inv, log_sum);
      if (more) res_copy16(sm + s * THREADS, xn + RES_E(REGS + s));
    }
    res_commit();
  }
}

template <int V>
__device__ __forceinline__ void softmax_resident_staged(const T_X* __restrict__ x, T_OUT* __restrict__ out,
                                                        unsigned long long* __restrict__ ws, int cols, int slice,
                                                        int rows) {
  __shared__ float red_m[32], red_s[32];
  __shared__ MaxSum stat;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm >= TEAMS) return;
  const int begin = min(cols, rank * slice), end = min(cols, begin + slice);
  res_walk<V>(x, cols, rows, tm, begin, end, [&](Vec<T_X, V>* r, Vec<T_X, V>* sm, int row, int rn) {
    res_sm_step<V>(r, sm, x, out, ws, row, rn, rows, begin, end, cols, team, rank, red_m, red_s, &stat);
  });
}
#undef RES_E

// Misaligned pointers or cols % VEC != 0: the same teams and barriers, x read twice element-wise.
__device__ __forceinline__ void softmax_resident_streaming(const T_X* __restrict__ x, T_OUT* __restrict__ out,
                                                           unsigned long long* __restrict__ ws, int cols, int slice,
                                                           int rows) {
  __shared__ float red_m[32], red_s[32];
  __shared__ MaxSum stat;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm >= TEAMS) return;
  const int begin = min(cols, rank * slice), end = min(cols, begin + slice);
  for (int r = tm; r < rows; r += TEAMS) {
    const T_X* xr = x + (long long)r * cols;
    T_OUT* orow = out + (long long)r * cols;
    MaxSum st{-FP_INF, 0.f};
    for (int c = begin + (int)threadIdx.x; c < end; c += THREADS) {
      float xs[1] = {load1(xr + c)};
      sm_accumulate<1>(st, xs);
    }
    st = block_maxsum<THREADS>(st, red_m, red_s, SmExp());
    const MaxSum rs = team_row_stats(xr, ws + (long long)r * team, team, rank, st, cols, red_m, red_s, &stat);
    const float inv = __fdividef(1.f, rs.s), log_sum = logf(rs.s);
    for (int c = begin + (int)threadIdx.x; c < end; c += THREADS) {
      const float v = load1(xr + c);
      store1(orow + c, LOG ? sm_finish_log(v, rs.m, log_sum) : sm_exp(v - rs.m) * inv);
    }
  }
}

// BPS blocks per SM must be resident together: the register budget is set for that.
extern "C" __global__ void __launch_bounds__(THREADS, BPS)
softmax_resident(const T_X* __restrict__ x, T_OUT* __restrict__ out, unsigned long long* __restrict__ ws, int cols,
                 int slice, int rows) {
  if (cols % VEC == 0 && slice % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    softmax_resident_staged<VEC>(x, out, ws, cols, slice, rows);
  else
    softmax_resident_streaming(x, out, ws, cols, slice, rows);
}
