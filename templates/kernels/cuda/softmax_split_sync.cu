// softmax / log_softmax over the last dim for a few very long rows, in ONE kernel with ONE read:
// each row is split over `split` blocks (a runtime argument, at most the number of blocks the GPU
// holds at once: the launch spec bounds it); every block keeps its chunk (THREADS * VEC * ITEMS
// columns) in registers, publishes its (max, sum) to the workspace `ws`, waits for its row's
// other blocks at an inter-block barrier (see the prelude), merges the row's partials in a fixed
// order and writes its chunk from registers. `sync` is a zero-filled int workspace
// (1 + 2 * rows ints) that the kernel leaves zero again. If the barrier times out (a GPU too
// small to hold a whole row's blocks) the block recomputes the row statistics from memory.
//{{PARAMS}}
//{{INCLUDE _prelude.cuh}}
//{{INCLUDE _softmax.cuh}}

#define CHUNK (THREADS * VEC * ITEMS)

template <int V>
__device__ __forceinline__ void softmax_split_sync_impl(const T_X* __restrict__ x, T_OUT* __restrict__ out,
                                                        float2* __restrict__ ws, int* __restrict__ sync,
                                                        int cols, int split) {
  constexpr int NV = ITEMS * VEC / V;
  __shared__ float red[32], red_s[32];
  const unsigned int vid = take_ticket(sync);  // block id in start order
  const unsigned int row = vid / split;
  const int part = vid % split;
  const int begin = part * CHUNK;
  const T_X* xr = x + (long long)row * cols;
  T_OUT* orow = out + (long long)row * cols;
  float v[NV][V];
  float m = -FP_INF;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = begin + (i * THREADS + (int)threadIdx.x) * V;
    if (c < cols) {
      Vec<T_X, V> a;
      a.template load<LOAD_HINT>(xr + c);
#pragma unroll
      for (int k = 0; k < V; ++k) { v[i][k] = a.get(k); m = fmaxf(m, v[i][k]); }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) v[i][k] = -FP_INF;
    }
  }
  m = block_max<THREADS>(m, red);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const bool valid = begin + (i * THREADS + (int)threadIdx.x) * V < cols;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      // While the chunk max is -inf only NaN may count (exp(-inf - -inf) would be NaN).
      const float e = (m == -FP_INF) ? ((v[i][k] != v[i][k]) ? v[i][k] : 0.f) : sm_exp(v[i][k] - m);
      s += valid ? e : 0.f;
      if (!LOG) v[i][k] = e;
    }
  }
  s = block_sum<THREADS>(s, red);
  if (threadIdx.x == 0) ws[vid] = make_float2(m, s);
  MaxSum st{-FP_INF, 0.f};
  if (group_arrive_and_wait(sync, row, split)) {
    for (int p = threadIdx.x; p < split; p += THREADS) {
      const float2 q = __ldcg(ws + (long long)row * split + p);
      st = maxsum_merge(st, MaxSum{q.x, q.y}, SmExp());
    }
  } else {
    // Slow fallback: the row's statistics straight from memory (element-wise, online).
    for (int c = threadIdx.x; c < cols; c += THREADS) {
      float xs[1] = {load1(xr + c)};
      sm_accumulate<1>(st, xs);
    }
  }
  st = block_maxsum<THREADS>(st, red, red_s, SmExp());
  group_leave(sync, row, split);
  // softmax: out = exp(x - m_chunk) * exp(m_chunk - M) / S, reusing the exps kept in registers.
  // A chunk whose max is -inf holds exps 0 (or NaN); f keeps 0/0 and NaN sums NaN, as PyTorch does.
  const float f = ((m == -FP_INF) ? 0.f : sm_exp(m - st.m)) * __fdividef(1.f, st.s);
  const float log_sum = logf(st.s);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = begin + (i * THREADS + (int)threadIdx.x) * V;
    if (c < cols) {
      Vec<T_OUT, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) o.set(k, LOG ? sm_finish_log(v[i][k], st.m, log_sum) : v[i][k] * f);
      o.template store<STORE_HINT>(orow + c);
    }
  }
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_split_sync(const T_X* __restrict__ x, T_OUT* __restrict__ out, float2* __restrict__ ws,
                   int* __restrict__ sync, int cols, int split) {
  if (VEC > 1 && cols % VEC == 0 && vec_aligned<T_X, VEC>(x) && vec_aligned<T_OUT, VEC>(out))
    softmax_split_sync_impl<VEC>(x, out, ws, sync, cols, split);
  else
    softmax_split_sync_impl<1>(x, out, ws, sync, cols, split);
}
