// group_norm for huge groups with ONE read of x from DRAM, by a persistent grid of SM x BPS blocks
// (all resident at once) split into TEAMS teams. Team t normalises groups t, t + TEAMS, t + 2 *
// TEAMS, ... one after the other; each of its blocks owns the same slice of every group (`slice`
// elements) and keeps it on chip between the statistics and the write, in one of BUFS buffers:
// REGS 16-byte vectors per thread in registers and SLOTS in dynamic shared memory (cp.async).
// Per group a block
//   1. folds each of its vectors into exact moments as the vector lands (Chan merge per vector),
//   2. publishes the block's moments to the workspace `ws` (one flagged 64-bit word) and waits for
//      the words of the group's other blocks,
//   3. merges the group's partials in a fixed order (bitwise reproducible),
//   4. writes each vector normalised(+affine) from chip and at once starts loading the same slot
//      of the buffer's next group into it, so the next group's reads overlap this group's writes.
// While one team waits in step 2 the others stream, if they are out of phase: STAGGER delays team
// t's start, and BUFS = 2 keeps a block's next group streaming into its second buffer meanwhile.
// The differences to `split_sync` / `split_flow`: nothing is re-read from memory, and one barrier
// covers a TEAMS-th of the GPU's on-chip storage, so there are few of them on the critical path.
// The grid must be resident at once (the launch spec sizes it to the GPU the search ran on). If a
// wait times out (a smaller GPU), the block computes that group's moments from memory.
// Misaligned pointers or H*W % VEC != 0 take the same schedule reading x twice element-wise.
// `ws` is a zero-filled workspace of one 64-bit word per block and group (its partial and flag).
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}
//{{INCLUDE _resident.cuh}}

// Group's (mean, rstd): publish this block's moments `part` (word `rank` of the team's `team`
// blocks at wg), then warp 0 waits for every word of the group and merges them in a fixed order
// (bitwise reproducible; block p's count follows from the slices). After a wait times out (a GPU
// too small for the grid) the block computes the group's moments from memory instead.
__device__ __forceinline__ float2 team_group_stats(const T_X* __restrict__ xg, unsigned long long* __restrict__ wg,
                                                   int team, int rank, Moments part, int gs, int slice, float eps,
                                                   float* red, float2* stat) {
  __shared__ int ok;
  if (threadIdx.x == 0) res_publish(wg + rank, part.mean, part.m2);
  if (threadIdx.x < 32) {
    int good = 1, polls = 0;  // res_await's budget, per lane
    Moments st{0.f, 0.f, 0.f};
    for (int p = threadIdx.x; p < team && good; p += 32) {
      unsigned long long w;
      if (!res_await(wg + p, polls, w)) { good = 0; break; }
      const float n = (float)(min(gs, (p + 1) * slice) - min(gs, p * slice));
      st = moments_merge(st, Moments{n, res_lo(w), res_hi(w)});
    }
    good = __all_sync(0xffffffffu, good);
    if (good) {
      st = group_moments<32>(st);
      if (threadIdx.x == 0) *stat = make_float2(st.mean, rsqrtf(__fdividef(st.m2, (float)gs) + eps));
    }
    if (threadIdx.x == 0) ok = good;
  }
  __syncthreads();
  if (!ok) {
    const float shift = load1(xg);
    const Moments st = block_moments<THREADS>(gn_thread_moments<1, 0>(xg, 0, gs, shift), red);
    if (threadIdx.x == 0) *stat = make_float2(shift + st.mean, rsqrtf(__fdividef(st.m2, (float)gs) + eps));
  }
  __syncthreads();
  return *stat;
}

// Per-channel scale and shift of the vectors a thread writes, in increasing element order: the
// channel is recomputed (one division, two loads) only when a vector passes the channel's end.
struct ResChannel {
  int next;  // group-local element where the current channel ends (0: none yet)
  float sa, sb;
};
template <int V>
FP_DEV void res_write(const Vec<T_X, V>& a, T_OUT* __restrict__ og, WEIGHT_PARAM int e, unsigned int c0, int hw,
                      float mean, float rstd, const T_BIAS* __restrict__ bias, ResChannel& ch) {
  if (e >= ch.next) {
    const unsigned int k = (unsigned int)e / (unsigned int)hw, c = c0 + k;
    (void)c;  // unused without weight and bias
    ch.next = (int)(k + 1) * hw;
    ch.sa = rstd * WEIGHT_AT(c);
    ch.sb = BIAS_AT(c);
  }
  Vec<T_OUT, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.set(k, fmaf(a.get(k) - mean, ch.sa, ch.sb));
  o.template store<STORE_HINT>(og + e);
}

template <int V>
FP_DEV Moments res_fold(Moments st, const Vec<T_X, V>& a) {
  float v[V];
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = a.get(k);
  return moments_merge(st, moments_of<V>(v, V));
}

// Group g from the buffer: moments as the vectors land, the team's statistics, then every vector
// written normalised and at once refilled with group gn's (when gn < ngroups). The other buffer's
// SLOTS commit groups (BUFS = 2) were issued after this one's, so they may stay in flight.
template <int V>
FP_DEV void res_step(Vec<T_X, V>* r, Vec<T_X, V>* sm, const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                     T_OUT* __restrict__ out, unsigned long long* __restrict__ ws, int g, int gn, int ngroups,
                     int begin, int end, int gs, int hw, int cpg, int groups, int team, int rank, int slice,
                     float eps, float* red, float2* stat) {
  Moments st{0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < REGS; ++i)
    if (RES_E(i) < end) st = res_fold<V>(st, r[i]);
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    res_wait((BUFS - 1) * SLOTS + SLOTS - 1 - s);
    if (RES_E(REGS + s) < end) st = res_fold<V>(st, sm[s * THREADS]);
  }
  st = block_moments<THREADS>(st, red);
  const float2 mr = team_group_stats(x + (long long)g * gs, ws + (long long)g * team, team, rank, st, gs, slice, eps,
                                     red, stat);
  const unsigned int c0 = gn_first_channel((unsigned long long)g, groups, cpg);
  T_OUT* og = out + (long long)g * gs;
  const bool more = gn < ngroups;
  const T_X* xn = x + (long long)gn * gs;
  ResChannel ch{0, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < REGS; ++i) {
    if (RES_E(i) < end) {
      res_write<V>(r[i], og, WEIGHT_ARG RES_E(i), c0, hw, mr.x, mr.y, bias, ch);
      if (more) r[i].template load<LOAD_HINT>(xn + RES_E(i));
    }
  }
#pragma unroll 2  // few vectors at a time: registers go to the next group's loads, not to these
  for (int s = 0; s < SLOTS; ++s) {
    if (RES_E(REGS + s) < end) {
      const Vec<T_X, V> a = sm[s * THREADS];
      res_write<V>(a, og, WEIGHT_ARG RES_E(REGS + s), c0, hw, mr.x, mr.y, bias, ch);
      if (more) res_copy16(sm + s * THREADS, xn + RES_E(REGS + s));
    }
    res_commit();
  }
}

template <int V>
__device__ __forceinline__ void gn_resident_staged(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                   T_OUT* __restrict__ out, unsigned long long* __restrict__ ws,
                                                   int gs, int hw, int cpg, int groups, int slice, int ngroups,
                                                   float eps) {
  __shared__ float red[96];
  __shared__ float2 stat;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm >= TEAMS) return;
  const int begin = min(gs, rank * slice), end = min(gs, begin + slice);
  res_walk<V>(x, gs, ngroups, tm, begin, end, [&](Vec<T_X, V>* r, Vec<T_X, V>* sm, int g, int gn) {
    res_step<V>(r, sm, x, weight, bias, out, ws, g, gn, ngroups, begin, end, gs, hw, cpg, groups, team, rank, slice,
                eps, red, &stat);
  });
}
#undef RES_E

// Misaligned pointers or H*W % VEC != 0: the same teams and barriers, x read twice element-wise.
__device__ __forceinline__ void gn_resident_streaming(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                      T_OUT* __restrict__ out, unsigned long long* __restrict__ ws,
                                                      int gs, int hw, int cpg, int groups,
                                                      int slice, int ngroups, float eps) {
  __shared__ float red[96];
  __shared__ float2 stat;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm < TEAMS) {
    const int begin = min(gs, rank * slice), end = min(gs, begin + slice);
    for (int g = tm; g < ngroups; g += TEAMS) {
      GN_GROUP_PTRS(g)
      const float shift = load1(xg);
      Moments st = block_moments<THREADS>(gn_thread_moments<1>(xg, begin, end, shift), red);
      st.mean += shift;
      const float2 mr = team_group_stats(xg, ws + (long long)g * team, team, rank, st, gs, slice, eps, red, &stat);
      gn_apply<1>(xg, og, weight, bias, begin, end, gn_first_channel((unsigned long long)g, groups, cpg), hw,
                  mr.x, mr.y);
    }
  }
}

// BPS blocks per SM must be resident together: the register budget is set for that.
extern "C" __global__ void __launch_bounds__(THREADS, BPS)
group_norm_resident(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                    const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, unsigned long long* __restrict__ ws,
                    int gs, int hw, int cpg, int groups, int slice, int ngroups, float eps) {
  if (gn_vec_ok(x, out, hw) && gs % VEC == 0 && slice % VEC == 0)
    gn_resident_staged<VEC>(x, weight, bias, out, ws, gs, hw, cpg, groups, slice, ngroups, eps);
  else
    gn_resident_streaming(x, weight, bias, out, ws, gs, hw, cpg, groups, slice, ngroups, eps);
}
