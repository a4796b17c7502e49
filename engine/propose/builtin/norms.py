"""Builtin templates for the normalisation family: group_norm, layer_norm, rms_norm, batch_norm (inference).

Every kernel is rendered for one card: shapes, dtypes and which optional tensors exist become
compile-time constants, so divisions by HxW or the row length are multiply-shifts and absent
weight/bias loads do not exist at all. Statistics are computed in fp32 (Welford merges of exact
per-vector moments, or an exact two-pass over register-resident rows), never E[x^2]-E[x]^2, and are
rounded once to the dtype eager gives them. Each template mirrors eager CUDA's arithmetic where it
is observable at the tolerance (group_norm normalises with the rounded mean/rstd, as eager does).

Self-contained on purpose: the CUDA helpers live here (prefixed `kf_`), so this family does not move
when shared snippets change.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from string import Template as _Text
from typing import Any

from engine.cards import OperatorCard
from engine.launch import MAX_SHARED_BYTES
from engine.propose.builtin.cuda_common import mutate_relevant
from engine.propose.builtin.template import INTENT_PARAMS, Rendered, Template

SMS = 132                     # H200 streaming multiprocessors (sizing grids for a few waves)
FLOAT_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
FLT_EPSILON = "1.1920928955078125e-07"  # eps=None in rms_norm: eager uses the fp32 (opmath) epsilon
MAX_I32 = 2**31 - 1

# ----------------------------------------------------------------------------------------- CUDA helpers

_COMMON = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float kf_f(float v) { return v; }
__device__ __forceinline__ float kf_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float kf_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename E> __device__ __forceinline__ E kf_to(float v);
template <> __device__ __forceinline__ float kf_to<float>(float v) { return v; }
template <> __device__ __forceinline__ __half kf_to<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 kf_to<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// A raw word of B bytes: one memory instruction moves it (B <= 16).
template <int B> struct KfRaw;
template <> struct KfRaw<2> { typedef unsigned short Word; };
template <> struct KfRaw<4> { typedef unsigned int Word; };
template <> struct KfRaw<8> { typedef uint2 Word; };
template <> struct KfRaw<16> { typedef uint4 Word; };

// Cache policy. 0: default (data read again soon stays in L2), 1: streaming (last use, evict first),
// 2: read-only path (small tensors every block reads: weights, running stats).
template <int HINT, typename Word> __device__ __forceinline__ Word kf_ld(const Word* p) {
  if constexpr (HINT == 1) return __ldcs(p);
  else if constexpr (HINT == 2) return __ldg(p);
  else return *p;
}

// NV consecutive elements of E at p (aligned to min(16, NV*sizeof(E)) bytes) as floats.
template <typename E, int NV, int HINT>
__device__ __forceinline__ void kf_load(const E* __restrict__ p, float* f) {
  constexpr int BYTES = NV * (int)sizeof(E);
  constexpr int CH = BYTES > 16 ? 16 : BYTES;
  constexpr int PER = CH / (int)sizeof(E);
  typedef typename KfRaw<CH>::Word Word;
#pragma unroll
  for (int k = 0; k < NV / PER; ++k) {
    Word r = kf_ld<HINT>(reinterpret_cast<const Word*>(p + k * PER));
    const E* e = reinterpret_cast<const E*>(&r);
#pragma unroll
    for (int j = 0; j < PER; ++j) f[k * PER + j] = kf_f(e[j]);
  }
}

// NV floats rounded once to E and stored at p; HINT 1 streams (the output is not read again here).
template <typename E, int NV, int HINT>
__device__ __forceinline__ void kf_store(E* __restrict__ p, const float* f) {
  constexpr int BYTES = NV * (int)sizeof(E);
  constexpr int CH = BYTES > 16 ? 16 : BYTES;
  constexpr int PER = CH / (int)sizeof(E);
  typedef typename KfRaw<CH>::Word Word;
#pragma unroll
  for (int k = 0; k < NV / PER; ++k) {
    Word r;
    E* e = reinterpret_cast<E*>(&r);
#pragma unroll
    for (int j = 0; j < PER; ++j) e[j] = kf_to<E>(f[k * PER + j]);
    if constexpr (HINT == 1) __stcs(reinterpret_cast<Word*>(p + k * PER), r);
    else *reinterpret_cast<Word*>(p + k * PER) = r;
  }
}

// Welford state (count, mean, sum of squared deviations); merges are Chan's formula.
struct KfWf { float n, mean, m2; };

__device__ __forceinline__ void kf_wf_merge(KfWf& a, float nb, float mb, float m2b) {
  if (nb == 0.f) return;
  const float n = a.n + nb;
  const float d = mb - a.mean;
  const float r = __fdividef(nb, n);
  a.m2 += m2b + d * d * a.n * r;
  a.mean += d * r;
  a.n = n;
}

// Exact moments of NV values (mean, then squared deviations from it), merged in once: one division per
// vector instead of one per element, and no cancellation.
template <int NV> __device__ __forceinline__ void kf_wf_add(KfWf& s, const float* f) {
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) sum += f[j];
  const float m = sum * (1.f / NV);
  float q = 0.f;
#pragma unroll
  for (int j = 0; j < NV; ++j) { const float d = f[j] - m; q = fmaf(d, d, q); }
  kf_wf_merge(s, (float)NV, m, q);
}

// Warp reduction as a fixed tree into lane 0, then broadcast: every lane gets the same bits.
__device__ __forceinline__ KfWf kf_wf_warp(KfWf s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float n = __shfl_down_sync(0xffffffffu, s.n, o);
    const float m = __shfl_down_sync(0xffffffffu, s.mean, o);
    const float q = __shfl_down_sync(0xffffffffu, s.m2, o);
    kf_wf_merge(s, n, m, q);
  }
  s.n = __shfl_sync(0xffffffffu, s.n, 0);
  s.mean = __shfl_sync(0xffffffffu, s.mean, 0);
  s.m2 = __shfl_sync(0xffffffffu, s.m2, 0);
  return s;
}

// Whole-block reduction; every thread returns the same result. `sh` holds 3 * NWARP + 3 floats.
template <int NWARP> __device__ __forceinline__ KfWf kf_wf_block(KfWf s, float* sh) {
  s = kf_wf_warp(s);
  if constexpr (NWARP == 1) {
    return s;
  } else {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) { sh[w] = s.n; sh[NWARP + w] = s.mean; sh[2 * NWARP + w] = s.m2; }
    __syncthreads();
    if (w == 0) {
      KfWf t = {0.f, 0.f, 0.f};
      if (l < NWARP) { t.n = sh[l]; t.mean = sh[NWARP + l]; t.m2 = sh[2 * NWARP + l]; }
      t = kf_wf_warp(t);
      if (l == 0) { sh[3 * NWARP] = t.n; sh[3 * NWARP + 1] = t.mean; sh[3 * NWARP + 2] = t.m2; }
    }
    __syncthreads();
    KfWf r = {sh[3 * NWARP], sh[3 * NWARP + 1], sh[3 * NWARP + 2]};
    return r;
  }
}

// Sum over a warp by xor butterfly: a+b == b+a in IEEE, so every lane ends with the same bits.
__device__ __forceinline__ float kf_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
"""


def _src(text: str, **kw: Any) -> str:
    return _Text(text).substitute({k: str(v) for k, v in kw.items()})


def _bool(v: bool) -> str:
    return "true" if v else "false"


# ------------------------------------------------------------------------------------- card helpers


def _arg(card: OperatorCard, name: str) -> dict[str, Any] | None:
    for a in card.signature.get("args", []):
        if a.get("name") == name:
            return a
    return None


def _value(card: OperatorCard, name: str) -> Any:
    a = _arg(card, name)
    return None if a is None else a.get("value")


def _present(a: dict[str, Any] | None) -> bool:
    return a is not None and a.get("kind") == "tensor" and not a.get("absent")


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return out[::-1]


def _is_contiguous(d: Mapping[str, Any]) -> bool:
    """Row-major dense (size-1 dims may carry any stride)."""
    exp = _contiguous_strides(d["shape"])
    return all(s == 1 or st == e for s, st, e in zip(d["shape"], d["stride"], exp))


def _op_input_problem(card: OperatorCard, ops: Iterable[str], label: str) -> str | None:
    """Why a norm template cannot take the card's op or its `input` tensor (None: fine)."""
    if card.op not in ops:
        return f"op {card.op} is not {label}"
    return _tensor_problem(_arg(card, "input"), "input")


def _affine_problem(card: OperatorCard, shape: list[int]) -> str | None:
    """Why the present weight/bias cannot be read as per-element parameters of `shape` (None: fine)."""
    for k in ("weight", "bias"):
        a = _arg(card, k)
        if _present(a):
            assert a is not None
            why = _tensor_problem(a, k)
            if why:
                return why
            if [int(s) for s in a["shape"]] != shape:
                return f"{k} shape {a['shape']}, expected {shape}"
    return None


def _tensor_problem(d: Mapping[str, Any] | None, what: str) -> str | None:
    """Why a tensor descriptor is not one our kernels read (None: fine)."""
    if d is None or d.get("kind") != "tensor":
        return f"{what} is missing or not a tensor"
    if d.get("device", "cuda") != "cuda":
        return f"{what} is on {d.get('device')}, not cuda"
    if d.get("dtype") not in FLOAT_TYPES:
        return f"{what} dtype {d.get('dtype')} (only float32, float16, bfloat16)"
    if d.get("neg") or d.get("conj"):
        return f"{what} carries a lazy neg/conj bit"
    if not _is_contiguous(d):
        return f"{what} is not contiguous (strides {d['stride']} for shape {d['shape']})"
    return None


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(s) for s in shape)


def _vec_ok(v: int, tensors: Sequence[Mapping[str, Any]]) -> bool:
    """V-element vectors are aligned for every tensor (each needs min(16, V*itemsize) bytes)."""
    return all(int(d.get("align", 16)) >= min(16, v * ITEMSIZE[d["dtype"]]) for d in tensors)


def _vec_choices(isz: int, divides: int, tensors: Sequence[Mapping[str, Any]]) -> list[int]:
    """Vector widths (elements, widest first) that divide `divides` and keep every access aligned."""
    out = []
    v = 16 // isz
    while v >= 1:
        if divides % v == 0 and _vec_ok(v, tensors):
            out.append(v)
        v //= 2
    return out


def _ordered(default: Any, values: Sequence[Any]) -> list[Any]:
    """`values` with `default` first and no repeats."""
    out = [default]
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def _out_problem(card: OperatorCard, k: int, dtype: str | None, shape: Sequence[int] | None,
                 numel: int | None = None, dense: bool = True) -> str | None:
    outs = card.outputs
    if k >= len(outs):
        return f"output {k} missing"
    d = outs[k]
    if d.get("dtype") not in FLOAT_TYPES:
        return f"output {k} dtype {d.get('dtype')}"
    if dtype is not None and d["dtype"] != dtype:
        return f"output {k} is {d['dtype']}, expected {dtype}"
    if shape is not None and list(d["shape"]) != list(shape):
        return f"output {k} shape {d['shape']}, expected {list(shape)}"
    if numel is not None and _numel(d["shape"]) != numel:
        return f"output {k} has {_numel(d['shape'])} elements, expected {numel}"
    if dense and not _is_contiguous(d):
        return f"output {k} is not contiguous"
    return None


def _ptr_params(decls: Sequence[tuple[bool, str, str, str]]) -> tuple[str, str]:
    """Kernel parameters for present tensors, and local nullptr stand-ins for absent ones (so the body
    compiles; `if constexpr` removes every use)."""
    params, locals_ = [], []
    for present, ctype, name, const in decls:
        decl = f"{const}{ctype}* __restrict__ {name}"
        if present:
            params.append(decl)
        else:
            locals_.append(f"  {const}{ctype}* {name} = nullptr; (void){name};")
    return ", ".join(params), "\n".join(locals_)


def _spec_args(items: Sequence[tuple[str, str]]) -> str:
    return "[" + ", ".join(f'{{ {k} = "{v}" }}' for k, v in items) + "]"


# -------------------------------------------------------------------------------------- group_norm

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
      if (i < hi) kf_load<T, V, 0>(xg + i, f[u]);
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

// mean/rstd as eager's RowwiseMoments (biased variance, rsqrt(var + eps)), rounded once to TS; the
// per-channel a = rstd*w, b = -a*mean + bias use the ROUNDED values, like ComputeFusedParams.
__device__ __forceinline__ void gn_params(const KfWf& s, long long r, bool write, float eps,
                                          const TW* __restrict__ w, const TB* __restrict__ bias,
                                          TS* __restrict__ mean_out, TS* __restrict__ rstd_out,
                                          float2* ab) {
  const float var = s.m2 / (float)D;
  const TS mq = kf_to<TS>(s.mean);
  const TS rq = kf_to<TS>(rsqrtf(var + eps));
  if (write && threadIdx.x == 0) { mean_out[r] = mq; rstd_out[r] = rq; }
  const float m = kf_f(mq), rs = kf_f(rq);
  const int g = (int)(r % G);
  for (int c = threadIdx.x; c < CG; c += BLOCK) {
    float a = rs;
    if constexpr (HAS_W) a = rs * kf_f(w[g * CG + c]);
    float b = -a * m;
    if constexpr (HAS_B) b = fmaf(-a, m, kf_f(bias[g * CG + c]));
    ab[c] = make_float2(a, b);
  }
}

// U vectors of this thread's batch at `base` (the ones below hi).
__device__ __forceinline__ void gn_load(const T* __restrict__ xg, int base, int hi, float (&f)[U][V]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = base + u * BLOCK * V;
    if (i < hi) kf_load<T, V, 1>(xg + i, f[u]);
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


_GN_CLUSTER = r"""
constexpr int K = $K;                // blocks per group: one thread block cluster
constexpr int CHUNK = $CHUNK;        // elements per block, a multiple of V
constexpr int STASH = $STASH;        // first elements of the chunk kept in shared memory between the passes

// kf-cluster-begin: the K blocks of the cluster (__cluster_dims__) meet here; arrive releases and wait
// acquires at cluster scope, so global writes made before are visible to the whole cluster after.
__device__ __forceinline__ void gn_cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// kf-cluster-end

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
  gn_cluster_sync();  // the group's K partials are written (and, as a __syncthreads, this block's stash)
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
STASH_BYTES = 200 * 1024


def _gn_stash(d: int, k: int, v: int, block: int, isz: int, cg: int, stash: str) -> tuple[int, int]:
    """(chunk, stash) in elements for the cluster strategy: the chunk a multiple of V; the stash whole
    batches of BLOCK*V elements that fit beside the static shared memory, at most the chunk."""
    per_block = -(-d // k)
    chunk = -(-per_block // v) * v
    if stash == "none":
        return chunk, 0
    budget = min(STASH_BYTES, MAX_SHARED_BYTES - 8 * cg - 4096)
    batch = block * v
    return chunk, max(0, min(-(-chunk // batch), budget // (batch * isz))) * batch


class GroupNormTemplate(Template):
    """aten::native_group_norm on contiguous NCHW-like input: fused (block per group), split (two launches:
    partial statistics, then merge + apply) or, for large groups, cluster (one launch, a thread-block
    cluster per group)."""

    name = "group_norm"
    ops = frozenset({"aten::native_group_norm"})

    def _geometry(self, card: OperatorCard) -> dict[str, Any]:
        x = _arg(card, "input")
        assert x is not None
        n, c, hw, g = (int(_value(card, k)) for k in ("N", "C", "HxW", "group"))
        return {"x": x, "N": n, "C": c, "HW": hw, "G": g, "CG": c // g, "D": (c // g) * hw, "R": n * g}

    def accepts(self, card: OperatorCard) -> str | None:
        why = _op_input_problem(card, self.ops, "group_norm")
        if why:
            return why
        x = _arg(card, "input")
        assert x is not None
        for k in ("N", "C", "HxW", "group"):
            if not isinstance(_value(card, k), int) or isinstance(_value(card, k), bool):
                return f"{k} is not an int"
        if not isinstance(_value(card, "eps"), (int, float)):
            return "eps is not a finite number"
        if _value(card, "group") <= 0 or _value(card, "C") % _value(card, "group"):
            return f"C={_value(card, 'C')} is not a multiple of group={_value(card, 'group')}"
        geo = self._geometry(card)
        shape = [int(s) for s in x["shape"]]
        if len(shape) < 2 or shape[0] != geo["N"] or shape[1] != geo["C"] or _numel(shape[2:]) != geo["HW"]:
            return f"input shape {shape} does not match N={geo['N']} C={geo['C']} HxW={geo['HW']}"
        if _numel(shape) == 0:
            return "empty input"
        if geo["D"] > MAX_I32 // 2:
            return "a group of 2**30 elements or more (32-bit in-group indexing)"
        if geo["CG"] > 4096:
            return "more than 4096 channels per group (per-channel table in shared memory)"
        why = _affine_problem(card, [geo["C"]])
        if why:
            return why
        why = (_out_problem(card, 0, x["dtype"], shape)
               or _out_problem(card, 1, None, None, numel=geo["R"])
               or _out_problem(card, 2, None, None, numel=geo["R"]))
        if why:
            return why
        if len(card.outputs) != 3:
            return f"{len(card.outputs)} outputs, expected 3"
        if card.outputs[1]["dtype"] != card.outputs[2]["dtype"]:
            return "mean and rstd outputs differ in dtype"
        if not _vec_choices(ITEMSIZE[x["dtype"]], geo["HW"], [x, card.outputs[0]]):
            return "no aligned access width"
        return None

    def space(self, card: OperatorCard) -> Mapping[str, Sequence[Any]]:
        geo = self._geometry(card)
        x = geo["x"]
        vecs = _vec_choices(ITEMSIZE[x["dtype"]], geo["HW"], [x, card.outputs[0]])
        r, d = geo["R"], geo["D"]
        # Split when one block per group leaves the GPU idle (SD3.5's VAE: 32 groups of 0.5-8 MB).
        fused_first = r >= 2 * SMS or d * ITEMSIZE[x["dtype"]] <= 64 * 1024
        # Blocks per group: enough for ~4 blocks per SM, but at least two vectors per thread each.
        p = 1
        while r * p < 4 * SMS and p < 1024:
            p *= 2
        while p > 1 and d // p < 2 * 512 * vecs[0]:
            p //= 2
        ps = [q for q in (p, p * 2, p // 2, p * 4, p // 4, p * 8) if 1 <= q <= 1024 and r * q <= MAX_I32]
        # Small groups in the fused kernel: no more threads than two vectors each (64..512).
        block = 512 if not fused_first else min(512, max(64, _pow2_ceil(-(-d // (2 * vecs[0])))))
        unroll = [4, 2, 1]
        strategies = ["fused", "split"] if fused_first else ["split", "fused", "cluster"]
        # One cluster launch first where a cluster of 8 (the portable size) holds whole groups in shared
        # memory: one pass over memory. On the H200, [1,512,128,128] fp16 (512 KB groups) took 18.9 us
        # this way (block 256, unroll 1) against 21.2 us for the best split. Groups that do not fit stay
        # split first: on 4 MB groups the best cluster (8 x 1024, 37 % stashed) gained 3 % over split.
        cluster_first = not fused_first and d * ITEMSIZE[x["dtype"]] <= GN_CLUSTERS_FIRST * STASH_BYTES
        if cluster_first:
            strategies = ["cluster", "split", "fused"]
            block, unroll = 256, [1, 2, 4]
        return {
            "strategy": strategies,
            "block": _ordered(block, [512, 256, 1024, 128]),
            "vec": vecs,
            "unroll": unroll,
            "blocks_per_group": _ordered(ps[0], ps),
            "order": ["reverse", "forward"],
            **({"cluster": _ordered(GN_CLUSTERS_FIRST, GN_CLUSTERS), "stash": ["all", "none"]}
               if not fused_first else {}),
        }

    @staticmethod
    def _relevant(params: Mapping[str, Any]) -> set[str]:
        keys = {"strategy", "block", "vec", "unroll"}
        if params["strategy"] == "split":
            keys |= {"blocks_per_group", "order"}
        if params["strategy"] == "cluster":
            keys |= {"cluster", "stash"}
        return keys

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None) -> dict[str, Any]:
        """Change one parameter that matters for the current strategy (or the strategy itself)."""
        focus = set(INTENT_PARAMS.get(intent or "", ()))
        if intent == "decomposition":
            focus |= {"strategy", "blocks_per_group", "cluster"}
        if intent == "memory access":
            focus |= {"stash", "order"}
        return mutate_relevant(self.space(card), params, self._relevant, rng, focus)

    def render(self, card: OperatorCard, params: Mapping[str, Any]) -> Rendered:
        geo = self._geometry(card)
        x = geo["x"]
        w, b = _arg(card, "weight"), _arg(card, "bias")
        has_w, has_b = _present(w), _present(b)
        v, block, u = int(params["vec"]), int(params["block"]), int(params["unroll"])
        strategy, offered = params["strategy"], self.space(card)["strategy"]
        if strategy not in offered:
            raise ValueError(f"strategy {strategy!r} is outside {offered}")
        split = strategy == "split"
        p = int(params["blocks_per_group"]) if split else 1
        chunk = -(-geo["D"] // p)
        chunk = -(-chunk // v) * v
        tw = FLOAT_TYPES[w["dtype"]] if has_w else "float"  # type: ignore[index]
        tb = FLOAT_TYPES[b["dtype"]] if has_b else "float"  # type: ignore[index]
        wb_params, wb_locals = _ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        body = _src(_GN_BODY, T=FLOAT_TYPES[x["dtype"]], TW=tw, TB=tb, TS=FLOAT_TYPES[card.outputs[1]["dtype"]],
                    V=v, BLOCK=block, U=u, R=geo["R"], G=geo["G"], CG=geo["CG"], HW=geo["HW"], D=geo["D"],
                    HAS_W=_bool(has_w), HAS_B=_bool(has_b))
        wb_p = wb_params + ", " if wb_params else ""
        wb_args = [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b
        outs = [("ptr", "out0"), ("ptr", "out1"), ("ptr", "out2"), ("f32", "eps")]
        how = ""
        if strategy == "cluster":
            k = int(params["cluster"])
            chunk, stash = _gn_stash(geo["D"], k, v, block, ITEMSIZE[x["dtype"]], geo["CG"], params["stash"])
            kernels = _src(_GN_CLUSTER, WB_PARAMS=wb_p, WB_LOCALS=wb_locals, K=k, CHUNK=chunk, STASH=stash)
            shared = stash * ITEMSIZE[x["dtype"]]
            spec = "\n".join([
                f"# group_norm cluster: {k} blocks per group in one cluster, {stash} elements of each "
                f"{chunk}-element chunk stashed in shared memory",
                "[[workspace]]", 'name = "part"', f'bytes = "N * group * {k} * 12"', "",
                "[[launch]]", 'kernel = "gn_cluster"', f'grid = ["N * group * {k}"]', f"block = [{block}]",
                f"shared = {shared}",
                "args = " + _spec_args([("ptr", "input"), *wb_args, ("ptr", "ws.part"), *outs]), ""])
            how = f", a cluster of {k} blocks per group, {stash}/{chunk} elements per block stashed"
        elif split:
            kernels = _src(_GN_SPLIT, WB_PARAMS=wb_p, WB_LOCALS=wb_locals, P=p, CHUNK=chunk,
                           REVERSE=_bool(params["order"] == "reverse"))
            spec = "\n".join([
                f"# group_norm split: {p} blocks per group; Welford partials, then merge + apply",
                "[[workspace]]", 'name = "part"', f'bytes = "N * group * {p} * 12"', "",
                "[[launch]]", 'kernel = "gn_partial"', f'grid = ["N * group * {p}"]', f"block = [{block}]",
                "args = " + _spec_args([("ptr", "input"), ("ptr", "ws.part")]), "",
                "[[launch]]", 'kernel = "gn_apply"', f'grid = ["N * group * {p}"]', f"block = [{block}]",
                "args = " + _spec_args([("ptr", "input"), *wb_args, ("ptr", "ws.part"), *outs]), ""])
            how = f", {p} blocks per group, {params.get('order')} apply order"
        else:
            kernels = _src(_GN_FUSED, WB_PARAMS=wb_p, WB_LOCALS=wb_locals)
            spec = "\n".join([
                "# group_norm fused: one block per (n, group)",
                "[[launch]]", 'kernel = "gn_fused"', 'grid = ["N * group"]', f"block = [{block}]",
                "args = " + _spec_args([("ptr", "input"), *wb_args, *outs]), ""])
        source = f"// aten::native_group_norm, {card.signature_text}: {strategy}\n" + _COMMON + body + kernels
        intent = (f"group_norm {strategy}: {geo['R']} groups of {geo['D']} elements, block {block}, "
                  f"vec {v}, unroll {u}" + how)
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


# --------------------------------------------------------------------------------- layer/rms (rows)

_ROWS_BODY = r"""
typedef $T T;
typedef $TW TW;
typedef $TB TB;
typedef $TS TS;
constexpr int NCOL = $NCOL;          // row length (product of normalized_shape)
constexpr long long M = $M;          // rows
constexpr int V = $V;
constexpr int TPR = $TPR;            // threads per row (a multiple of 32)
constexpr int RPB = $RPB;            // rows per block
constexpr int BLOCK = TPR * RPB;
constexpr int NWR = TPR / 32;        // warps per row
constexpr int K = $K;                // vectors per thread (register-resident rows)
constexpr bool RMS = $RMS, HAS_W = $HAS_W, HAS_B = $HAS_B, HAS_MEAN = $HAS_MEAN, HAS_RSTD = $HAS_RSTD;

// Sum over the TPR threads of a row; all of them get the same bits. `sh` is this reduction's own
// [RPB][NWR] buffer, so consecutive reductions need no extra barrier.
__device__ __forceinline__ float row_sum(float v, float* sh) {
  v = kf_warp_sum(v);
  if constexpr (NWR == 1) {
    return v;
  } else {
    const int lr = threadIdx.x / TPR, wr = (threadIdx.x % TPR) >> 5;
    if ((threadIdx.x & 31) == 0) sh[lr * NWR + wr] = v;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < NWR; ++k) t += sh[lr * NWR + k];
    return t;
  }
}

// Welford over a row's threads (for rows too long to keep in registers); same-bits broadcast.
__device__ __forceinline__ KfWf row_wf(KfWf s, float* sh) {
  s = kf_wf_warp(s);
  if constexpr (NWR == 1) {
    return s;
  } else {
    const int lr = threadIdx.x / TPR, wr = (threadIdx.x % TPR) >> 5;
    if ((threadIdx.x & 31) == 0) {
      sh[3 * (lr * NWR + wr)] = s.n; sh[3 * (lr * NWR + wr) + 1] = s.mean; sh[3 * (lr * NWR + wr) + 2] = s.m2;
    }
    __syncthreads();
    KfWf t = {0.f, 0.f, 0.f};
    for (int k = 0; k < NWR; ++k) {
      const float* q = sh + 3 * (lr * NWR + k);
      kf_wf_merge(t, q[0], q[1], q[2]);
    }
    return t;
  }
}

// out = w * (rstd * (x - mean)) + b (layer_norm) or w * (rstd * x) (rms_norm), as eager's kernels.
__device__ __forceinline__ void row_finish(float* f, int c, float mean, float rstd,
                                          const TW* __restrict__ w, const TB* __restrict__ bias) {
  float wv[V], bv[V];
  if constexpr (HAS_W) kf_load<TW, V, 2>(w + c, wv);
  if constexpr (HAS_B) kf_load<TB, V, 2>(bias + c, bv);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float o = RMS ? rstd * f[j] : rstd * (f[j] - mean);
    if constexpr (HAS_W) o = wv[j] * o;
    if constexpr (HAS_B) o += bv[j];
    f[j] = o;
  }
}
"""

_ROWS_REGS = r"""
// The row lives in registers (K vectors per thread): exact two-pass statistics, one read, one write.
extern "C" __global__ void __launch_bounds__(BLOCK)
$KERNEL(const T* __restrict__ x, $WB_PARAMS T* __restrict__ y $STAT_PARAMS, float eps) {
$WB_LOCALS
$STAT_LOCALS
  __shared__ float red[2][RPB * NWR];
  const int t = threadIdx.x % TPR;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / TPR;
  const bool ok = row < M;            // no early return: the row's warps meet at barriers
  const T* __restrict__ xr = x + (ok ? row : 0) * NCOL;
  float f[K][V];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * TPR + t) * V;
#pragma unroll
    for (int j = 0; j < V; ++j) f[k][j] = 0.f;
    if (ok && c < NCOL) {
      kf_load<T, V, 1>(xr + c, f[k]);
#pragma unroll
      for (int j = 0; j < V; ++j) s += RMS ? f[k][j] * f[k][j] : f[k][j];
    }
  }
  s = row_sum(s, red[0]);
  float mean = 0.f, var;
  if constexpr (RMS) {
    var = s / (float)NCOL;
  } else {
    mean = s / (float)NCOL;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * TPR + t) * V;
      if (ok && c < NCOL) {
#pragma unroll
        for (int j = 0; j < V; ++j) { const float d = f[k][j] - mean; q = fmaf(d, d, q); }
      }
    }
    var = row_sum(q, red[1]) / (float)NCOL;
  }
  const float rstd = rsqrtf(var + eps);
  if (ok && t == 0) {
    if constexpr (HAS_MEAN) mean_out[row] = kf_to<TS>(mean);
    if constexpr (HAS_RSTD) rstd_out[row] = kf_to<TS>(rstd);
  }
  if (!ok) return;
  T* __restrict__ yr = y + row * NCOL;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * TPR + t) * V;
    if (c < NCOL) {
      row_finish(f[k], c, mean, rstd, w, bias);
      kf_store<T, V, 1>(yr + c, f[k]);
    }
  }
}
"""

_ROWS_STREAM = r"""
// Rows too long for registers: Welford (or sum of squares) pass, then a normalising pass.
extern "C" __global__ void __launch_bounds__(BLOCK)
$KERNEL(const T* __restrict__ x, $WB_PARAMS T* __restrict__ y $STAT_PARAMS, float eps) {
$WB_LOCALS
$STAT_LOCALS
  __shared__ float red[3 * RPB * NWR];
  const int t = threadIdx.x % TPR;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / TPR;
  const bool ok = row < M;
  const T* __restrict__ xr = x + (ok ? row : 0) * NCOL;
  float mean = 0.f, var;
  if constexpr (RMS) {
    float s = 0.f;
    if (ok)
      for (int c = t * V; c < NCOL; c += TPR * V) {
        float f[V];
        kf_load<T, V, 0>(xr + c, f);
#pragma unroll
        for (int j = 0; j < V; ++j) s = fmaf(f[j], f[j], s);
      }
    var = row_sum(s, red) / (float)NCOL;
  } else {
    KfWf s = {0.f, 0.f, 0.f};
    if (ok)
      for (int c = t * V; c < NCOL; c += TPR * V) {
        float f[V];
        kf_load<T, V, 0>(xr + c, f);
        kf_wf_add<V>(s, f);
      }
    s = row_wf(s, red);
    mean = s.mean;
    var = s.m2 / (float)NCOL;
  }
  const float rstd = rsqrtf(var + eps);
  if (ok && t == 0) {
    if constexpr (HAS_MEAN) mean_out[row] = kf_to<TS>(mean);
    if constexpr (HAS_RSTD) rstd_out[row] = kf_to<TS>(rstd);
  }
  if (!ok) return;
  T* __restrict__ yr = y + row * NCOL;
  for (int c = t * V; c < NCOL; c += TPR * V) {
    float f[V];
    kf_load<T, V, 1>(xr + c, f);
    row_finish(f, c, mean, rstd, w, bias);
    kf_store<T, V, 1>(yr + c, f);
  }
}
"""


class _RowNormTemplate(Template):
    """Shared machinery: normalise contiguous rows of NCOL = prod(normalized_shape) elements."""

    rms = False
    eps_name = "eps"

    def _stat_outputs(self, card: OperatorCard) -> list[int]:
        """Indices of the per-row statistics outputs (mean, rstd) this op returns."""
        raise NotImplementedError

    def _rows(self, card: OperatorCard) -> tuple[int, int]:
        x = _arg(card, "input")
        assert x is not None
        ns = [int(s) for s in _value(card, "normalized_shape")]
        ncol = _numel(ns)
        return _numel(x["shape"]) // max(ncol, 1), ncol

    def accepts(self, card: OperatorCard) -> str | None:
        why = _op_input_problem(card, self.ops, self.name)
        if why:
            return why
        x = _arg(card, "input")
        assert x is not None
        ns = _value(card, "normalized_shape")
        if not isinstance(ns, list) or not ns or not all(isinstance(s, int) for s in ns):
            return f"normalized_shape {ns!r} is not a non-empty int list"
        shape = [int(s) for s in x["shape"]]
        if len(ns) > len(shape) or shape[len(shape) - len(ns):] != ns:
            return f"normalized_shape {ns} is not the trailing shape of {shape}"
        eps = _value(card, self.eps_name)
        eps_ok = isinstance(eps, (int, float)) and not isinstance(eps, bool)
        if not eps_ok and not (self.rms and eps is None):  # rms_norm's eps=None is the fp32 epsilon
            return f"{self.eps_name} {eps!r} is not a finite number"
        m, ncol = self._rows(card)
        if m == 0 or ncol == 0:
            return "empty input"
        if ncol > MAX_I32 // 2:
            return "rows of 2**30 elements or more"
        if m > MAX_I32:
            return "more than 2**31 - 1 rows (one grid dimension)"
        why = _affine_problem(card, ns)
        if why:
            return why
        stats = self._stat_outputs(card)
        if len(card.outputs) != 1 + len(stats):
            return f"{len(card.outputs)} outputs, expected {1 + len(stats)}"
        why = _out_problem(card, 0, x["dtype"], shape)
        for k in stats:
            why = why or _out_problem(card, k, None, None, numel=m)
        if len(stats) == 2 and card.outputs[1]["dtype"] != card.outputs[2]["dtype"]:
            why = why or "mean and rstd outputs differ in dtype"
        return why

    def _tensors(self, card: OperatorCard) -> list[dict[str, Any]]:
        """Tensors the row kernels access with vectors: input, out0 and the present weight/bias."""
        out = [card.outputs[0]]
        for k in ("input", "weight", "bias"):
            a = _arg(card, k)
            if _present(a):
                assert a is not None
                out.append(a)
        return out

    def space(self, card: OperatorCard) -> Mapping[str, Sequence[Any]]:
        x = _arg(card, "input")
        assert x is not None
        _, ncol = self._rows(card)
        vecs = _vec_choices(ITEMSIZE[x["dtype"]], ncol, self._tensors(card))
        nv = ncol // vecs[0]
        # Threads per row: up to 4 vectors each (one warp per row for short rows), ~256 threads per block.
        per_thread = -(-nv // 4)
        tpr = min(1024, max(32, -(-per_thread // 32) * 32))
        rpb = _pow2_floor(max(1, 256 // tpr))
        return {
            "block": _ordered(tpr * rpb, [256, 128, 512, 1024]),
            "rows_per_block": _ordered(rpb, [1, 2, 4, 8, 16]),
            "vec": vecs,
        }

    def geometry(self, card: OperatorCard, params: Mapping[str, Any]) -> dict[str, int]:
        """Threads per row, rows per block and vectors per thread the params come to for this card."""
        _, ncol = self._rows(card)
        v, block, rpb = int(params["vec"]), int(params["block"]), int(params["rows_per_block"])
        nv = ncol // v
        tpr = max(32, (block // rpb) // 32 * 32)
        tpr = min(tpr, max(32, -(-nv // 32) * 32), 1024)  # no warp without a vector to hold
        rpb = max(1, min(rpb, 1024 // tpr))
        k = -(-nv // tpr)
        # Register budget of one thread at this block size (__launch_bounds__), minus working registers.
        regs = min(64, 65536 // (tpr * rpb) - 40)
        return {"tpr": tpr, "rpb": rpb, "k": k, "regs": int(k * v <= regs)}

    def render(self, card: OperatorCard, params: Mapping[str, Any]) -> Rendered:
        x = _arg(card, "input")
        assert x is not None
        m, ncol = self._rows(card)
        geo = self.geometry(card, params)
        w, b = _arg(card, "weight"), _arg(card, "bias")
        has_w, has_b = _present(w), _present(b)
        stats = self._stat_outputs(card)
        has_mean = not self.rms and len(stats) == 2
        has_rstd = bool(stats)
        ts = FLOAT_TYPES[card.outputs[stats[0]]["dtype"]] if stats else "float"
        kernel = f"{'rms' if self.rms else 'ln'}_{'regs' if geo['regs'] else 'stream'}"
        wb_params, wb_locals = _ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        st_params, st_locals = _ptr_params([(has_mean, "TS", "mean_out", ""), (has_rstd, "TS", "rstd_out", "")])
        body = _src(_ROWS_BODY, T=FLOAT_TYPES[x["dtype"]],
                    TW=FLOAT_TYPES[w["dtype"]] if has_w else "float",  # type: ignore[index]
                    TB=FLOAT_TYPES[b["dtype"]] if has_b else "float",  # type: ignore[index]
                    TS=ts, NCOL=ncol, M=m, V=params["vec"], TPR=geo["tpr"], RPB=geo["rpb"], K=geo["k"],
                    RMS=_bool(self.rms), HAS_W=_bool(has_w), HAS_B=_bool(has_b), HAS_MEAN=_bool(has_mean),
                    HAS_RSTD=_bool(has_rstd))
        kern = _src(_ROWS_REGS if geo["regs"] else _ROWS_STREAM, KERNEL=kernel,
                    WB_PARAMS=wb_params + ", " if wb_params else "",
                    STAT_PARAMS=", " + st_params if st_params else "", WB_LOCALS=wb_locals, STAT_LOCALS=st_locals)
        source = f"// {card.op}, {card.signature_text}\n" + _COMMON + body + kern
        eps = _value(card, self.eps_name)
        args = [("ptr", "input")] + [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b + [("ptr", "out0")]
        args += [("ptr", f"out{k}") for k in stats]
        args.append(("f32", FLT_EPSILON if eps is None else self.eps_name))
        rows_per_block = geo["rpb"]
        spec = "\n".join([
            f"# {self.name}: {geo['tpr']} threads per row, {rows_per_block} rows per block",
            "[[launch]]", f'kernel = "{kernel}"',
            f'grid = ["ceil_div(input.numel // {ncol}, {rows_per_block})"]',
            f"block = [{geo['tpr'] * rows_per_block}]", "args = " + _spec_args(args), ""])
        intent = (f"{self.name}: {m} rows of {ncol}, {geo['tpr']} threads/row x {rows_per_block} rows/block, "
                  f"vec {params['vec']}, " + (f"{geo['k']} vectors/thread in registers" if geo["regs"]
                                              else "streaming two passes"))
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


class LayerNormTemplate(_RowNormTemplate):
    """aten::native_layer_norm on a contiguous input: warp per row (short rows) or block per row."""

    name = "layer_norm"
    ops = frozenset({"aten::native_layer_norm"})

    def _stat_outputs(self, card: OperatorCard) -> list[int]:
        return [1, 2]


class RmsNormTemplate(_RowNormTemplate):
    """aten::_fused_rms_norm (out, rstd) and aten::rms_norm (out): rows as layer_norm, no mean."""

    name = "rms_norm"
    ops = frozenset({"aten::_fused_rms_norm", "aten::rms_norm"})
    rms = True

    def _stat_outputs(self, card: OperatorCard) -> list[int]:
        return [1] if card.op == "aten::_fused_rms_norm" else []


# ------------------------------------------------------------------------------ batch_norm (eval)

_BN_BODY = r"""
typedef $T T;
typedef $TW TW;
typedef $TB TB;
typedef $TM TM;
typedef $TVAR TVAR;
typedef $TSM TSM;
typedef $TSI TSI;
typedef $IDX IDX;                    // element index type (32-bit when the tensor allows)
constexpr int C = $C;
constexpr IDX HW = $HW;              // elements per (n, c) plane
constexpr IDX TOTAL = $TOTAL;
constexpr int V = $V;
constexpr int BLOCK = $BLOCK;
constexpr int U = $U;
constexpr bool HAS_W = $HAS_W, HAS_B = $HAS_B, SAVE = $SAVE;

// Channel parameters as eager's batch_norm_elementwise sees them: mean = running_mean,
// invstd = rsqrt(running_var + eps), weight 1 / bias 0 when absent.
__device__ __forceinline__ float4 bn_channel(int c, float eps, const TW* __restrict__ w,
                                             const TB* __restrict__ bias, const TM* __restrict__ rm,
                                             const TVAR* __restrict__ rv) {
  const float m = kf_f(__ldg(rm + c));
  const float is = rsqrtf(kf_f(__ldg(rv + c)) + eps);
  float wv = 1.f, bv = 0.f;
  if constexpr (HAS_W) wv = kf_f(__ldg(w + c));
  if constexpr (HAS_B) bv = kf_f(__ldg(bias + c));
  return make_float4(m, is, wv, bv);
}

__device__ __forceinline__ float bn_apply(float x, const float4 k) { return ((x - k.x) * k.y) * k.z + k.w; }
"""

_BN_PLANE = r"""
constexpr IDX NC = TOTAL / HW;       // planes
constexpr int XB = $XB;              // blocks per plane

// One plane (n, c) per XB blocks: the channel's parameters are four registers.
extern "C" __global__ void __launch_bounds__(BLOCK)
bn_plane(const T* __restrict__ x, $WB_PARAMS const TM* __restrict__ rm, const TVAR* __restrict__ rv,
         T* __restrict__ y $SAVE_PARAMS, float eps) {
$WB_LOCALS
$SAVE_LOCALS
  const long long L = blockIdx.x;
  const IDX plane = (IDX)(L / XB);
  const int xb = (int)(L % XB);
  if (plane >= NC) return;
  const T* __restrict__ xp = x + plane * HW;
  T* __restrict__ yp = y + plane * HW;
  const int first = xb * BLOCK * U + (int)threadIdx.x;
  float f[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u) {   // loads first: they overlap the parameter fetch below
    const IDX i = (IDX)(first + u * BLOCK) * V;
    if (i < HW) kf_load<T, V, 1>(xp + i, f[u]);
  }
  const int c = (int)(plane % C);
  const float4 k = bn_channel(c, eps, w, bias, rm, rv);
  if constexpr (SAVE) {
    if (plane < C && xb == 0 && threadIdx.x == 0) { save_mean[c] = kf_to<TSM>(k.x); save_invstd[c] = kf_to<TSI>(k.y); }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const IDX i = (IDX)(first + u * BLOCK) * V;
    if (i < HW) {
#pragma unroll
      for (int j = 0; j < V; ++j) f[u][j] = bn_apply(f[u][j], k);
      kf_store<T, V, 1>(yp + i, f[u]);
    }
  }
}
"""

_BN_FLAT = r"""
constexpr IDX EPB = $EPB;            // elements per block, a multiple of BLOCK * V
constexpr int TE = $TE;              // table entries
constexpr bool BY_CHANNEL = $BY_CHANNEL;  // table indexed by channel (else by plane - first plane)

// Flat: each block takes EPB consecutive elements and first tabulates the parameters of the planes
// (or channels) they cover, so the loop is loads, one table read per element and stores.
extern "C" __global__ void __launch_bounds__(BLOCK)
bn_flat(const T* __restrict__ x, $WB_PARAMS const TM* __restrict__ rm, const TVAR* __restrict__ rv,
        T* __restrict__ y $SAVE_PARAMS, float eps) {
$WB_LOCALS
$SAVE_LOCALS
  __shared__ float4 tab[TE];
  const IDX start = (IDX)blockIdx.x * EPB;
  if (start >= TOTAL) return;
  const IDX end = start + EPB < TOTAL ? start + EPB : TOTAL;
  const IDX first = start + (IDX)threadIdx.x * V;
  float f[U][V];
#pragma unroll
  for (int u = 0; u < U; ++u) {   // first batch before the table: the loads overlap its latency
    const IDX i = first + (IDX)u * BLOCK * V;
    if (i < end) kf_load<T, V, 1>(x + i, f[u]);
  }
  const IDX p0 = BY_CHANNEL ? 0 : start / HW;
  const IDX n_entries = BY_CHANNEL ? (IDX)C : (end - 1) / HW - p0 + 1;
  for (IDX e = threadIdx.x; e < n_entries; e += BLOCK) {
    const IDX p = p0 + e;
    const int c = (int)(p % C);
    const float4 k = bn_channel(c, eps, w, bias, rm, rv);
    tab[e] = k;
    if constexpr (SAVE) {
      // Every plane lies in some block's range, so each channel is written (a plane on a block
      // boundary twice, with the same bits).
      if (p < C && (BY_CHANNEL ? blockIdx.x == 0 : true)) {
        save_mean[c] = kf_to<TSM>(k.x);
        save_invstd[c] = kf_to<TSI>(k.y);
      }
    }
  }
  __syncthreads();
  for (IDX base = first; base < end; base += (IDX)BLOCK * V * U) {
    if (base != first) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const IDX i = base + (IDX)u * BLOCK * V;
        if (i < end) kf_load<T, V, 1>(x + i, f[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const IDX i = base + (IDX)u * BLOCK * V;
      if (i < end) {
        if constexpr (HW % V == 0) {
          const float4 k = tab[BY_CHANNEL ? (i / HW) % C : i / HW - p0];
#pragma unroll
          for (int j = 0; j < V; ++j) f[u][j] = bn_apply(f[u][j], k);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j)
            f[u][j] = bn_apply(f[u][j], tab[BY_CHANNEL ? ((i + j) / HW) % C : (i + j) / HW - p0]);
        }
        kf_store<T, V, 1>(y + i, f[u]);
      }
    }
  }
}
"""

_FLAT_ITERS = 4          # most loop trips per thread in the flat kernel (amortises the table)
_FLAT_TABLE_MAX = 2048   # float4 entries: 32 KB of static shared memory


class BatchNormTemplate(Template):
    """Inference batch norm on contiguous [N, C, *] input: per-plane blocks or a flat tabulated grid.

    Writes save_mean/save_invstd when the card has them as [C] (CUDA eager in eval mode: running_mean
    and rsqrt(running_var + eps)); when they are empty ([0], CPU or cuDNN) nothing is launched for them.
    """

    name = "batch_norm"
    ops = frozenset({"aten::native_batch_norm", "aten::_native_batch_norm_legit_no_training",
                     "aten::cudnn_batch_norm"})

    def _eps_name(self, card: OperatorCard) -> str:
        return "epsilon" if card.op == "aten::cudnn_batch_norm" else "eps"

    def _dims(self, card: OperatorCard) -> tuple[int, int, int]:
        x = _arg(card, "input")
        assert x is not None
        shape = [int(s) for s in x["shape"]]
        return shape[0], shape[1], _numel(shape[2:])

    def _save(self, card: OperatorCard) -> bool:
        return _numel(card.outputs[1]["shape"]) > 0

    def accepts(self, card: OperatorCard) -> str | None:
        if card.op not in self.ops:
            return f"op {card.op} is not inference batch_norm"
        if card.op != "aten::_native_batch_norm_legit_no_training" and _value(card, "training") is not False:
            return "training mode (batch statistics) is not handled"
        x = _arg(card, "input")
        why = _tensor_problem(x, "input")
        if why:
            return why
        assert x is not None
        if len(x["shape"]) < 2:
            return "input has fewer than 2 dims"
        eps = _value(card, self._eps_name(card))
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            return "eps is not a finite number"
        n, c, hw = self._dims(card)
        total = n * c * hw
        if total == 0:
            return "empty input"
        for k in ("running_mean", "running_var", "weight", "bias"):
            a = _arg(card, k)
            if not _present(a):
                if k.startswith("running"):
                    return f"{k} is absent (eval mode needs running statistics)"
                continue
            why = _tensor_problem(a, k)
            if why:
                return why
            assert a is not None
            if [int(s) for s in a["shape"]] != [c]:
                return f"{k} shape {a['shape']}, expected [{c}]"
        want = 4 if card.op == "aten::cudnn_batch_norm" else 3
        if len(card.outputs) != want:
            return f"{len(card.outputs)} outputs, expected {want}"
        why = _out_problem(card, 0, x["dtype"], x["shape"])
        if why:
            return why
        save = [_numel(d["shape"]) for d in card.outputs[1:3]]
        if card.op == "aten::cudnn_batch_norm":
            # cuDNN's eval outputs are all empty; anything else would need its own semantics.
            if any(_numel(d["shape"]) for d in card.outputs[1:]):
                return "cudnn_batch_norm with non-empty saved statistics"
        elif save not in ([0, 0], [c, c]):
            return f"save_mean/save_invstd have {save} elements (expected 0 or C={c})"
        elif save == [c, c]:
            why = _out_problem(card, 1, None, [c]) or _out_problem(card, 2, None, [c])
            if why:
                return why
        if not self._plane_ok(card):
            return "more planes than one grid dimension holds"
        return None

    def _flat_table(self, card: OperatorCard, block: int, v: int, u: int) -> tuple[int, int, bool] | None:
        """(elements per block, table entries, by channel) for the flat kernel, or None if no table fits."""
        n, c, hw = self._dims(card)
        # Fewer trips per thread for small tensors: ~4 blocks per SM keep enough loads in flight.
        iters = max(1, min(_FLAT_ITERS, n * c * hw // (block * v * u * 4 * SMS)))
        epb = block * v * u * iters
        by_plane = epb // hw + 2
        if c <= min(by_plane, _FLAT_TABLE_MAX):
            return epb, c, True
        if by_plane <= _FLAT_TABLE_MAX:
            return epb, by_plane, False
        return None

    def _plane_ok(self, card: OperatorCard) -> bool:
        """Whether the plane grid (N*C planes x blocks per plane) fits one grid dimension at any params."""
        n, c, hw = self._dims(card)
        return n * c * -(-hw // 128) <= MAX_I32

    def space(self, card: OperatorCard) -> Mapping[str, Sequence[Any]]:
        x = _arg(card, "input")
        assert x is not None
        n, c, hw = self._dims(card)
        isz = ITEMSIZE[x["dtype"]]
        vecs = _vec_choices(isz, hw, [x, card.outputs[0]])
        flat_vecs = _vec_choices(isz, n * c * hw, [x, card.outputs[0]])
        # Flat first: every thread busy whatever the plane size (a 56x56 plane leaves a quarter of a
        # 512-vector plane block idle), and its table costs a few entries per block.
        strategies = ["flat", "plane"]
        if self._flat_table(card, 128, 1, 1) is None:
            strategies = ["plane"]
        return {
            "strategy": strategies,
            "block": [256, 128, 512],
            "vec": _ordered(flat_vecs[0], flat_vecs) if strategies[0] == "flat" else _ordered(vecs[0], vecs),
            "unroll": [2, 4, 1],
        }

    def render(self, card: OperatorCard, params: Mapping[str, Any]) -> Rendered:
        x = _arg(card, "input")
        assert x is not None
        n, c, hw = self._dims(card)
        total = n * c * hw
        block, u = int(params["block"]), int(params["unroll"])
        isz = ITEMSIZE[x["dtype"]]

        def width(strategy: str) -> int:
            # A width valid for the other strategy only: the widest valid one below it (speed, not meaning).
            valid = _vec_choices(isz, hw if strategy == "plane" else total, [x, card.outputs[0]])
            return next((q for q in valid if q <= int(params["vec"])), valid[-1])

        strategy, v = params["strategy"], width(params["strategy"])
        table = self._flat_table(card, block, v, u) if strategy == "flat" else None
        if strategy == "flat" and table is None:  # no table fits at these params: per-plane blocks
            strategy, v = "plane", width("plane")
        w, b = _arg(card, "weight"), _arg(card, "bias")
        rm, rv = _arg(card, "running_mean"), _arg(card, "running_var")
        assert rm is not None and rv is not None
        has_w, has_b, save = _present(w), _present(b), self._save(card)
        wb_params, wb_locals = _ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        sv_params, sv_locals = _ptr_params([(save, "TSM", "save_mean", ""), (save, "TSI", "save_invstd", "")])
        body = _src(_BN_BODY, T=FLOAT_TYPES[x["dtype"]],
                    TW=FLOAT_TYPES[w["dtype"]] if has_w else "float",  # type: ignore[index]
                    TB=FLOAT_TYPES[b["dtype"]] if has_b else "float",  # type: ignore[index]
                    TM=FLOAT_TYPES[rm["dtype"]], TVAR=FLOAT_TYPES[rv["dtype"]],
                    TSM=FLOAT_TYPES.get(card.outputs[1]["dtype"], "float"),
                    TSI=FLOAT_TYPES.get(card.outputs[2]["dtype"], "float"),
                    IDX="int" if total + 2 * block * v * u * _FLAT_ITERS < MAX_I32 else "long long",
                    C=c, HW=hw, TOTAL=total, V=v, BLOCK=block, U=u, HAS_W=_bool(has_w), HAS_B=_bool(has_b),
                    SAVE=_bool(save))
        sub = {"WB_PARAMS": wb_params + ", " if wb_params else "", "WB_LOCALS": wb_locals,
               "SAVE_PARAMS": ", " + sv_params if sv_params else "", "SAVE_LOCALS": sv_locals}
        if strategy == "plane":
            xb = -(-(hw // v) // (block * u))
            kern = _src(_BN_PLANE, XB=xb, **sub)
            grid = f"input.shape[0] * input.shape[1] * {xb}"
            kernel = "bn_plane"
            how = f"{xb} block(s) per plane"
        else:
            assert table is not None
            epb, te, by_channel = table
            kern = _src(_BN_FLAT, EPB=epb, TE=te, BY_CHANNEL=_bool(by_channel), **sub)
            grid = f"ceil_div(input.numel, {epb})"
            kernel = "bn_flat"
            how = f"{epb} elements per block, {te}-entry {'channel' if by_channel else 'plane'} table"
        source = f"// {card.op} (eval), {card.signature_text}: {strategy}\n" + _COMMON + body + kern
        args = [("ptr", "input")] + [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b
        args += [("ptr", "running_mean"), ("ptr", "running_var"), ("ptr", "out0")]
        args += [("ptr", "out1"), ("ptr", "out2")] if save else []
        args.append(("f32", self._eps_name(card)))
        spec = "\n".join([
            f"# batch_norm (eval) {strategy}: {how}" + ("" if save else "; empty saved statistics: nothing to write"),
            "[[launch]]", f'kernel = "{kernel}"', f'grid = ["{grid}"]', f"block = [{block}]",
            "args = " + _spec_args(args), ""])
        intent = f"batch_norm eval {strategy}: [{n},{c},{hw}], block {block}, vec {v}, unroll {u}, {how}"
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


TEMPLATES: list[Template] = [GroupNormTemplate(), LayerNormTemplate(), RmsNormTemplate(), BatchNormTemplate()]
