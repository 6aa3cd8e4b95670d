// ---- persistent-grid ("resident") helpers: a unit (a norm group, a softmax row) held on chip by a
// team of blocks between its statistics and its write. Needs THREADS, REGS, SLOTS, STAGGER, LOAD_HINT
// and T_X (the input type) defined. Used by group_norm_resident and softmax_resident.

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

// A block's partial statistics (two floats) as one 64-bit word that is also its ready flag: `lo` in
// the low half, `hi` with its sign bit set in the high half (hi must not need its sign: a variance's m2,
// a sum of exponentials; NaN stays NaN without it). The workspace is zero-filled per launch, so a clear
// sign bit means "not published yet"; one aligned 64-bit access is single-copy atomic, so a reader sees
// the whole partial or none of it (no fence, no counter). res_lo / res_hi read the halves back.
FP_DEV void res_publish(unsigned long long* p, float lo, float hi) {
  const unsigned long long w = ((unsigned long long)(__float_as_uint(hi) | 0x80000000u) << 32) | __float_as_uint(lo);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
#else
  *reinterpret_cast<volatile unsigned long long*>(p) = w;
#endif
}
FP_DEV unsigned long long res_peek(const unsigned long long* p) {
  unsigned long long w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
#else
  w = *reinterpret_cast<const volatile unsigned long long*>(p);
#endif
  return w;
}
// Wait for the word at p to be published (its flag set) and read it into w; false once this warp lane's
// `polls` pass 2^18 (each an L2 round trip, >= 0.5 us: >= 0.1 s in all; a GPU too small for the grid).
FP_DEV bool res_await(const unsigned long long* p, int& polls, unsigned long long& w) {
  while (((w = res_peek(p)) >> 63) == 0ull) {
    if (++polls > (1 << 18)) return false;
    __nanosleep(20);
  }
  return true;
}
FP_DEV float res_lo(unsigned long long w) { return __uint_as_float((unsigned int)w); }
FP_DEV float res_hi(unsigned long long w) { return __uint_as_float((unsigned int)(w >> 32) & 0x7fffffffu); }

// STAGGER > 0: team t starts t * STAGGER thousand clock cycles late, so that the teams reach their
// barriers out of phase and one team's wait overlaps the others' streaming.
FP_DEV void res_stagger(int tm) {
#if STAGGER > 0
  const long long t0 = clock64(), wait = (long long)tm * STAGGER * 1000;
  while (clock64() - t0 < wait) __nanosleep(100);
#else
  (void)tm;
#endif
}

// One buffer of a block: REGS vectors per thread in registers (r) and SLOTS in shared memory (sm:
// this thread's slot s at sm[s * THREADS]). Vector i of the block's slice [begin, end) of a unit (a
// group, a row) starts at unit-local element RES_E(i); vectors 0..REGS-1 live in registers, the rest in
// slots. RES_E needs `begin` and the vector width `V` in scope.
#define RES_E(i) (begin + ((i) * THREADS + (int)threadIdx.x) * V)

// Start loading unit xg's slice into the buffer (if `load`); always one commit group per slot,
// possibly empty, so that every thread's count of cp.async groups follows the same pattern.
template <int V>
FP_DEV void res_fetch(Vec<T_X, V>* r, Vec<T_X, V>* sm, const T_X* __restrict__ xg, bool load, int begin, int end) {
#pragma unroll
  for (int i = 0; i < REGS; ++i)
    if (load && RES_E(i) < end) r[i].template load<LOAD_HINT>(xg + RES_E(i));
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    if (load && RES_E(REGS + s) < end) res_copy16(sm + s * THREADS, xg + RES_E(REGS + s));
    res_commit();
  }
}

// A block's walk over its team's units, staged: the slice of unit tm fetched into buffer A (REGS register
// vectors `ra`, SLOTS shared-memory slots), then step(r, sm, u, next) for u = tm, tm + TEAMS, ...: the unit's
// statistics, the team's merge, the write, and the refill with unit `next`. BUFS = 2: unit u + TEAMS streams
// into buffer B while unit u waits for its statistics. Teams start STAGGER apart (res_stagger).
template <int V, typename Step>
FP_DEV void res_walk(const T_X* __restrict__ x, long long unit_size, int units, int tm, int begin, int end,
                     Step step) {
  typedef Vec<T_X, V> VX;
#if SLOTS > 0
  extern __shared__ uint4 res_smem[];
  VX* const sa = reinterpret_cast<VX*>(res_smem) + threadIdx.x;
#else
  VX* const sa = nullptr;
#endif
  VX ra[REGS > 0 ? REGS : 1];
  res_stagger(tm);
  res_fetch<V>(ra, sa, x + (long long)tm * unit_size, tm < units, begin, end);
#if BUFS == 2
  VX* const sb = sa + SLOTS * THREADS;
  VX rb[REGS > 0 ? REGS : 1];
  res_fetch<V>(rb, sb, x + (long long)(tm + TEAMS) * unit_size, tm + TEAMS < units, begin, end);
  for (int u = tm; u < units; u += 2 * TEAMS) {
    step(ra, sa, u, u + 2 * TEAMS);
    if (u + TEAMS < units) step(rb, sb, u + TEAMS, u + 3 * TEAMS);
  }
#else
  for (int u = tm; u < units; u += TEAMS) step(ra, sa, u, u + TEAMS);
#endif
}
