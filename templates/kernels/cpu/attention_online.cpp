// attention (CPU): out = softmax(q k^T * scale [softcap] + mask) v, one pass over the keys with an
// online softmax. OpenMP over (batch, head, block of BLOCK_M query rows); each task converts a tile
// of BLOCK_N keys and values to fp32 once and runs every query row of its block over it, so the
// tile is read from memory once per BLOCK_M rows. Logits, softmax and accumulation in fp32.
// Causal is top-left aligned (key j visible to query row i when j <= i), as SDPA's is_causal; a sliding
// window W (causal, window > 0) also hides key j from row i when j <= i - W.
// A row whose logits are all -inf: 0 when MASKED_ZERO (SDPA's safe softmax), else NaN (softmax's).
//{{PARAMS}}
//{{INCLUDE _cpu_prelude.h}}
#include <vector>

static inline float att_dot(const float* FP_RESTRICT a, const float* FP_RESTRICT b, long long n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (long long d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

extern "C" void attention_online(const T_X* q, const T_K* k, const T_V* v, const T_MASK* mask, T_OUT* out,
                                 long long B, long long H, long long L, long long S, long long D, long long G,
                                 long long q_sb, long long q_sh, long long q_sl, long long k_sb, long long k_sh,
                                 long long k_sl, long long v_sb, long long v_sh, long long v_sl, long long o_sb,
                                 long long o_sh, long long o_sl, long long m_sb, long long m_sh, long long m_sl,
                                 long long causal, long long window, float scale, float softcap) {
  const long long mblocks = (L + BLOCK_M - 1) / BLOCK_M;
  const long long tasks = B * H * mblocks;
#pragma omp parallel
  {
    // per-thread scratch: the block's queries, its running max / sum / accumulators, a key tile
    std::vector<float> qf(BLOCK_M * D), acc(BLOCK_M * D), kt(BLOCK_N * D), vt(BLOCK_N * D), sc(BLOCK_N);
    std::vector<float> mrow(BLOCK_M), lrow(BLOCK_M);
#pragma omp for schedule(static, GRAIN)
    for (long long task = 0; task < tasks; ++task) {
      const long long mb = task % mblocks, bh = task / mblocks, h = bh % H, b = bh / H;
      const long long hk = h / G;
      const long long r0 = mb * BLOCK_M, rows = (L - r0) < BLOCK_M ? (L - r0) : BLOCK_M;
      for (long long r = 0; r < rows; ++r) {
        const T_X* qr = q + b * q_sb + h * q_sh + (r0 + r) * q_sl;
        for (long long d = 0; d < D; ++d) qf[r * D + d] = to_float(qr[d]);
        for (long long d = 0; d < D; ++d) acc[r * D + d] = 0.0f;
        mrow[r] = -INFINITY;
        lrow[r] = 0.0f;
      }
      // keys past the block's last row are invisible to every row of it under causal, and with a window
      // so are the keys before its first row's window
      const bool windowed = causal && window > 0;
      const long long kv_end = causal ? ((r0 + rows) < S ? (r0 + rows) : S) : S;
      const long long kv_begin = (windowed && r0 - window + 1 > 0) ? r0 - window + 1 : 0;
      for (long long n0 = kv_begin; n0 < kv_end; n0 += BLOCK_N) {
        const long long cols = (kv_end - n0) < BLOCK_N ? (kv_end - n0) : BLOCK_N;
        for (long long j = 0; j < cols; ++j) {
          const T_K* kr = k + b * k_sb + hk * k_sh + (n0 + j) * k_sl;
          const T_V* vr = v + b * v_sb + hk * v_sh + (n0 + j) * v_sl;
          for (long long d = 0; d < D; ++d) kt[j * D + d] = to_float(kr[d]);
          for (long long d = 0; d < D; ++d) vt[j * D + d] = to_float(vr[d]);
        }
        for (long long r = 0; r < rows; ++r) {
          const long long i = r0 + r;
          long long live = cols;
          if (causal) live = (i - n0 + 1) < cols ? (i - n0 + 1) : cols;
          // the first key of the tile row i sees: i - window + 1 under a window
          const long long lo = (windowed && i - window + 1 > n0) ? i - window + 1 - n0 : 0;
          if (live <= lo) continue;
          const T_MASK* mr = HAS_MASK ? mask + b * m_sb + h * m_sh + i * m_sl + n0 : nullptr;
          float tmax = -INFINITY;
          for (long long j = lo; j < live; ++j) {
            float s = att_dot(&qf[r * D], &kt[j * D], D) * scale;
            if (softcap > 0.0f) s = std::tanh(s / softcap) * softcap;
            if (HAS_MASK) s += to_float(mr[j]);
            sc[j] = s;
            tmax = fp_max(tmax, s);
          }
          const float m_new = fp_max(mrow[r], tmax);
          if (m_new == -INFINITY) continue;  // every logit so far is -inf: nothing to add yet
          const float alpha = FP_EXP(mrow[r] - m_new);  // exp(-inf) = 0 on the first live tile
          float* a = &acc[r * D];
#pragma omp simd
          for (long long d = 0; d < D; ++d) a[d] *= alpha;
          float l = lrow[r] * alpha;
          for (long long j = lo; j < live; ++j) {
            const float p = FP_EXP(sc[j] - m_new);
            l += p;
            const float* vj = &vt[j * D];
#pragma omp simd
            for (long long d = 0; d < D; ++d) a[d] += p * vj[d];
          }
          lrow[r] = l;
          mrow[r] = m_new;
        }
      }
      for (long long r = 0; r < rows; ++r) {
        T_OUT* orow = out + b * o_sb + h * o_sh + (r0 + r) * o_sl;
        const float l = lrow[r];
        // l == 0: no live key (all -inf, or causal with none): SDPA writes 0, eager softmax NaN
        const bool live = l > 0.0f || l != l;  // a NaN sum (a NaN logit) stays NaN, as in PyTorch
        const float inv = live ? 1.0f / l : (MASKED_ZERO ? 0.0f : NAN);
        for (long long d = 0; d < D; ++d) forge_store(orow + d, live ? acc[r * D + d] * inv : inv);
      }
    }
  }
}
