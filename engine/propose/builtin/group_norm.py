"""group_norm template: aten::native_group_norm on contiguous NCHW-like input, for one card.

Shapes, dtypes and which optional tensors exist become compile-time constants, so divisions by HxW are
multiply-shifts and absent weight/bias loads do not exist at all. Statistics are fp32 Welford merges of
exact per-vector moments (never E[x^2]-E[x]^2), rounded once to the dtype eager gives them, and the
output is normalised with the ROUNDED mean/rstd, as eager's ComputeFusedParams does. Strategies:
  fused    one block per (n, group): a Welford pass, then a second pass that mostly hits L2.
  split    two launches: P blocks per group write Welford partials, then every block merges its group's
           partials in a fixed order and applies to its chunk.
  cluster  one launch, a thread-block cluster per group (GPUs with clusters only, see
           cuda_common.has_clusters); each block keeps as much of its chunk in shared memory as the GPU's
           per-block limit allows between the passes.
  persist  one cooperative launch of a few blocks per SM for tensors larger than half the L2: every block
           owns a slice of every group and keeps it in shared memory between the two passes, groups one
           after another (group r applied, r + 2 counted, r + 3 copied in by cp.async), so memory is read
           once and written once where three groups fit the GPU's shared memory.
  stream   one launch for tensors larger than half the L2: each block takes the next ticket of a fixed
           order (statistics tiles of a group, LA groups ahead of that group's apply tiles), so a group is
           read from memory once for its statistics and again, soon after, from L2 where the bytes read in
           between fit it. Searched too: the L2 policy of its loads (`l2`) and how many of its blocks an SM
           holds (`resident`), which sets how many tiles are in flight between a group's two reads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template, intent_params

_GN_BODY = r"""
typedef $T T;
typedef $TW TW;
typedef $TB TB;
typedef $TS TS;
constexpr int V = $V;
constexpr int BLOCK = $BLOCK;
constexpr int NWARP = BLOCK / 32;
constexpr int U = $U;
constexpr long long R = $R;          // N * group
constexpr int G = $G;
constexpr int CG = $CG;              // channels per group
constexpr int HW = $HW;
constexpr int D = $D;                // elements per group (CG * HW)
constexpr bool HAS_W = $HAS_W, HAS_B = $HAS_B;
constexpr int SH = $SH, AH = $AH;    // cache policies (kf_ld) of the statistics pass and of the apply pass's loads

// Welford over [lo, hi) of one group: U independent vector loads in flight per thread. KEEP also copies
// the elements below keep_end to keep[i - lo] (shared memory; exact, the values came from T).
template <bool KEEP = false>
__device__ __forceinline__ KfWf gn_stats(const T* __restrict__ xg, int lo, int hi, T* keep = nullptr,
                                         int keep_end = 0) {
  KfWf s = {0.f, 0.f, 0.f};
  for (int base = lo + (int)threadIdx.x * V; base < hi; base += BLOCK * V * U) {
    float f[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * BLOCK * V;
      if (i < hi) kf_load<T, V, SH>(xg + i, f[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * BLOCK * V;
      if (i < hi) {
        if constexpr (KEEP) {
          if (i < keep_end) kf_store<T, V, 0>(keep + (i - lo), f[u]);
        }
        kf_wf_add<V>(s, f[u]);
      }
    }
  }
  return s;
}

// Thread 0 writes the block's Welford triple s to part[3k..3k+2] (to L2).
__device__ __forceinline__ void gn_store(const KfWf& s, float* __restrict__ part, long long k) {
  if (threadIdx.x == 0) {
    __stcg(&part[3 * k], s.n);
    __stcg(&part[3 * k + 1], s.mean);
    __stcg(&part[3 * k + 2], s.m2);
  }
}

// Thread 0 counts in what this block stored before (its gn_store calls).
__device__ __forceinline__ void gn_count_in(unsigned int* count) {
  if (threadIdx.x == 0) {
    __threadfence();  // the partials are visible before the count that announces them
    atomicAdd(count, 1u);
  }
}

// gn_store, then gn_count_in.
__device__ __forceinline__ void gn_publish(const KfWf& s, float* __restrict__ part, long long k,
                                           unsigned int* count) {
  gn_store(s, part, k);
  gn_count_in(count);
}

// Once *count reaches n (thread 0 waits), the n triples from part[3 * first] merged in a fixed order: the same
// bits in every block that gathers them.
__device__ __forceinline__ KfWf gn_gather(const float* __restrict__ part, long long first, int n,
                                          const unsigned int* count, unsigned int sleep_ns, float* red) {
  if (threadIdx.x == 0) {
    const volatile unsigned int* c = count;
    while (*c < (unsigned int)n) __nanosleep(sleep_ns);
    __threadfence();  // what the others wrote before their counts is read after this
  }
  __syncthreads();
  KfWf s = {0.f, 0.f, 0.f};
  for (int k = threadIdx.x; k < n; k += BLOCK) {
    const float* q = part + 3 * (first + k);
    kf_wf_merge(s, __ldcg(q), __ldcg(q + 1), __ldcg(q + 2));
  }
  return kf_wf_block<NWARP>(s, red);
}

// mean/rstd as eager's RowwiseMoments (biased variance, rsqrt(var + eps)), rounded once to TS; the
// per-channel a = rstd*w, b = -a*mean + bias use the ROUNDED values, like ComputeFusedParams.
__device__ __forceinline__ void gn_params(const KfWf& s, long long r, bool write, float eps,
                                          const TW* __restrict__ w, const TB* __restrict__ bias,
                                          TS* __restrict__ mean_out, TS* __restrict__ rstd_out,
                                          float2* ab) {
  const float var = s.m2 / (float)D;
  const TS mq = kf_from_float<TS>(s.mean);
  const TS rq = kf_from_float<TS>(rsqrtf(var + eps));
  if (write && threadIdx.x == 0) { mean_out[r] = mq; rstd_out[r] = rq; }
  const float m = kf_to_float(mq), rs = kf_to_float(rq);
  const int g = (int)(r % G);
  for (int c = threadIdx.x; c < CG; c += BLOCK) {
    float a = rs;
    if constexpr (HAS_W) a = rs * kf_to_float(w[g * CG + c]);
    float b = -a * m;
    if constexpr (HAS_B) b = fmaf(-a, m, kf_to_float(bias[g * CG + c]));
    ab[c] = make_float2(a, b);
  }
}

// U vectors of this thread's batch at `base` (the ones below hi).
__device__ __forceinline__ void gn_load(const T* __restrict__ xg, int base, int hi, float (&f)[U][V]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = base + u * BLOCK * V;
    if (i < hi) kf_load<T, V, AH>(xg + i, f[u]);
  }
}

// y = x * a[c] + b[c] over [lo, hi) of one group; x is read for the last time, y never re-read.
// The first batch `f` was loaded by the caller before the statistics were ready (hides that latency).
__device__ __forceinline__ void gn_apply_range(const T* __restrict__ xg, T* __restrict__ yg, int lo, int hi,
                                               const float2* ab, float (&f)[U][V]) {
  const int first = lo + (int)threadIdx.x * V;
  for (int base = first; base < hi; base += BLOCK * V * U) {
    if (base != first) gn_load(xg, base, hi, f);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * BLOCK * V;
      if (i < hi) {
        const float2 k = ab[i / HW];   // HW % V == 0: a vector never straddles two channels
#pragma unroll
        for (int j = 0; j < V; ++j) f[u][j] = fmaf(f[u][j], k.x, k.y);
        kf_store<T, V, 1>(yg + i, f[u]);
      }
    }
  }
}
"""

_GN_FUSED = r"""
// One block per (n, group): Welford pass, then a second pass that mostly hits L2.
extern "C" __global__ void __launch_bounds__(BLOCK)
gn_fused(const T* __restrict__ x, $WB_PARAMS T* __restrict__ y, TS* __restrict__ mean_out,
         TS* __restrict__ rstd_out, float eps) {
$WB_LOCALS
  __shared__ float red[3 * NWARP + 3];
  __shared__ float2 ab[CG];
  const long long r = blockIdx.x;
  if (r >= R) return;
  const T* __restrict__ xg = x + r * D;
  const KfWf s = kf_wf_block<NWARP>(gn_stats(xg, 0, D), red);
  float f[U][V];
  gn_load(xg, (int)threadIdx.x * V, D, f);
  gn_params(s, r, true, eps, w, bias, mean_out, rstd_out, ab);
  __syncthreads();
  gn_apply_range(xg, y + r * D, 0, D, ab, f);
}
"""

_GN_SPLIT = r"""
constexpr int P = $P;                // blocks per group
constexpr int CHUNK = $CHUNK;        // elements per block, a multiple of V
constexpr bool REVERSE = $REVERSE;

// Split, kernel 1: P blocks per group each write the Welford triple of their chunk.
extern "C" __global__ void __launch_bounds__(BLOCK)
gn_partial(const T* __restrict__ x, float* __restrict__ part) {
  __shared__ float red[3 * NWARP + 3];
  const long long L = blockIdx.x;
  if (L >= R * P) return;
  const long long r = L / P;
  const int p = (int)(L % P);
  const int lo = p * CHUNK;
  const int hi = min(D, lo + CHUNK);
  const KfWf s = kf_wf_block<NWARP>(gn_stats(x + r * D, min(lo, D), hi), red);
  if (threadIdx.x == 0) { part[3 * L] = s.n; part[3 * L + 1] = s.mean; part[3 * L + 2] = s.m2; }
}

// Split, kernel 2: every block merges its group's P triples in the same fixed order (same bits in
// each block; cheaper than a third launch), block 0 of the group writes mean/rstd, all apply to their
// chunk. REVERSE walks the chunks in the opposite order to kernel 1, so the first blocks find the
// last-read data in L2.
extern "C" __global__ void __launch_bounds__(BLOCK)
gn_apply(const T* __restrict__ x, $WB_PARAMS const float* __restrict__ part, T* __restrict__ y,
         TS* __restrict__ mean_out, TS* __restrict__ rstd_out, float eps) {
$WB_LOCALS
  __shared__ float red[3 * NWARP + 3];
  __shared__ float2 ab[CG];
  if ((long long)blockIdx.x >= R * P) return;
  const long long L = REVERSE ? R * P - 1 - (long long)blockIdx.x : (long long)blockIdx.x;
  const long long r = L / P;
  const int p = (int)(L % P);
  const int lo = min(p * CHUNK, D), hi = min(D, p * CHUNK + CHUNK);
  float f[U][V];
  gn_load(x + r * D, lo + (int)threadIdx.x * V, hi, f);
  KfWf s = {0.f, 0.f, 0.f};
  for (int k = threadIdx.x; k < P; k += BLOCK) {
    const float* q = part + 3 * (r * P + k);
    kf_wf_merge(s, q[0], q[1], q[2]);
  }
  s = kf_wf_block<NWARP>(s, red);
  gn_params(s, r, p == 0, eps, w, bias, mean_out, rstd_out, ab);
  __syncthreads();
  gn_apply_range(x + r * D, y + r * D, lo, hi, ab, f);
}
"""


_GN_STREAM = r"""
constexpr int P = $P;                // tiles per group
constexpr int CHUNK = $CHUNK;        // elements per tile, a multiple of V
constexpr long long LA = $LA;        // groups whose statistics tiles come before a group's apply tiles
constexpr long long TICKETS = 2 * R * P;

// Ticket t -> (apply?, group r, tile p), in this order: the statistics tiles of groups 0..LA-1; then per
// group k >= LA the statistics tiles of k and the apply tiles of k - LA; then the apply tiles of the last
// LA groups. Every statistics tile of a group has a smaller ticket than any of its apply tiles.
__device__ __forceinline__ void gn_ticket(long long t, bool& apply, long long& r, int& p) {
  constexpr long long HEAD = LA * P, BODY = 2LL * P * (R - LA);
  if (t < HEAD) { apply = false; r = t / P; p = (int)(t % P); return; }
  t -= HEAD;
  if (t < BODY) {
    const long long k = LA + t / (2 * P);
    const int j = (int)(t % (2 * P));
    apply = j >= P;
    r = apply ? k - LA : k;
    p = apply ? j - P : j;
    return;
  }
  t -= BODY;
  apply = true;
  r = R - LA + t / P;
  p = (int)(t % P);
}

// One launch of 2 * R * P blocks; a block works on the tile of the ticket it draws (not of its blockIdx:
// the hardware may start blocks in any order). An apply tile waits until its group's P statistics tiles
// are written. It never waits on a block that has not started: those tiles' tickets are smaller, and a
// ticket is drawn only by a running block, which finishes its statistics tile without waiting. `ctr` is
// zeroed before the launch: ctr[0..1] the ticket counter, ctr[2 + r] the tiles of group r done.
extern "C" __global__ void __launch_bounds__(BLOCK)
gn_stream(const T* __restrict__ x, $WB_PARAMS float* __restrict__ part, unsigned int* __restrict__ ctr,
          T* __restrict__ y, TS* __restrict__ mean_out, TS* __restrict__ rstd_out, float eps) {
$WB_LOCALS
  __shared__ float red[3 * NWARP + 3];
  __shared__ float2 ab[CG];
  __shared__ unsigned long long ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(reinterpret_cast<unsigned long long*>(ctr), 1ULL);
  __syncthreads();
  const long long t = (long long)ticket;
  if (t >= TICKETS) return;
  bool apply;
  long long r;
  int p;
  gn_ticket(t, apply, r, p);
  const int lo = min(p * CHUNK, D), hi = min(D, p * CHUNK + CHUNK);
  const T* __restrict__ xg = x + r * D;
  unsigned int* done = ctr + 2;
  if (!apply) {
    gn_publish(kf_wf_block<NWARP>(gn_stats(xg, lo, hi), red), part, r * P + p, done + r);
    return;
  }
  float f[U][V];
  gn_load(xg, lo + (int)threadIdx.x * V, hi, f);  // in flight while the statistics are awaited
  const KfWf s = gn_gather(part, r * P, P, done + r, 100, red);
  gn_params(s, r, p == 0, eps, w, bias, mean_out, rstd_out, ab);
  __syncthreads();
  gn_apply_range(xg, y + r * D, lo, hi, ab, f);
}
"""


_GN_PERSIST = r"""
constexpr int S = $S;                // blocks, every one resident at once (a cooperative launch)
constexpr int L = $L;                // elements of each group a block owns, a multiple of V
constexpr int KEEP = $KEEP;          // the first KEEP of them copied to shared memory (a sub-slot per group)
constexpr int K = $GPI;              // groups per step: fetched, counted and applied together
constexpr long long STEPS = (R + K - 1) / K;
constexpr int SLOTS = 3;             // steps in shared memory at once: applied, counted ahead, landing
constexpr int CGT = (CG + BLOCK - 1) / BLOCK;  // channels of a group per thread (weights, biases)
static_assert(V * sizeof(T) == 16, "cp.async copies 16-byte vectors");

// Group k of step t: slot t % SLOTS, sub-slot k.
__device__ __forceinline__ T* gn_sub(T* stash, long long t, int k) {
  return stash + ((int)(t % SLOTS) * K + k) * KEEP;
}

// This thread's vectors of the kept part of step t's groups, copied to their sub-slots in the background
// (cp.async); one commit group per call, empty past the last step.
__device__ __forceinline__ void gn_fetch(const T* __restrict__ x, long long t, int lo, int mid, T* stash) {
  for (int k = 0; k < K; ++k) {
    const long long q = t * K + k;
    if (q >= R) break;
    const T* xg = x + q * D;
    T* sub = gn_sub(stash, t, k);
    for (int i = lo + (int)threadIdx.x * V; i < mid; i += BLOCK * V) kf_async_copy16(sub + (i - lo), xg + i);
  }
  kf_async_commit();
}

// Step t: each group's Welford partial of this block's slice (the kept part from this thread's own copies,
// the rest from memory) published in part[], then the block counted in ctr[t]. Its copies must have landed.
__device__ __forceinline__ void gn_count(long long t, const T* __restrict__ x, T* stash, int lo, int mid, int hi,
                                         float* __restrict__ part, unsigned int* __restrict__ ctr, float* red) {
  if (t >= STEPS) return;
  for (int k = 0; k < K; ++k) {
    const long long q = t * K + k;
    if (q >= R) break;
    const T* sub = gn_sub(stash, t, k);
    const T* __restrict__ xg = x + q * D;
    KfWf s = {0.f, 0.f, 0.f};
    for (int i = lo + (int)threadIdx.x * V; i < mid; i += BLOCK * V) {
      float f[V];
      kf_load<T, V, 0>(sub + (i - lo), f);
      kf_wf_add<V>(s, f);
    }
    if constexpr (KEEP < L) {
      for (int i = mid + (int)threadIdx.x * V; i < hi; i += BLOCK * V) {
        float f[V];
        kf_load<T, V, SH>(xg + i, f);
        kf_wf_add<V>(s, f);
      }
    }
    gn_store(kf_wf_block<NWARP>(s, red), part, q * S + blockIdx.x);
  }
  gn_count_in(ctr + t);
}

// One cooperative launch of S blocks; block b owns the same slice [lo, hi) of every group. Groups go in
// steps of K. Per step t a block applies step t's groups (their partials were counted two steps earlier, so
// the wait for the other blocks is mostly over before it begins; the weights are loaded while it lasts),
// counts step t + 2 from the copies that landed meanwhile, and starts copying step t + 3 into the slot step
// t leaves (cp.async). Every block merges the S partials of a group in the same fixed order (same bits
// everywhere). Memory is read once and written once where three steps fit the GPU's shared memory (else the
// part of each slice not kept is read again). `ctr` is zeroed before the launch: ctr[t] counts the blocks
// that published step t.
extern "C" __global__ void __launch_bounds__(BLOCK, $PER_SM)
gn_persist(const T* __restrict__ x, $WB_PARAMS float* __restrict__ part, unsigned int* __restrict__ ctr,
           T* __restrict__ y, TS* __restrict__ mean_out, TS* __restrict__ rstd_out, float eps) {
$WB_LOCALS
  extern __shared__ __align__(16) unsigned char gn_stash_raw[];
  __shared__ float red[3 * NWARP + 3];
  __shared__ float2 ab[K * CG];
  T* stash = reinterpret_cast<T*>(gn_stash_raw);
  const int b = (int)blockIdx.x;
  const int lo = min(b * L, D), hi = min(D, b * L + L), mid = min(hi, lo + KEEP);
  gn_fetch(x, 0, lo, mid, stash);
  gn_fetch(x, 1, lo, mid, stash);
  gn_fetch(x, 2, lo, mid, stash);
  kf_async_wait<2>();
  gn_count(0, x, stash, lo, mid, hi, part, ctr, red);
  kf_async_wait<1>();
  gn_count(1, x, stash, lo, mid, hi, part, ctr, red);
  for (long long t = 0; t < STEPS; ++t) {
    const int n = (int)min((long long)K, R - t * K);  // groups in this step
    float wv[K][CGT], bv[K][CGT];  // this thread's channels' weights, in flight while the partials are awaited
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int g = (int)((t * K + k) % G);
#pragma unroll
      for (int j = 0; j < CGT; ++j) {
        const int c = (int)threadIdx.x + j * BLOCK;
        wv[k][j] = 1.f;
        bv[k][j] = 0.f;
        if (k < n && c < CG) {
          if constexpr (HAS_W) wv[k][j] = kf_to_float(w[g * CG + c]);
          if constexpr (HAS_B) bv[k][j] = kf_to_float(bias[g * CG + c]);
        }
      }
    }
    for (int k = 0; k < n; ++k) {
      const long long q = t * K + k;
      const KfWf s = gn_gather(part, q * S, S, ctr + t, 32, red);  // (the wait is over after the first)
      // mean/rstd and the per-channel a, b exactly as gn_params (the rounded statistics), weights preloaded
      const TS mq = kf_from_float<TS>(s.mean);
      const TS rq = kf_from_float<TS>(rsqrtf(s.m2 / (float)D + eps));
      if (b == 0 && threadIdx.x == 0) { mean_out[q] = mq; rstd_out[q] = rq; }
      const float m = kf_to_float(mq), rs = kf_to_float(rq);
#pragma unroll
      for (int j = 0; j < CGT; ++j) {
        const int c = (int)threadIdx.x + j * BLOCK;
        if (c < CG) {
          float a = rs;
          if constexpr (HAS_W) a = rs * wv[k][j];
          float bb = -a * m;
          if constexpr (HAS_B) bb = fmaf(-a, m, bv[k][j]);
          ab[k * CG + c] = make_float2(a, bb);
        }
      }
    }
    __syncthreads();
    for (int k = 0; k < n; ++k) {
      const long long q = t * K + k;
      const T* __restrict__ xg = x + q * D;
      T* __restrict__ yg = y + q * D;
      const T* kept = gn_sub(stash, t, k);
      const float2* abk = ab + k * CG;
      for (int i = lo + (int)threadIdx.x * V; i < mid; i += BLOCK * V) {
        float v[V];
        kf_load<T, V, 0>(kept + (i - lo), v);
        const float2 c = abk[i / HW];
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = fmaf(v[j], c.x, c.y);
        kf_store<T, V, 1>(yg + i, v);
      }
      if constexpr (KEEP < L) {
        if (mid < hi) {  // the part of the slice not kept: read again
          float f[U][V];
          gn_load(xg, mid + (int)threadIdx.x * V, hi, f);
          gn_apply_range(xg, yg, mid, hi, abk, f);
        }
      }
    }
    kf_async_wait<0>();  // step t + 2's copies (started a step ago) have landed
    gn_count(t + 2, x, stash, lo, mid, hi, part, ctr, red);
    gn_fetch(x, t + 3, lo, mid, stash);  // into slot t % 3: this thread's vectors of step t are applied
    // No barrier here: ab and red are written next after the __syncthreads in the next step's first gather,
    // which every thread reaches only when done with this step.
  }
}
"""


_GN_CLUSTER = r"""
constexpr int K = $K;                // blocks per group: one thread block cluster
constexpr int CHUNK = $CHUNK;        // elements per block, a multiple of V
constexpr int STASH = $STASH;        // first elements of the chunk kept in shared memory between the passes

// One launch, a cluster of K blocks per group (the hardware runs a cluster's blocks together, so its
// barrier never waits on a block that is not running). Pass 1 reads the block's chunk once from memory
// and keeps its first STASH elements in shared memory; the K Welford partials meet at the cluster
// barrier and every block merges them in the same fixed order (same bits everywhere); pass 2 re-reads
// the rest of the chunk (just read: mostly L2 hits), then applies to the stash.
extern "C" __global__ void __cluster_dims__($K, 1, 1) __launch_bounds__(BLOCK)
gn_cluster(const T* __restrict__ x, $WB_PARAMS float* __restrict__ part, T* __restrict__ y,
           TS* __restrict__ mean_out, TS* __restrict__ rstd_out, float eps) {
$WB_LOCALS
  static_assert(R * K <= 0x7fffffffLL, "the grid is N * group * K blocks");
  extern __shared__ __align__(16) unsigned char gn_stash_raw[];
  __shared__ float red[3 * NWARP + 3];
  __shared__ float2 ab[CG];
  T* stash = reinterpret_cast<T*>(gn_stash_raw);
  const long long L = blockIdx.x;
  const long long r = L / K;
  const int p = (int)(L % K);
  const int lo = min(p * CHUNK, D), hi = min(D, p * CHUNK + CHUNK);
  const T* __restrict__ xg = x + r * D;
  T* __restrict__ yg = y + r * D;
  KfWf s = gn_stats<true>(xg, lo, hi, stash, lo + STASH);
  s = kf_wf_block<NWARP>(s, red);
  if (threadIdx.x == 0) {
    __stcg(&part[3 * L], s.n);
    __stcg(&part[3 * L + 1], s.mean);
    __stcg(&part[3 * L + 2], s.m2);
  }
  kf_cluster_sync();  // the group's K partials are written (and, as a __syncthreads, this block's stash)
  s = {0.f, 0.f, 0.f};
  for (int k = threadIdx.x; k < K; k += BLOCK) {
    const float* q = part + 3 * (r * K + k);
    kf_wf_merge(s, __ldcg(q), __ldcg(q + 1), __ldcg(q + 2));
  }
  s = kf_wf_block<NWARP>(s, red);
  gn_params(s, r, p == 0, eps, w, bias, mean_out, rstd_out, ab);
  __syncthreads();
  const int mid = min(hi, lo + STASH);
  float f[U][V];
  gn_load(xg, mid + (int)threadIdx.x * V, hi, f);
  gn_apply_range(xg, yg, mid, hi, ab, f);  // the part not kept: re-read (mostly from L2)
  for (int i = lo + (int)threadIdx.x * V; i < mid; i += BLOCK * V) {  // then the part kept
    float g[V];
    kf_load<T, V, 0>(stash + (i - lo), g);
    const float2 k = ab[i / HW];
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] = fmaf(g[j], k.x, k.y);
    kf_store<T, V, 1>(yg + i, g);
  }
}
"""

# Cluster strategy: blocks per group (8 is sm_90's portable cluster size; 16 needs the non-portable
# opt-in, which the lane and the cast runtime set) and the shared memory a block may stash its chunk in.
GN_CLUSTERS = (16, 8, 4, 2)
GN_CLUSTERS_FIRST = 8  # the default: portable; on the H200, 16 was slower at every setting on 512 KB groups
STASH_BYTES = 200 * 1024  # at most (on the H200, more left too few blocks resident per SM)


# Stream strategy: tile sizes (KB of input per block) and how many groups' statistics come ahead of a
# group's apply tiles. Between a tile's two reads pass about (LA + 1) groups of reads and one of writes,
# which the L2 must hold for the second read to hit it.
STREAM_TILES_KB = (64, 32, 128, 256)
STREAM_LOOKAHEAD = (1, 0, 2)
# And the L2 policy of its loads: "default" (statistics loads plain, apply loads streaming) or "keep" (sm_80 on:
# statistics loads evict_last, so the writes and other groups' reads do not push a group out of L2 before its
# apply tiles re-read it; apply loads evict_first). The largest SD3.5 VAE GroupNorm (bf16 [1,128,1024,1024])
# moved its bytes at about 70 % of the lane's copy with "default" (H200, 2026-12-03).
STREAM_L2 = ("default", "keep")
# And how many of its blocks an SM may hold at once ("all": as many as fit; N: dynamic shared memory the kernel
# does not use, sized so that no more than N fit). Every block resident draws a tile, so the bytes read between
# a group's statistics tiles and its apply tiles grow with them: 8 blocks of 64 KB tiles on 132 SMs put 67 MB
# in flight, more than the L2 holds, and the apply pass read its group from memory again. The default stream
# kernel on bf16 [1,128,1024,1024] took 204-215 us against 196 us for three full passes at the lane's copy
# bandwidth (H200, 2026-12-03): its second read hit the L2 hardly at all.
STREAM_RESIDENT = ("all", 2, 3, 1)


def _stream_offered(x: Mapping[str, Any], group_bytes: int, hw: Hardware) -> bool:
    """The stream strategy for tensors of more than half the L2 (a second pass over them misses it) in
    groups of more than 64 KB, on GPUs with acquire loads and __nanosleep (sm_70 on)."""
    cap = hw.capability
    nbytes = math.prod(int(d) for d in x["shape"]) * cc.itemsize(x["dtype"])
    return group_bytes > 64 * 1024 and nbytes * 2 > hw.l2_bytes and cap is not None and cap >= (7, 0)


def _resident_pad(resident: Any, block: int, cg: int, hw: Hardware) -> int:
    """Bytes of dynamic shared memory (unused by the kernel) that let at most `resident` stream blocks share an
    SM: each block then takes the largest share of the SM's shared memory of which `resident` fit (1 KB of it
    reserved by the GPU per block, the kernel's static part counted, rounded down to 128 B). 0 for "all", or
    where the threads already allow no more than that many blocks."""
    if resident == "all":
        return 0
    n = int(resident)
    if n < 1:
        raise ValueError(f"resident {resident!r}: at least 1 block per SM")
    if (n + 1) * block > hw.max_threads_per_sm:
        return 0
    static = _static_shared(block, cg) + 8  # + the ticket
    if not _resident_enforceable(n, hw):
        raise ValueError(f"resident {n}: {hw.max_shared_per_block} B of shared memory per block cannot keep "
                         f"{n + 1} blocks off an SM of {hw.shared_per_sm} B")
    return max(0, _resident_share(n, hw) - static)


def _static_shared(block: int, ab_entries: int) -> int:
    """The static shared memory of the stream and persist kernels before their own extras: red[] (rounded up
    to ab's 8-byte alignment) and ab[ab_entries] (float2)."""
    return -(-4 * (3 * (block // 32) + 3) // 8) * 8 + 8 * ab_entries


def _sm_share(n: int, hw: Hardware) -> int:
    """The shared memory per block (static and dynamic) of which n blocks fit on an SM (1 KB of each reserved
    by the GPU), at most a block's."""
    return min(hw.max_shared_per_block, hw.shared_per_sm // n - 1024)


def _resident_share(n: int, hw: Hardware) -> int:
    """_sm_share rounded down to 128 B."""
    return _sm_share(n, hw) // 128 * 128


def _resident_enforceable(n: int, hw: Hardware) -> bool:
    """Whether a block's share of shared memory can keep n + 1 blocks off an SM."""
    return (n + 1) * (_resident_share(n, hw) + 1024) > hw.shared_per_sm


# Persist strategy: blocks per SM (S = SMs x per_sm blocks in one cooperative launch).
PERSIST_PER_SM = (1, 2)
PERSIST_MIN_KEPT = 0.5  # offered where at least this share of each block's slice stays in shared memory
PERSIST_SLOTS = 3  # steps a block holds in shared memory at once (as SLOTS in the kernel)
# Groups per step (GPI, K in the kernel): each step pays a wait for the other blocks and a merge, so small
# groups go several at a time. Offered where the K * CG per-channel coefficients stay within 8 KB.
PERSIST_GPI = (1, 2, 4)


def _persist_geometry(d: int, isz: int, v: int, block: int, cg: int, per_sm: int, hw: Hardware, gpi: int = 1
                      ) -> tuple[int, int, int]:
    """(blocks, slice, kept) for the persist strategy: S blocks of `per_sm` per SM, each owning `slice`
    elements of every group (a multiple of V), `kept` of them in each of its PERSIST_SLOTS x `gpi` shared
    memory sub-slots (what a block's share of the SM allows beside its static tables)."""
    s = hw.sms * per_sm
    per = -(-d // s)
    per = -(-per // v) * v
    share = _sm_share(per_sm, hw) - _static_shared(block, cg * gpi) - 128
    kept = max(0, min(per, share // (PERSIST_SLOTS * gpi * isz)) // v * v)
    return s, per, kept


def _persist_offered(x: Mapping[str, Any], d: int, cg: int, vecs: Sequence[int], hw: Hardware) -> bool:
    """Where the stream strategy is (a second pass over the tensor would miss the L2), cp.async exists (sm_80
    on) with 16-byte vectors, and shared memory keeps at least PERSIST_MIN_KEPT of every block's slice of
    PERSIST_SLOTS groups at once (1024 threads, one block per SM)."""
    isz = cc.itemsize(x["dtype"])
    cap = hw.capability
    if not _stream_offered(x, d * isz, hw) or cap is None or cap < (8, 0) or hw.sms < 1 or hw.shared_per_sm <= 0:
        return False
    if 16 // isz not in vecs:
        return False
    _, per, kept = _persist_geometry(d, isz, 16 // isz, 1024, cg, 1, hw)
    return kept >= PERSIST_MIN_KEPT * per


def _stream_tiles(d: int, isz: int, v: int, tile_kb: int) -> tuple[int, int]:
    """(tiles per group, elements per tile): tiles of about tile_kb KB, a multiple of V elements each."""
    p = max(1, -(-d * isz // (tile_kb * 1024)))
    per_tile = -(-d // p)
    chunk = -(-per_tile // v) * v
    return -(-d // chunk), chunk


def _stash_budget(hw: Hardware, cg: int) -> int:
    """Bytes of dynamic shared memory a cluster block may stash: what the GPU's per-block limit leaves
    beside the static tables (CG float2 coefficients, the reduction scratch, slack), at most STASH_BYTES."""
    return max(0, min(STASH_BYTES, hw.max_shared_per_block - 8 * cg - 4096))


def _gn_stash(d: int, k: int, v: int, block: int, isz: int, cg: int, stash: str, hw: Hardware) -> tuple[int, int]:
    """(chunk, stash) in elements for the cluster strategy: the chunk a multiple of V; the stash whole
    batches of BLOCK*V elements that fit beside the static shared memory, at most the chunk."""
    per_block = -(-d // k)
    chunk = -(-per_block // v) * v
    if stash == "none":
        return chunk, 0
    budget = _stash_budget(hw, cg)
    batch = block * v
    return chunk, max(0, min(-(-chunk // batch), budget // (batch * isz))) * batch


def gn_args_problem(card: OperatorCard, x: Mapping[str, Any]) -> str | None:
    """Why native_group_norm's arguments are not ones a builtin kernel takes (None: N, C, HxW, group ints that
    agree with the input's shape, a number eps, C a multiple of group, a non-empty input, three outputs)."""
    for k in ("N", "C", "HxW", "group"):
        if not isinstance(cc.raw_value(card, k), int) or isinstance(cc.raw_value(card, k), bool):
            return f"{k} is not an int"
    if not isinstance(cc.raw_value(card, "eps"), (int, float)):
        return "eps is not a finite number"
    n, c, hw, g = (cc.raw_value(card, k) for k in ("N", "C", "HxW", "group"))
    if g <= 0 or c % g:
        return f"C={c} is not a multiple of group={g}"
    shape = [int(s) for s in x["shape"]]
    if len(shape) < 2 or shape[0] != n or shape[1] != c or math.prod(shape[2:]) != hw:
        return f"input shape {shape} does not match N={n} C={c} HxW={hw}"
    if math.prod(shape) == 0:
        return "empty input"
    if len(card.outputs) != 3:
        return f"{len(card.outputs)} outputs, expected 3"
    return None


class GroupNormTemplate(Template):
    """aten::native_group_norm on contiguous NCHW-like input: fused (block per group), split (two launches:
    partial statistics, then merge + apply) or, for large groups, cluster (one launch, a thread-block
    cluster per group)."""

    name = "group_norm"
    ops = frozenset({"aten::native_group_norm"})

    def _geometry(self, card: OperatorCard) -> dict[str, Any]:
        x = cc.raw_arg(card, "input")
        assert x is not None
        n, c, hw, g = (int(cc.raw_value(card, k)) for k in ("N", "C", "HxW", "group"))
        return {"x": x, "N": n, "C": c, "HW": hw, "G": g, "CG": c // g, "D": (c // g) * hw, "R": n * g}

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        if card.op not in self.ops:
            return f"op {card.op} is not group_norm"
        x = cc.tensor_arg(card, "input")
        why = cc.dense_tensor_problem(x, "input")
        if why:
            return why
        assert x is not None
        why = gn_args_problem(card, x)
        if why:
            return why
        geo = self._geometry(card)
        shape = [int(s) for s in x["shape"]]
        if geo["D"] > cc.MAX_I32 // 2:
            return "a group of 2**30 elements or more (32-bit in-group indexing)"
        if geo["CG"] > 4096:
            return "more than 4096 channels per group (per-channel table in shared memory)"
        why = cc.affine_problem(card, [geo["C"]])
        if why:
            return why
        why = (cc.output_problem(card, 0, x["dtype"], shape)
               or cc.output_problem(card, 1, None, None, numel=geo["R"])
               or cc.output_problem(card, 2, None, None, numel=geo["R"]))
        if why:
            return why
        if len(card.outputs) != 3:
            return f"{len(card.outputs)} outputs, expected 3"
        if card.outputs[1]["dtype"] != card.outputs[2]["dtype"]:
            return "mean and rstd outputs differ in dtype"
        if not cc.vec_choices(cc.itemsize(x["dtype"]), geo["HW"], [x, card.outputs[0]]):
            return "no aligned access width"
        return None

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        geo = self._geometry(card)
        x = geo["x"]
        vecs = cc.vec_choices(cc.itemsize(x["dtype"]), geo["HW"], [x, card.outputs[0]])
        r, d = geo["R"], geo["D"]
        # Split when one block per group leaves the GPU idle (SD3.5's VAE: 32 groups of 0.5-8 MB).
        fused_first = r >= 2 * hw.sms or d * cc.itemsize(x["dtype"]) <= 64 * 1024
        # Blocks per group: enough for ~4 blocks per SM, but at least two vectors per thread each.
        p = 1
        while r * p < 4 * hw.sms and p < 1024:
            p *= 2
        while p > 1 and d // p < 2 * 512 * vecs[0]:
            p //= 2
        ps = [q for q in (p, p * 2, p // 2, p * 4, p // 4, p * 8) if 1 <= q <= 1024 and r * q <= cc.MAX_I32]
        # Small groups in the fused kernel: no more threads than two vectors each (64..512).
        block = 512 if not fused_first else min(512, max(64, 1 << (max(1, -(-d // (2 * vecs[0]))) - 1).bit_length()))
        unroll = [4, 2, 1]
        clusters = not fused_first and cc.has_clusters(hw)
        strategies = ["fused", "split"] if fused_first else ["split", "fused"] + ["cluster"] * clusters
        # One cluster launch first where a cluster of 8 (the portable size) holds whole groups in shared
        # memory: one pass over memory. On the H200, [1,512,128,128] fp16 (512 KB groups) took 18.9 us
        # this way (block 256, unroll 1) against 21.2 us for the best split. Groups that do not fit stay
        # split first: on 4 MB groups the best cluster (8 x 1024, 37 % stashed) gained 3 % over split.
        cluster_first = clusters and d * cc.itemsize(x["dtype"]) <= GN_CLUSTERS_FIRST * _stash_budget(hw, geo["CG"])
        if cluster_first:
            strategies = ["cluster", "split", "fused"]
            block, unroll = 256, [1, 2, 4]
        group_bytes = d * cc.itemsize(x["dtype"])
        stream = _stream_offered(x, group_bytes, hw) and not cluster_first
        persist = stream and _persist_offered(x, d, geo["CG"], vecs, hw)
        if stream:  # a second pass over a tensor this large reads it from memory again, not from L2
            strategies = ["stream", *(["persist"] if persist else []), *strategies]
            lookahead = list(STREAM_LOOKAHEAD) if 3 * group_bytes <= hw.l2_bytes // 2 else \
                cc.ordered(0, STREAM_LOOKAHEAD)
        return {
            "strategy": strategies,
            "block": cc.ordered(block, [512, 256, 1024, 128]),
            "vec": vecs,
            "unroll": unroll,
            "blocks_per_group": cc.ordered(ps[0], ps),
            "order": ["reverse", "forward"],
            **({"cluster": cc.ordered(GN_CLUSTERS_FIRST, GN_CLUSTERS), "stash": ["all", "none"]}
               if clusters else {}),
            **({"tile_kb": list(STREAM_TILES_KB), "lookahead": lookahead} if stream else {}),
            **({"l2": list(STREAM_L2)} if stream and hw.capability >= (8, 0) else {}),
            **({"resident": [r for r in STREAM_RESIDENT if r == "all" or _resident_enforceable(r, hw)]}
               if stream and hw.shared_per_sm > 0 else {}),
            **({"per_sm": list(PERSIST_PER_SM), "gpi": [k for k in PERSIST_GPI if k * geo["CG"] * 8 <= 8192]}
               if persist else {}),
        }

    @staticmethod
    def _relevant(params: Mapping[str, Any]) -> set[str]:
        keys = {"strategy", "block", "vec", "unroll"}
        if params["strategy"] == "split":
            keys |= {"blocks_per_group", "order"}
        if params["strategy"] == "cluster":
            keys |= {"cluster", "stash"}
        if params["strategy"] == "stream":
            keys |= {"tile_kb", "lookahead", "l2", "resident"}
        if params["strategy"] == "persist":
            keys = (keys - {"vec"}) | {"per_sm", "gpi"}  # its vectors are cp.async's 16 bytes
        return keys

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        """Change one parameter that matters for the current strategy (or the strategy itself)."""
        return cc.mutate_relevant(self.space(card, hw=hw), params, self._relevant, rng, intent_params(intent))

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        geo = self._geometry(card)
        x = geo["x"]
        w, b = cc.tensor_arg(card, "weight"), cc.tensor_arg(card, "bias")
        has_w, has_b = w is not None, b is not None
        if params["strategy"] == "persist":  # cp.async copies 16-byte vectors: the width is not a choice,
            bl = int(params["block"])          # and per_sm blocks must fit an SM's threads together
            while bl > 32 and int(params["per_sm"]) * bl > hw.max_threads_per_sm:
                bl //= 2
            params = {**params, "vec": 16 // cc.itemsize(x["dtype"]), "block": bl}
        v, block, u = int(params["vec"]), int(params["block"]), int(params["unroll"])
        space = self.space(card, hw=hw)
        strategy, offered = params["strategy"], space["strategy"]
        if strategy not in offered:
            raise ValueError(f"strategy {strategy!r} is outside {offered}")
        split = strategy == "split"
        keep_l2 = strategy == "stream" and params.get("l2", "default") == "keep"
        if keep_l2 and "l2" not in space:
            raise ValueError("l2 'keep' needs sm_80 or newer (L2 eviction policies)")
        p = int(params["blocks_per_group"]) if split else 1
        chunk = -(-geo["D"] // p)
        chunk = -(-chunk // v) * v
        tw = cc.ctype(w["dtype"]) if w is not None else "float"
        tb = cc.ctype(b["dtype"]) if b is not None else "float"
        wb_params, wb_locals = cc.ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        body = cc.substitute(_GN_BODY, T=cc.ctype(x["dtype"]), TW=tw, TB=tb, TS=cc.ctype(card.outputs[1]["dtype"]),
                    V=v, BLOCK=block, U=u, R=geo["R"], G=geo["G"], CG=geo["CG"], HW=geo["HW"], D=geo["D"],
                    HAS_W=cc.cbool(has_w), HAS_B=cc.cbool(has_b),
                    **({"SH": 3, "AH": 4} if keep_l2 else {"SH": 0, "AH": 1}))
        wb_p = wb_params + ", " if wb_params else ""
        wb_args = [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b
        outs = [("ptr", "out0"), ("ptr", "out1"), ("ptr", "out2"), ("f32", "eps")]
        how = ""
        if strategy == "stream":
            p, chunk = _stream_tiles(geo["D"], cc.itemsize(x["dtype"]), v, int(params["tile_kb"]))
            la = min(int(params["lookahead"]), geo["R"])
            if 2 * geo["R"] * p > cc.MAX_I32:
                raise ValueError(f"{2 * geo['R'] * p} tiles do not fit one grid")
            kernels = cc.substitute(_GN_STREAM, WB_PARAMS=wb_p, WB_LOCALS=wb_locals, P=p, CHUNK=chunk, LA=la)
            resident = params.get("resident", "all")
            pad = _resident_pad(resident, block, geo["CG"], hw)
            spec = "\n".join([
                f"# group_norm stream: {p} tiles per group, statistics {la} group(s) ahead of apply; "
                "blocks take tiles in ticket order",
                "[[workspace]]", 'name = "part"', f'bytes = "N * group * {p} * 12"', "",
                "[[workspace]]", 'name = "ctr"', 'bytes = "8 + N * group * 4"', "zero = true", "",
                "[[launch]]", 'kernel = "gn_stream"', f'grid = ["N * group * {2 * p}"]', f"block = [{block}]",
                *([f"shared = {pad}"] if pad else []),
                "args = " + cc.spec_args([("ptr", "input"), *wb_args, ("ptr", "ws.part"), ("ptr", "ws.ctr"),
                                          *outs]), ""])
            how = f", {p} tiles of {chunk} elements per group, statistics {la} group(s) ahead" + \
                (", statistics kept in L2 (evict_last)" if keep_l2 else "") + \
                (f", at most {resident} block(s) per SM" if pad else "")
        elif strategy == "persist":
            per_sm, gpi = int(params["per_sm"]), int(params.get("gpi", 1))
            if gpi not in space["gpi"]:
                raise ValueError(f"gpi {gpi} is outside {space['gpi']} ({geo['CG']} channels per group)")
            isz = cc.itemsize(x["dtype"])
            nb, per, kept = _persist_geometry(geo["D"], isz, v, block, geo["CG"], per_sm, hw, gpi)
            kernels = cc.substitute(_GN_PERSIST, WB_PARAMS=wb_p, WB_LOCALS=wb_locals, S=nb, L=per, KEEP=kept,
                                    PER_SM=per_sm, GPI=gpi)
            spec = "\n".join([
                f"# group_norm persist: {nb} blocks, all resident ({per_sm} per SM), each owning {per} elements "
                f"of every group, {kept} of them copied to shared memory (cp.async); a group counted two "
                "groups ahead of its apply",
                "[[workspace]]", 'name = "part"', f'bytes = "N * group * {nb} * 12"', "",
                "[[workspace]]", 'name = "ctr"', 'bytes = "N * group * 4"', "zero = true", "",  # >= steps
                "[[launch]]", 'kernel = "gn_persist"', f"grid = [{nb}]", f"block = [{block}]",
                f"shared = {PERSIST_SLOTS * gpi * kept * isz}", "cooperative = true",
                "args = " + cc.spec_args([("ptr", "input"), *wb_args, ("ptr", "ws.part"), ("ptr", "ws.ctr"),
                                          *outs]), ""])
            how = (f", {nb} resident blocks ({per_sm} per SM) of {per} elements per group, {kept} kept on chip"
                   + (f", {gpi} groups per step" if gpi > 1 else ""))
        elif strategy == "cluster":
            k = int(params["cluster"])
            chunk, stash = _gn_stash(geo["D"], k, v, block, cc.itemsize(x["dtype"]), geo["CG"], params["stash"],
                                     hw)
            kernels = cc.substitute(_GN_CLUSTER, WB_PARAMS=wb_p, WB_LOCALS=wb_locals, K=k, CHUNK=chunk, STASH=stash)
            shared = stash * cc.itemsize(x["dtype"])
            spec = "\n".join([
                f"# group_norm cluster: {k} blocks per group in one cluster, {stash} elements of each "
                f"{chunk}-element chunk stashed in shared memory",
                "[[workspace]]", 'name = "part"', f'bytes = "N * group * {k} * 12"', "",
                "[[launch]]", 'kernel = "gn_cluster"', f'grid = ["N * group * {k}"]', f"block = [{block}]",
                f"shared = {shared}",
                "args = " + cc.spec_args([("ptr", "input"), *wb_args, ("ptr", "ws.part"), *outs]), ""])
            how = f", a cluster of {k} blocks per group, {stash}/{chunk} elements per block stashed"
        elif split:
            kernels = cc.substitute(_GN_SPLIT, WB_PARAMS=wb_p, WB_LOCALS=wb_locals, P=p, CHUNK=chunk,
                           REVERSE=cc.cbool(params["order"] == "reverse"))
            spec = "\n".join([
                f"# group_norm split: {p} blocks per group; Welford partials, then merge + apply",
                "[[workspace]]", 'name = "part"', f'bytes = "N * group * {p} * 12"', "",
                "[[launch]]", 'kernel = "gn_partial"', f'grid = ["N * group * {p}"]', f"block = [{block}]",
                "args = " + cc.spec_args([("ptr", "input"), ("ptr", "ws.part")]), "",
                "[[launch]]", 'kernel = "gn_apply"', f'grid = ["N * group * {p}"]', f"block = [{block}]",
                "args = " + cc.spec_args([("ptr", "input"), *wb_args, ("ptr", "ws.part"), *outs]), ""])
            how = f", {p} blocks per group, {params.get('order')} apply order"
        else:
            kernels = cc.substitute(_GN_FUSED, WB_PARAMS=wb_p, WB_LOCALS=wb_locals)
            spec = "\n".join([
                "# group_norm fused: one block per (n, group)",
                "[[launch]]", 'kernel = "gn_fused"', 'grid = ["N * group"]', f"block = [{block}]",
                "args = " + cc.spec_args([("ptr", "input"), *wb_args, *outs]), ""])
        dtypes = [x["dtype"], card.outputs[1]["dtype"], *(t["dtype"] for t in (w, b) if t is not None)]
        prelude = cc.prelude(dtypes, hinted=True, welford=True, cluster=strategy == "cluster",
                             async_copy=strategy == "persist")
        source = f"// aten::native_group_norm, {card.signature_text}: {strategy}\n" + prelude + body + kernels
        intent = (f"group_norm {strategy}: {geo['R']} groups of {geo['D']} elements, block {block}, "
                  f"vec {v}, unroll {u}" + how)
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


TEMPLATES: list[Template] = [GroupNormTemplate()]
