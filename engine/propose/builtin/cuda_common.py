"""Shared pieces of the builtin templates: dtype tables, CUDA snippets and card/layout helpers.

CUDA snippets (prepend `prelude(dtypes, ...)` to a kernel source; every name starts with `kf_`):
  INFINITY     defined when NVRTC's environment lacks it (no <math.h>).
  conversions  kf_to_float(x) for float/__half/__nv_bfloat16; kf_from_float<T>(float) rounds to nearest
               even once (as eager's final cast does); kf_round<T>(float) = the value rounded to T and back.
  vectors      kf_vec<T, N>: N elements of T aligned to min(16, N*sizeof(T)) bytes, so one struct copy is
               one (or two) 16-byte loads; kf_load_vec<N>(ptr, float[N]) and kf_store_vec<N>(ptr, float[N])
               convert while they move (the pointer must be aligned to that many bytes).
  reductions   kf_warp_sum/kf_warp_max(v, width): butterfly (xor) reduction over `width` lanes (a power of
               two ≤ 32); every lane gets the result, in an order that does not depend on timing.
               kf_block_sum/kf_block_max(v, scratch): whole-block reduction through `scratch` (≥ 32 floats of
               shared memory); blockDim.x must be a multiple of 32; every thread gets the result; safe to
               call back to back with the same scratch.
               kf_lse_merge(m, s, m2, s2): merges two (max, sum of exp(x - max)) pairs (online softmax).
  hinted       kf_load<E, NV, HINT>(p, float*) / kf_store<E, NV, HINT>(p, const float*): NV elements moved
               in raw words of up to 16 bytes with a cache policy (0 default, 1 streaming, 2 read-only).
  welford      KfWf (count, mean, M2) with kf_wf_merge (Chan), kf_wf_add<NV> (exact moments of NV values
               merged once), kf_wf_warp / kf_wf_block<NWARP> (fixed-tree reductions, same bits everywhere).
  clusters     kf_cluster_sync(): barrier of a thread block cluster (kernel declared __cluster_dims__),
               release/acquire at cluster scope (sm_90); between `// kf-cluster-begin/end` markers so a
               CPU emulation can substitute it.
  async        kf_async_copy16 / kf_async_commit / kf_async_wait<N>: cp.async (sm_80 on), between
               `// kf-async-begin/end` markers likewise.

Python helpers:
  dtypes       DTYPES / SUPPORTED (float32, float16, bfloat16), ctype(), itemsize(), includes(), prelude(),
               int_type(extent) (32-bit index math when it fits).
  hardware     has_clusters(hw): whether thread-block cluster kernels may be offered to the GPU.
  numbers      f32(x) (host static_cast<float>), float_literal(x) (exact fp32 C literal).
  cards        tensor_arg(), value_arg() (decoded), raw_arg(), raw_value() (as stored), check_tensor()
               (dtype/cuda/neg/conj reason), dense_tensor_problem() (also row-major), usable_tensor() /
               single_output() (or Decline with that reason), aliased_with().
  layout       contiguous_strides(), meaningful_strides(), is_contiguous(), dense_order() (dims of a dense
               tensor, outermost first), coalesce() (merge dims all tensors walk as one), offset_code()
               (C expression: flat index -> strided offset, sizes and strides baked in).
  codegen      substitute() ($NAME templates), cbool(), ptr_params() (absent tensors as nullptr locals),
               spec_args() (a TOML args list), vec_choices() (aligned vector widths), ordered().
  search       mutate_relevant(): Template.mutate limited to the parameters that matter for the current
               strategy, others reset to defaults (so equal kernels have equal parameters).
Other template families import from here: names and behaviour are kept stable.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from string import Template as _Text
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware

# ----------------------------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class DType:
    """A floating dtype the builtin kernels read and write."""

    name: str           # as in signatures: 'bfloat16'
    ctype: str          # CUDA type: '__nv_bfloat16'
    itemsize: int
    header: str | None  # the header that defines ctype


DTYPES: dict[str, DType] = {
    "float32": DType("float32", "float", 4, None),
    "float16": DType("float16", "__half", 2, "cuda_fp16.h"),
    "bfloat16": DType("bfloat16", "__nv_bfloat16", 2, "cuda_bf16.h"),
}
SUPPORTED = tuple(DTYPES)
MAX_I32 = 2**31 - 1  # one grid dimension's block count, and 32-bit signed index math


def ctype(dtype: str) -> str:
    """CUDA type name of a supported dtype."""
    return DTYPES[dtype].ctype


def itemsize(dtype: str) -> int:
    """Bytes per element of a supported dtype."""
    return DTYPES[dtype].itemsize


def math_choices(dtype: str) -> list[str]:
    """A template's `math` parameter values, the first tried first: the fast forms (hardware exponential,
    approximate division) first where the output is half precision, whose rounding hides their few fp32 ulps;
    eager's formulas first for fp32, held to fp32 tolerances. Verification decides per card either way."""
    return ["fast", "precise"] if itemsize(dtype) == 2 else ["precise", "fast"]


# -------------------------------------------------------------------------------------- CUDA snippets

_CONVERT_F32 = r"""
#ifndef INFINITY  // NVRTC has no <math.h> macros
#define INFINITY __int_as_float(0x7f800000)
#endif
__device__ __forceinline__ float kf_to_float(float x) { return x; }
template <typename T> __device__ __forceinline__ T kf_from_float(float x);
template <> __device__ __forceinline__ float kf_from_float<float>(float x) { return x; }
"""
_CONVERT_F16 = r"""
__device__ __forceinline__ float kf_to_float(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ __half kf_from_float<__half>(float x) { return __float2half_rn(x); }
"""
_CONVERT_BF16 = r"""
__device__ __forceinline__ float kf_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ __nv_bfloat16 kf_from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
"""
_ROUND = r"""
// The value x takes once stored as T (eager rounds some intermediates to the tensor dtype).
template <typename T> __device__ __forceinline__ float kf_round(float x) { return kf_to_float(kf_from_float<T>(x)); }
"""

VEC = r"""
// N elements moved as one aligned struct: the compiler emits 16-byte (or 8/4-byte) vector accesses.
template <typename T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) kf_vec { T v[N]; };
template <int N, typename T>
__device__ __forceinline__ void kf_load_vec(const T* p, float (&out)[N]) {
  const kf_vec<T, N> w = *reinterpret_cast<const kf_vec<T, N>*>(p);
  #pragma unroll
  for (int k = 0; k < N; ++k) out[k] = kf_to_float(w.v[k]);
}
template <int N, typename T>
__device__ __forceinline__ void kf_store_vec(T* p, const float (&in)[N]) {
  kf_vec<T, N> w;
  #pragma unroll
  for (int k = 0; k < N; ++k) w.v[k] = kf_from_float<T>(in[k]);
  *reinterpret_cast<kf_vec<T, N>*>(p) = w;
}
"""

REDUCE = r"""
// Butterfly reductions: every lane ends with the same, timing-independent result.
__device__ __forceinline__ float kf_warp_sum(float v, int width = 32) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) if (o < width) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float kf_warp_max(float v, int width = 32) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) if (o < width) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Whole-block reductions (blockDim.x a multiple of 32); the leading barrier lets callers reuse scratch.
__device__ __forceinline__ float kf_block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = kf_warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  return kf_warp_sum(v);
}
__device__ __forceinline__ float kf_block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = kf_warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return kf_warp_max(v);
}
// (m, s) <- merge of (m, s) and (m2, s2), where s = sum of exp(x - m); an empty side has m = -inf, s = 0.
__device__ __forceinline__ void kf_lse_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty: exp(-inf - -inf) would be NaN
  s = (m == -INFINITY ? 0.f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - mn));
  m = mn;
}
"""

CLUSTER = r"""
// kf-cluster-begin: thread block clusters (sm_90). Every block of the kernel's cluster
// (__cluster_dims__) meets here; arrive releases and wait acquires at cluster scope, so global writes
// made before the barrier are visible to the whole cluster after it (read them with __ldcg: from L2).
__device__ __forceinline__ void kf_cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
}
// kf-cluster-end
"""

ASYNC = r"""
// kf-async-begin: cp.async (sm_80 on): 16-byte copies from global to shared memory that land in the
// background. kf_async_commit() closes this thread's group of copies; kf_async_wait<N>() returns once at
// most N of its groups are still in flight (the copies are this thread's: read them back from the same
// thread, or meet at a __syncthreads() first).
__device__ __forceinline__ void kf_async_copy16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void kf_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void kf_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// kf-async-end
"""

HINTED = r"""
// A raw word of B bytes: one memory instruction moves it (B <= 16).
template <int B> struct KfRaw;
template <> struct KfRaw<2> { typedef unsigned short Word; };
template <> struct KfRaw<4> { typedef unsigned int Word; };
template <> struct KfRaw<8> { typedef uint2 Word; };
template <> struct KfRaw<16> { typedef uint4 Word; };

// Loads under an L2 eviction policy (sm_80 on): `pol` from createpolicy.
__device__ __forceinline__ unsigned short kf_ld_pol(const unsigned short* p, unsigned long long pol) {
  unsigned short r;
  asm volatile("ld.global.L2::cache_hint.b16 %0, [%1], %2;" : "=h"(r) : "l"(p), "l"(pol));
  return r;
}
__device__ __forceinline__ unsigned int kf_ld_pol(const unsigned int* p, unsigned long long pol) {
  unsigned int r;
  asm volatile("ld.global.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(pol));
  return r;
}
__device__ __forceinline__ uint2 kf_ld_pol(const uint2* p, unsigned long long pol) {
  uint2 r;
  asm volatile("ld.global.L2::cache_hint.v2.b32 {%0, %1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(pol));
  return r;
}
__device__ __forceinline__ uint4 kf_ld_pol(const uint4* p, unsigned long long pol) {
  uint4 r;
  asm volatile("ld.global.L2::cache_hint.v4.b32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol));
  return r;
}

// Cache policy. 0: default (data read again soon stays in L2), 1: streaming (last use, evict first),
// 2: read-only path (small tensors every block reads: weights, running stats), 3: read again soon, kept in
// L2 ahead of other lines (evict_last; a pass whose data a second pass re-reads), 4: last use of data
// loaded with 3 (evict_first, so it leaves L2 first). 3 and 4 are 0 and 1 before sm_80.
template <int HINT, typename Word> __device__ __forceinline__ Word kf_ld(const Word* p) {
  if constexpr (HINT == 1) return __ldcs(p);
  else if constexpr (HINT == 2) return __ldg(p);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  else if constexpr (HINT == 3) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    return kf_ld_pol(p, pol);
  } else if constexpr (HINT == 4) {
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return kf_ld_pol(p, pol);
  }
#else
  else if constexpr (HINT == 4) return __ldcs(p);
#endif
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
    for (int j = 0; j < PER; ++j) f[k * PER + j] = kf_to_float(e[j]);
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
    for (int j = 0; j < PER; ++j) e[j] = kf_from_float<E>(f[k * PER + j]);
    if constexpr (HINT == 1) __stcs(reinterpret_cast<Word*>(p + k * PER), r);
    else *reinterpret_cast<Word*>(p + k * PER) = r;
  }
}
"""

WELFORD = r"""
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
"""


def includes(dtypes: Iterable[str]) -> str:
    """The #include lines the dtypes need (only those: each header costs NVRTC time)."""
    headers = sorted({DTYPES[d].header for d in dtypes if DTYPES[d].header})
    return "".join(f"#include <{h}>\n" for h in headers)


def prelude(dtypes: Iterable[str], *, vec: bool = False, reduce: bool = False, round_: bool = False,
            cluster: bool = False, hinted: bool = False, welford: bool = False, async_copy: bool = False) -> str:
    """Includes + conversions for `dtypes`, plus the vector / reduction / rounding / cluster / hinted
    load-store / Welford / cp.async snippets."""
    ds = set(dtypes) | {"float32"}
    parts = [includes(ds), _CONVERT_F32]
    if "float16" in ds:
        parts.append(_CONVERT_F16)
    if "bfloat16" in ds:
        parts.append(_CONVERT_BF16)
    if round_:
        parts.append(_ROUND)
    if vec:
        parts.append(VEC)
    if reduce:
        parts.append(REDUCE)
    if cluster:
        parts.append(CLUSTER)
    if hinted:
        parts.append(HINTED)
    if welford:
        parts.append(WELFORD)
    if async_copy:
        parts.append(ASYNC)
    return "".join(parts)


# ------------------------------------------------------------------------------------------ hardware


def has_clusters(hw: Hardware) -> bool:
    """Whether thread-block cluster kernels (__cluster_dims__, barrier.cluster) may be offered to `hw`
    (`Hardware.clusters`: the device reports cluster launch and its arch is one the cluster kernels are
    proven on, see `engine.propose.base.arch_has_clusters`)."""
    return bool(hw.clusters)


# ------------------------------------------------------------------------------------------- numbers


def f32(x: float) -> float:
    """x rounded to the nearest float32 (as a host-side static_cast<float> does); ±inf beyond its range."""
    try:
        return struct.unpack("<f", struct.pack("<f", float(x)))[0]
    except OverflowError:
        return math.copysign(math.inf, float(x))


def float_literal(x: float) -> str:
    """A CUDA float literal of f32(x) that parses back to exactly that float ('1.00000005e-06f')."""
    v = f32(x)
    if not math.isfinite(v):
        raise ValueError(f"{x!r} is not a finite float32")
    return f"{v:.9e}f"  # 9 significant digits round-trip every float32


def int_type(extent: int) -> str:
    """Index type for offsets below `extent`: 32-bit unsigned arithmetic is cheaper when it fits."""
    return "unsigned" if extent < 2**31 else "unsigned long long"


# --------------------------------------------------------------------------------------- card access


def tensor_arg(card: OperatorCard, name: str) -> dict[str, Any] | None:
    """The signature entry of tensor argument `name` (None if missing, absent or not a tensor)."""
    for a in card.signature.get("args", []):
        if a.get("name") == name:
            if a.get("kind") != "tensor" or a.get("absent"):
                return None
            return a
    return None


_MISSING = object()


def value_arg(card: OperatorCard, name: str, default: Any = _MISSING) -> Any:
    """The decoded value of non-tensor argument `name` (KeyError when missing and no default)."""
    from engine.capture.signature import decode_value  # torch import deferred to first use

    for a in card.signature.get("args", []):
        if a.get("name") == name and a.get("kind") == "value":
            return decode_value(a.get("value"))
    if default is _MISSING:
        raise KeyError(name)
    return default


def raw_arg(card: OperatorCard, name: str) -> dict[str, Any] | None:
    """The signature entry of argument `name`, whatever its kind."""
    return next((a for a in card.signature.get("args", []) if a.get("name") == name), None)


def raw_value(card: OperatorCard, name: str) -> Any:
    """Argument `name`'s value as the signature stores it (None when missing): plain JSON numbers, lists
    and None pass through; special floats stay encoded (so a check for a finite number declines them)."""
    a = raw_arg(card, name)
    return None if a is None else a.get("value")


class Decline(Exception):
    """This card is outside what a template computes exactly (the message says why)."""


def why_declined(analyse: Callable[[OperatorCard], Any], card: OperatorCard) -> str | None:
    """A template's `accepts`: None when `analyse(card)` succeeds, else why not (a Decline's message, or a
    signature of a shape the analysis did not expect)."""
    try:
        analyse(card)
    except Decline as e:
        return str(e)
    except (KeyError, TypeError, ValueError) as e:
        return f"unexpected signature ({type(e).__name__}: {e})"
    return None


def usable_tensor(card: OperatorCard, name: str) -> dict[str, Any]:
    """Tensor argument `name`'s signature entry; Decline with the reason when a builtin kernel cannot use it."""
    x = tensor_arg(card, name)
    why = check_tensor(x, name)
    if why:
        raise Decline(why)
    assert x is not None
    return x


def single_output(card: OperatorCard) -> dict[str, Any]:
    """The op's one output; Decline when it has several or a builtin kernel cannot write it."""
    if len(card.outputs) != 1:
        raise Decline(f"{len(card.outputs)} outputs")
    out = card.outputs[0]
    why = check_tensor(out, "output")
    if why:
        raise Decline(why)
    return out


def check_tensor(desc: dict[str, Any] | None, what: str, dtypes: Sequence[str] = SUPPORTED) -> str | None:
    """Why a tensor descriptor is unusable by a builtin kernel (None if usable)."""
    if desc is None:
        return f"{what} is not a tensor"
    if desc.get("dtype") not in dtypes:
        return f"{what} dtype {desc.get('dtype')} not in {'/'.join(dtypes)}"
    if desc.get("device", "cuda") != "cuda":
        return f"{what} is on {desc.get('device')}, not cuda"
    if desc.get("neg") or desc.get("conj"):
        return f"{what} carries a lazy neg/conj bit"
    if len(desc.get("shape", [])) != len(desc.get("stride", [])):
        return f"{what} has mismatched shape/stride"
    return None


def dense_tensor_problem(desc: dict[str, Any] | None, what: str) -> str | None:
    """Why a tensor descriptor is not one a row-major kernel reads (None: a usable, contiguous tensor)."""
    if desc is None or desc.get("kind", "tensor") != "tensor":
        return f"{what} is missing or not a tensor"
    why = check_tensor(desc, what)
    if why:
        return why
    if not is_contiguous(desc["shape"], desc["stride"]):
        return f"{what} is not contiguous (strides {desc['stride']} for shape {desc['shape']})"
    return None


def affine_problem(card: OperatorCard, shape: Sequence[int]) -> str | None:
    """Why the present `weight`/`bias` cannot be read as contiguous per-element parameters of `shape`."""
    for k in ("weight", "bias"):
        a = tensor_arg(card, k)
        if a is not None:
            why = dense_tensor_problem(a, k)
            if why:
                return why
            if [int(s) for s in a["shape"]] != list(shape):
                return f"{k} shape {a['shape']}, expected {list(shape)}"
    return None


def output_problem(card: OperatorCard, k: int, dtype: str | None, shape: Sequence[int] | None,
                   numel: int | None = None, *, dense: bool = False) -> str | None:
    """Why output `k` is not a contiguous float tensor (of `dtype`, `shape` or `numel` elements when given).
    With `dense`, any dense non-overlapping layout will do (eager's output of a permuted input keeps the
    permutation; the template then stores through the output's strides)."""
    if k >= len(card.outputs):
        return f"output {k} missing"
    d = card.outputs[k]
    if d.get("dtype") not in DTYPES:
        return f"output {k} dtype {d.get('dtype')}"
    if dtype is not None and d["dtype"] != dtype:
        return f"output {k} is {d['dtype']}, expected {dtype}"
    if shape is not None and list(d["shape"]) != list(shape):
        return f"output {k} shape {d['shape']}, expected {list(shape)}"
    if numel is not None and math.prod(d["shape"]) != numel:
        return f"output {k} has {math.prod(d['shape'])} elements, expected {numel}"
    if dense and dense_order(d["shape"], d["stride"]) is None:
        return f"output {k} is not dense (strides {d['stride']} for shape {d['shape']})"
    if not dense and not is_contiguous(d["shape"], d["stride"]):
        return f"output {k} is not contiguous"
    return None


def aliased_with(card: OperatorCard, name: str) -> bool:
    """True when argument `name` shares storage with another argument."""
    return any(name in group for group in card.signature.get("aliases", []))


# -------------------------------------------------------------------------------------------- layout


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides of `shape`."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return strides[::-1]


def meaningful_strides(shape: Sequence[int], stride: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """(dim, stride) of dims of size > 1 (a size-1 dim's stride never addresses a second element)."""
    return tuple((d, int(s)) for d, (n, s) in enumerate(zip(shape, stride)) if n > 1)


def is_contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Row-major contiguous, ignoring the strides of size-1 dims (as torch does)."""
    return meaningful_strides(shape, stride) == meaningful_strides(shape, contiguous_strides(shape))


def channels_last(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """[N, C, *spatial] laid out as [N, *spatial, C] contiguous (the channels innermost), C > 1; size-1
    dims' strides do not matter (as torch's own check)."""
    if len(shape) < 3 or int(shape[1]) <= 1:
        return False
    order = [0, *range(2, len(shape)), 1]
    return is_contiguous([int(shape[d]) for d in order], [int(stride[d]) for d in order])


def dense_order(shape: Sequence[int], stride: Sequence[int]) -> list[int] | None:
    """engine.capture.signature.dense_order (imported on first use, with torch)."""
    from engine.capture.signature import dense_order as order

    return order(shape, stride)


def coalesce(sizes: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims (outermost first) that every tensor walks as one: stride[i] == stride[i+1] *
    size[i+1] for all. `strides` holds one stride list per tensor; size-1 dims are dropped first."""
    keep = [i for i, n in enumerate(sizes) if n != 1]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i in keep:
        if out_sizes and all(st[-1] == s[i] * sizes[i] for st, s in zip(out_strides, strides)):
            out_sizes[-1] *= sizes[i]
            for st, s in zip(out_strides, strides):
                st[-1] = s[i]
            continue
        out_sizes.append(int(sizes[i]))
        for st, s in zip(out_strides, strides):
            st.append(int(s[i]))
    return out_sizes, out_strides


def offset_code(index: str, sizes: Sequence[int], strides: Sequence[int], itype: str) -> str:
    """A C expression: the element offset of row-major flat `index` over `sizes` with `strides`
    (sizes and strides are baked in, so the compiler turns / and % into multiply-shift)."""
    if not sizes:
        return "0"
    if len(sizes) == 1:
        return f"({index}) * ({itype}){strides[0]}" if strides[0] != 1 else f"({index})"
    terms = []
    inner = 1
    for d in range(len(sizes) - 1, -1, -1):
        n, s = sizes[d], strides[d]
        coord = f"({index})" if inner == 1 else f"(({index}) / ({itype}){inner})"
        if d > 0:
            coord = f"({coord} % ({itype}){n})"
        inner *= n
        if s == 0:
            continue
        terms.append(coord if s == 1 else f"{coord} * ({itype}){s}")
    return " + ".join(terms) if terms else "0"


# ------------------------------------------------------------------------------------------- codegen


def substitute(text: str, **kw: Any) -> str:
    """`text` with every $NAME replaced by str(kw[NAME]) (KeyError for one not given)."""
    return _Text(text).substitute({k: str(v) for k, v in kw.items()})


def cbool(v: bool) -> str:
    """A C++ bool literal."""
    return "true" if v else "false"


def ptr_params(decls: Sequence[tuple[bool, str, str, str]]) -> tuple[str, str]:
    """Kernel parameters for present tensors, and local nullptr stand-ins for absent ones (so the body
    compiles; `if constexpr` removes every use). Each decl: (present, ctype, name, "const " or "")."""
    params, locals_ = [], []
    for present, ctype_, name, const in decls:
        decl = f"{const}{ctype_}* __restrict__ {name}"
        if present:
            params.append(decl)
        else:
            locals_.append(f"  {const}{ctype_}* {name} = nullptr; (void){name};")
    return ", ".join(params), "\n".join(locals_)


def spec_args(items: Sequence[tuple[str, str]]) -> str:
    """A launch spec's `args` list: [(ctype, value)] -> '[{ ptr = "input" }, ...]'."""
    return "[" + ", ".join(f'{{ {k} = "{v}" }}' for k, v in items) + "]"


def vec_choices(isz: int, divides: int, tensors: Sequence[Mapping[str, Any]]) -> list[int]:
    """Vector widths (elements, widest first, at most 16 bytes) that divide `divides` and keep every
    tensor's accesses aligned (each needs min(16, width * itemsize) bytes)."""
    out = []
    v = 16 // isz
    while v >= 1:
        if divides % v == 0 and all(int(d.get("align", 16)) >= min(16, v * itemsize(d["dtype"])) for d in tensors):
            out.append(v)
        v //= 2
    return out


def ordered(default: Any, values: Sequence[Any]) -> list[Any]:
    """`values` with `default` first and no repeats."""
    out = [default]
    for v in values:
        if v not in out:
            out.append(v)
    return out


# ------------------------------------------------------------------------------------ search helpers


def mutate_relevant(space: Mapping[str, Sequence[Any]], params: Mapping[str, Any],
                    relevant: Callable[[Mapping[str, Any]], set[str]], rng: random.Random,
                    focus_keys: Iterable[str] = ()) -> dict[str, Any]:
    """Template.mutate for templates whose parameters matter only for some strategies: change one
    parameter among those `relevant(params)` names (preferring `focus_keys`), then reset every
    parameter that no longer matters to its default, so equal kernels have equal parameters."""
    default = {k: v[0] for k, v in space.items()}

    def normalise(p: Mapping[str, Any]) -> dict[str, Any]:
        full = {**default, **{k: v for k, v in p.items() if k in default}}
        rel = relevant(full)
        return {k: (full[k] if k in rel else default[k]) for k in default}

    current = normalise(params)
    keys = [k for k, v in space.items() if len(v) > 1 and k in relevant(current)]
    if not keys:
        return current
    focus = [k for k in keys if k in set(focus_keys)]
    key = rng.choice(focus or keys)
    values = [v for v in space[key] if v != current[key]]
    return normalise({**current, key: rng.choice(values)})
