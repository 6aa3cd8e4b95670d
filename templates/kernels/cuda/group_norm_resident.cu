// group_norm for huge groups with ONE read of x from DRAM, by a persistent grid of SM x BPS blocks
// (all resident at once) split into TEAMS teams. Team t normalises groups t, t + TEAMS, t + 2 *
// TEAMS, ... one after the other; each of its blocks owns the same slice of every group (SLICE
// elements, a runtime argument) and keeps it on chip between the statistics and the write:
// REGS 16-byte vectors per thread in registers, the rest (SLOTS vectors per thread) in dynamic
// shared memory, copied there by cp.async. Per group a block
//   1. folds each of its vectors into exact moments as the vector lands (Chan merge per vector),
//   2. publishes the block's moments to the workspace `ws` and waits at the team's barrier for
//      the group's other blocks (TEAMS groups are in flight at once, so while one team waits the
//      others stream),
//   3. merges the group's partials in a fixed order (bitwise reproducible),
//   4. writes each vector normalised(+affine) from chip and at once starts loading the same slot
//      of the team's next group into it, so the next group's reads overlap this group's writes.
// The difference to `split_sync` / `split_flow`: nothing is re-read, and a barrier covers one
// team (SM x BPS / TEAMS blocks) with a whole TEAMS-th of the GPU's on-chip storage per group in
// flight, so few barriers are on the critical path and teams drift out of phase.
// The grid must be resident at once (the launch spec sizes it to the GPU the search ran on). If a
// barrier wait times out (a smaller GPU), the block computes that group's moments from memory.
// Misaligned pointers or H*W % VEC != 0 take the same schedule reading x twice element-wise.
// `sync` is a zero-filled int workspace (2 + N * G ints); the last block to finish zeroes it.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _group_norm.cuh}}

// 16-byte asynchronous global -> shared copy (cp.async.cg, sm_80+; a plain copy elsewhere).
FP_DEV void res_copy16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
FP_DEV void res_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most `pending` of this thread's commit groups are in flight. `pending` must be a
// constant after unrolling (0..31): the switch then folds to one instruction.
FP_DEV void res_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RES_WAIT_CASE(n) case n: asm volatile("cp.async.wait_group " #n ";\n" ::: "memory"); break;
  switch (pending) {
    RES_WAIT_CASE(0) RES_WAIT_CASE(1) RES_WAIT_CASE(2) RES_WAIT_CASE(3) RES_WAIT_CASE(4) RES_WAIT_CASE(5)
    RES_WAIT_CASE(6) RES_WAIT_CASE(7) RES_WAIT_CASE(8) RES_WAIT_CASE(9) RES_WAIT_CASE(10) RES_WAIT_CASE(11)
    RES_WAIT_CASE(12) RES_WAIT_CASE(13) RES_WAIT_CASE(14) RES_WAIT_CASE(15) RES_WAIT_CASE(16) RES_WAIT_CASE(17)
    RES_WAIT_CASE(18) RES_WAIT_CASE(19) RES_WAIT_CASE(20) RES_WAIT_CASE(21) RES_WAIT_CASE(22) RES_WAIT_CASE(23)
    RES_WAIT_CASE(24) RES_WAIT_CASE(25) RES_WAIT_CASE(26) RES_WAIT_CASE(27) RES_WAIT_CASE(28) RES_WAIT_CASE(29)
    RES_WAIT_CASE(30) RES_WAIT_CASE(31)
    default: asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  }
#undef RES_WAIT_CASE
#endif
}

// Group grp's (mean, rstd): publish this block's moments `part` (slot rank of the team's `team`
// blocks), wait for the other blocks of the team, merge the team's partials in a fixed order.
// After a barrier timeout the block computes the group's moments from memory instead.
__device__ __forceinline__ float2 team_group_stats(const T_X* __restrict__ xg, float4* __restrict__ ws,
                                                   int* __restrict__ sync, unsigned int grp, int team, int rank,
                                                   Moments part, int gs, float eps, float* red, float2* stat) {
  __shared__ int ok;
  float4* const wg = ws + (long long)grp * team;
  if (threadIdx.x == 0) {
    wg[rank] = make_float4(part.n, part.mean, part.m2, 0.f);
    __threadfence();
    int* const arrived = sync + 2 + grp;
    atomicAdd(arrived, 1);
    const long long t0 = clock64();
    int good = 1;
    while (*reinterpret_cast<volatile int*>(arrived) < team) {
      __nanosleep(32);
      if (clock64() - t0 > 100000000LL) { good = 0; break; }
    }
    __threadfence();
    ok = good;
  }
  __syncthreads();
  if (ok) {
    if (threadIdx.x < 32) {
      Moments st{0.f, 0.f, 0.f};
      for (int p = threadIdx.x; p < team; p += 32) {
        const float4 w = __ldcg(wg + p);
        st = moments_merge(st, Moments{w.x, w.y, w.z});
      }
      st = group_moments<32>(st);
      if (threadIdx.x == 0) *stat = make_float2(st.mean, rsqrtf(__fdividef(st.m2, (float)gs) + eps));
    }
  } else {
    const float shift = load1(xg);
    const Moments st = block_moments<THREADS>(gn_thread_moments<1, 0>(xg, 0, gs, shift), red);
    if (threadIdx.x == 0) *stat = make_float2(shift + st.mean, rsqrtf(__fdividef(st.m2, (float)gs) + eps));
  }
  __syncthreads();
  return *stat;
}

// The last block to finish zeroes `sync` for the next launch (every other block is done with it).
__device__ __forceinline__ void res_reset(int* __restrict__ sync, int ngroups) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(sync, 1) == (int)gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  for (int i = threadIdx.x; i < ngroups; i += THREADS) sync[2 + i] = 0;
  if (threadIdx.x == 0) sync[0] = 0;
}

#define NSLOT (REGS + SLOTS)

template <int V>
FP_DEV void res_write(const Vec<T_X, V>& a, T_OUT* __restrict__ og, WEIGHT_PARAM int e, unsigned int c0, int hw,
                      float mean, float rstd, const T_BIAS* __restrict__ bias) {
  const unsigned int c = c0 + (unsigned int)e / (unsigned int)hw;
  (void)c;  // unused without weight and bias
  const float sa = rstd * WEIGHT_AT(c), sb = BIAS_AT(c);
  Vec<T_OUT, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.set(k, fmaf(a.get(k) - mean, sa, sb));
  o.template store<STORE_HINT>(og + e);
}

template <int V>
FP_DEV Moments res_fold(Moments st, const Vec<T_X, V>& a) {
  float v[V];
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = a.get(k);
  return moments_merge(st, moments_of<V>(v, V));
}

template <int V>
__device__ __forceinline__ void gn_resident_staged(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                   T_OUT* __restrict__ out, float4* __restrict__ ws,
                                                   int* __restrict__ sync, int gs, int hw, int cpg, int groups,
                                                   int slice, int ngroups, float eps) {
  __shared__ float red[96];
  __shared__ float2 stat;
  typedef Vec<T_X, V> VX;
#if SLOTS > 0
  extern __shared__ uint4 res_smem[];
  VX* const sm = reinterpret_cast<VX*>(res_smem) + threadIdx.x;  // slot s of this thread: sm[s * THREADS]
#endif
  VX r[REGS > 0 ? REGS : 1];
  (void)r;
  const int team = (int)gridDim.x / TEAMS;
  const int tm = (int)blockIdx.x / team, rank = (int)blockIdx.x % team;
  if (tm < TEAMS) {
    const int begin = min(gs, rank * slice), end = min(gs, begin + slice);
#define RES_E(i) (begin + ((i) * THREADS + (int)threadIdx.x) * V)
    if (tm < ngroups) {  // the first group's loads
      const T_X* xg = x + (long long)tm * gs;
#pragma unroll
      for (int i = 0; i < REGS; ++i)
        if (RES_E(i) < end) r[i].template load<LOAD_HINT>(xg + RES_E(i));
#if SLOTS > 0
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (RES_E(REGS + s) < end) res_copy16(sm + s * THREADS, xg + RES_E(REGS + s));
        res_commit();  // one commit group per slot (possibly empty), so slot s waits for s + 1 groups
      }
#endif
    }
    for (int g = tm; g < ngroups; g += TEAMS) {
      Moments st{0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < REGS; ++i)
        if (RES_E(i) < end) st = res_fold<V>(st, r[i]);
#if SLOTS > 0
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        res_wait(SLOTS - 1 - s);
        if (RES_E(REGS + s) < end) st = res_fold<V>(st, sm[s * THREADS]);
      }
#endif
      st = block_moments<THREADS>(st, red);
      const float2 mr = team_group_stats(x + (long long)g * gs, ws, sync, (unsigned int)g, team, rank, st, gs, eps,
                                         red, &stat);
      const unsigned int c0 = gn_first_channel((unsigned long long)g, groups, cpg);
      T_OUT* og = out + (long long)g * gs;
      const bool more = g + TEAMS < ngroups;
      const T_X* xn = x + (long long)(g + TEAMS) * gs;
#pragma unroll
      for (int i = 0; i < REGS; ++i) {
        if (RES_E(i) < end) {
          res_write<V>(r[i], og, WEIGHT_ARG RES_E(i), c0, hw, mr.x, mr.y, bias);
          if (more) r[i].template load<LOAD_HINT>(xn + RES_E(i));
        }
      }
#if SLOTS > 0
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (RES_E(REGS + s) < end) {
          const VX a = sm[s * THREADS];
          res_write<V>(a, og, WEIGHT_ARG RES_E(REGS + s), c0, hw, mr.x, mr.y, bias);
          if (more) res_copy16(sm + s * THREADS, xn + RES_E(REGS + s));
        }
        res_commit();
      }
#endif
    }
#undef RES_E
  }
  res_reset(sync, ngroups);
}

// Misaligned pointers or H*W % VEC != 0: the same teams and barriers, x read twice element-wise.
__device__ __forceinline__ void gn_resident_streaming(const T_X* __restrict__ x, WEIGHT_PARAM BIAS_PARAM
                                                      T_OUT* __restrict__ out, float4* __restrict__ ws,
                                                      int* __restrict__ sync, int gs, int hw, int cpg, int groups,
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
      const float2 mr = team_group_stats(xg, ws, sync, (unsigned int)g, team, rank, st, gs, eps, red, &stat);
      gn_apply<1>(xg, og, weight, bias, begin, end, gn_first_channel((unsigned long long)g, groups, cpg), hw,
                  mr.x, mr.y);
    }
  }
  res_reset(sync, ngroups);
}

// BPS blocks per SM must be resident together: the register budget is set for that.
extern "C" __global__ void __launch_bounds__(THREADS, BPS)
group_norm_resident(const T_X* __restrict__ x, const T_WEIGHT* __restrict__ weight,
                    const T_BIAS* __restrict__ bias, T_OUT* __restrict__ out, float4* __restrict__ ws,
                    int* __restrict__ sync, int gs, int hw, int cpg, int groups, int slice, int ngroups, float eps) {
  if (gn_vec_ok(x, out, hw) && gs % VEC == 0 && slice % VEC == 0)
    gn_resident_staged<VEC>(x, weight, bias, out, ws, sync, gs, hw, cpg, groups, slice, ngroups, eps);
  else
    gn_resident_streaming(x, weight, bias, out, ws, sync, gs, hw, cpg, groups, slice, ngroups, eps);
}
