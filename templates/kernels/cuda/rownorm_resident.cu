// layer_norm (RMS = 0) / rms_norm (RMS = 1) over rows too long for a block, with ONE read of x from DRAM: the
// persistent grid of group_norm_resident and softmax_resident (SM x BPS blocks, all resident at once, in TEAMS
// teams; team t walks rows t, t + TEAMS, ...; each of its blocks keeps the same slice of every row on chip in
// REGS register vectors and SLOTS shared-memory vectors per thread, BUFS buffers). Per row a block
//   1. folds each of its vectors as it lands: layer_norm the moments of x minus the row's first value (a shift
//      every block of the row shares, so the partials merge exactly by Chan's formula), rms_norm the sum of
//      squares,
//   2. publishes them as one flagged 64-bit word (mean and m2, or 0 and the sum of squares) to the workspace `ws`
//      and waits for the words of the row's other blocks, merged in a fixed order (bitwise reproducible),
//   3. writes each vector normalised(+affine) from chip, weight and bias read per column, and at once starts
//      loading the same slot of the next row into it.
// If a wait times out (a GPU smaller than the grid) the block computes the row's statistics from memory.
// Misaligned pointers or cols % VEC != 0 take the same schedule reading x twice element-wise. `ws` is a
// zero-filled workspace of one 64-bit word per block and row.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _rownorm.cuh}}
//{{INCLUDE _resident.cuh}}

// The row's (mean, rstd) from this block's partial `part` (its sum of squares in part.m2 for rms_norm): publish
// it as word `rank` of the team's `team` at wr, then warp 0 merges every word of the row in a fixed order.
__device__ __forceinline__ float2 team_row_norm(const T_X* __restrict__ xr, unsigned long long* __restrict__ wr,
                                                int team, int rank, Moments part, float shift, int cols, int slice,
                                                float eps, float* red, float2* stat) {
  __shared__ int ok;
  if (threadIdx.x == 0) res_publish(wr + rank, RMS ? 0.f : part.mean, part.m2);
  if (threadIdx.x < 32) {
    int good = 1, polls = 0;  // res_await's budget, per lane
    Moments st{0.f, 0.f, 0.f};
    float sq = 0.f;
    for (int p = threadIdx.x; p < team && good; p += 32) {
      unsigned long long w;
      if (!res_await(wr + p, polls, w)) { good = 0; break; }
      const float n = (float)(min(cols, (p + 1) * slice) - min(cols, p * slice));
      if (RMS) sq += res_hi(w);
      else st = moments_merge(st, Moments{n, res_lo(w), res_hi(w)});
    }
    good = __all_sync(0xffffffffu, good);
    if (good) {
      if (RMS) {
        sq = group_sum<32>(sq);
        if (threadIdx.x == 0) *stat = make_float2(0.f, rsqrtf(__fdividef(sq, (float)cols) + eps));
      } else {
        st = group_moments<32>(st);
        if (threadIdx.x == 0) *stat = make_float2(shift + st.mean, rsqrtf(__fdividef(st.m2, (float)cols) + eps));
      }
    }
    if (threadIdx.x == 0) ok = good;
  }
  __syncthreads();
  if (!ok) {  // the whole row from memory, element-wise
    Moments st{0.f, 0.f, 0.f};
    float sq = 0.f;
    for (int c = threadIdx.x; c < cols; c += THREADS) {
      float v[1] = {load1(xr + c) - shift};
      sq += v[0] * v[0];
      if (!RMS) st = moments_merge(st, moments_of<1>(v, 1));
    }
    if (RMS) {
      sq = block_sum<THREADS>(sq, red);
      if (threadIdx.x == 0) *stat = make_float2(0.f, rsqrtf(__fdividef(sq, (float)cols) + eps));
    } else {
      st = block_moments<THREADS>(st, red);
      if (threadIdx.x == 0) *stat = make_float2(shift + st.mean, rsqrtf(__fdividef(st.m2, (float)cols) + eps));
    }
  }
  __syncthreads();
  return *stat;
}

// Fold V values of x into the block's partial: moments of x - shift (layer_norm), the sum of squares in m2
// (rms_norm, no shift).
template <int V>
FP_DEV Moments res_rn_fold(Moments st, const Vec<T_X, V>& a, float shift) {
  float v[V];
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = a.get(k) - shift;
  if (RMS) {
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) sq += v[k] * v[k];
    return Moments{0.f, 0.f, st.m2 + sq};
  }
  return moments_merge(st, moments_of<V>(v, V));
}

template <int V>
FP_DEV void res_rn_write(const Vec<T_X, V>& a, T_OUT* __restrict__ orow, WEIGHT_PARAM BIAS_PARAM int e,
                         float2 mr OFFSET_PARAM) {
  float xs[V];
#pragma unroll
  for (int k = 0; k < V; ++k) xs[k] = a.get(k);
  rn_store<V>(orow + e, WEIGHT_ARG BIAS_ARG e, xs, mr.x, mr.y OFFSET_ARG);
}

// Row r from the buffer: the partial as the vectors land, the team's merge, then every vector written and at
// once refilled with row rn's (when rn < rows).
template <int V>
FP_DEV void res_rn_step(Vec<T_X, V>* r, Vec<T_X, V>* sm, const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                        T_OUT* __restrict__ out, unsigned long long* __restrict__ ws, int row, int rn, int rows,
                        int begin, int end, int cols, int slice, int team, int rank, float eps, float* red,
                        float2* stat OFFSET_PARAM) {
  const T_X* xr = x + (long long)row * cols;
  const float shift = RMS ? 0.f : load1(xr);
  Moments st{0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < REGS; ++i)
    if (RES_E(i) < end) st = res_rn_fold<V>(st, r[i], shift);
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    res_wait((BUFS - 1) * SLOTS + SLOTS - 1 - s);
    if (RES_E(REGS + s) < end) st = res_rn_fold<V>(st, sm[s * THREADS], shift);
  }
  if (RMS) st.m2 = block_sum<THREADS>(st.m2, red);
  else st = block_moments<THREADS>(st, red);
  const float2 mr = team_row_norm(xr, ws + (long long)row * team, team, rank, st, shift, cols, slice, eps, red,
                                  stat);
  T_OUT* orow = out + (long long)row * cols;
  const bool more = rn < rows;
  const T_X* xn = x + (long long)rn * cols;
#pragma unroll
  for (int i = 0; i < REGS; ++i) {
    if (RES_E(i) < end) {
      res_rn_write<V>(r[i], orow, WEIGHT_ARG BIAS_ARG RES_E(i), mr OFFSET_ARG);
      if (more) r[i].template load<LOAD_HINT>(xn + RES_E(i));
    }
  }
#pragma unroll 2  // few vectors at a time: registers go to the next row's loads, not to these
  for (int s = 0; s < SLOTS; ++s) {
    if (RES_E(REGS + s) < end) {
      const Vec<T_X, V> a = sm[s * THREADS];
      res_rn_write<V>(a, orow, WEIGHT_ARG BIAS_ARG RES_E(REGS + s), mr OFFSET_ARG);
      if (more) res_copy16(sm + s * THREADS, xn + RES_E(REGS + s));
    }
    res_commit();
  }
}

template <int V>
__device__ __forceinline__ void rn_resident_staged(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                   T_OUT* __restrict__ out, unsigned long long* __restrict__ ws,
                                                   int cols, int slice, int rows, float eps OFFSET_PARAM) {
  __shared__ float red[96];
  __shared__ float2 stat;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm >= TEAMS) return;
  const int begin = min(cols, rank * slice), end = min(cols, begin + slice);
  res_walk<V>(x, cols, rows, tm, begin, end, [&](Vec<T_X, V>* r, Vec<T_X, V>* sm, int row, int rn) {
    res_rn_step<V>(r, sm, x, WEIGHT_ARG BIAS_ARG out, ws, row, rn, rows, begin, end, cols, slice, team, rank, eps, red,
                   &stat OFFSET_ARG);
  });
}
#undef RES_E

// Misaligned pointers or cols % VEC != 0: the same teams and barriers, x read twice element-wise.
__device__ __forceinline__ void rn_resident_streaming(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                      T_OUT* __restrict__ out, unsigned long long* __restrict__ ws,
                                                      int cols, int slice, int rows, float eps OFFSET_PARAM) {
  __shared__ float red[96];
  __shared__ float2 stat;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm >= TEAMS) return;
  const int begin = min(cols, rank * slice), end = min(cols, begin + slice);
  for (int r = tm; r < rows; r += TEAMS) {
    const T_X* xr = x + (long long)r * cols;
    const float shift = RMS ? 0.f : load1(xr);
    Moments st{0.f, 0.f, 0.f};
    for (int c = begin + (int)threadIdx.x; c < end; c += THREADS) {
      Vec<T_X, 1> a;
      a.template load<LOAD_HINT>(xr + c);
      st = res_rn_fold<1>(st, a, shift);
    }
    if (RMS) st.m2 = block_sum<THREADS>(st.m2, red);
    else st = block_moments<THREADS>(st, red);
    const float2 mr = team_row_norm(xr, ws + (long long)r * team, team, rank, st, shift, cols, slice, eps, red,
                                    &stat);
    T_OUT* orow = out + (long long)r * cols;
    for (int c = begin + (int)threadIdx.x; c < end; c += THREADS) {
      Vec<T_X, 1> a;
      a.template load<LOAD_HINT>(xr + c);
      res_rn_write<1>(a, orow, WEIGHT_ARG BIAS_ARG c, mr OFFSET_ARG);
    }
  }
}

// BPS blocks per SM must be resident together: the register budget is set for that.
#if RMS
extern "C" __global__ void __launch_bounds__(THREADS, BPS)
rms_norm_resident(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, T_OUT* __restrict__ out,
                  unsigned long long* __restrict__ ws, int cols, int slice, int rows, float eps, float weight_offset) {
  const T_BIAS* bias = nullptr;
#else
extern "C" __global__ void __launch_bounds__(THREADS, BPS)
layer_norm_resident(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight, const T_BIAS* __restrict__ bias,
                    T_OUT* __restrict__ out, unsigned long long* __restrict__ ws, int cols, int slice, int rows,
                    float eps) {
  const float weight_offset = 0.f;
#endif
  (void)weight_offset;
  if (slice % VEC == 0 && rn_vec_ok<VEC>(x, WEIGHT_ARG BIAS_ARG out, cols))
    rn_resident_staged<VEC>(x, WEIGHT_ARG BIAS_ARG out, ws, cols, slice, rows, eps OFFSET_ARG);
  else
    rn_resident_streaming(x, WEIGHT_ARG BIAS_ARG out, ws, cols, slice, rows, eps OFFSET_ARG);
}
