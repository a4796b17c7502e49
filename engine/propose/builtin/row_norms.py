"""layer_norm and rms_norm templates: normalise contiguous rows of prod(normalized_shape) elements.

Rendered for one card: the row length, dtypes and which optional tensors exist are compile-time
constants. A row that fits in registers (K vectors per thread) gets exact two-pass statistics from one
read; longer rows stream twice (Welford, or a sum of squares for rms_norm). Statistics are fp32 and the
output formula is eager's: w * (rstd * (x - mean)) + b, or w * (rstd * x).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template

FLT_EPSILON = "1.1920928955078125e-07"  # eps=None in rms_norm: eager uses the fp32 (opmath) epsilon

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
    if constexpr (HAS_MEAN) mean_out[row] = kf_from_float<TS>(mean);
    if constexpr (HAS_RSTD) rstd_out[row] = kf_from_float<TS>(rstd);
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
    if constexpr (HAS_MEAN) mean_out[row] = kf_from_float<TS>(mean);
    if constexpr (HAS_RSTD) rstd_out[row] = kf_from_float<TS>(rstd);
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
        x = cc.raw_arg(card, "input")
        assert x is not None
        ns = [int(s) for s in cc.raw_value(card, "normalized_shape")]
        ncol = math.prod(ns)
        return math.prod(x["shape"]) // max(ncol, 1), ncol

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        if card.op not in self.ops:
            return f"op {card.op} is not {self.name}"
        x = cc.tensor_arg(card, "input")
        why = cc.dense_tensor_problem(x, "input")
        if why:
            return why
        assert x is not None
        ns = cc.raw_value(card, "normalized_shape")
        if not isinstance(ns, list) or not ns or not all(isinstance(s, int) for s in ns):
            return f"normalized_shape {ns!r} is not a non-empty int list"
        shape = [int(s) for s in x["shape"]]
        if len(ns) > len(shape) or shape[len(shape) - len(ns):] != ns:
            return f"normalized_shape {ns} is not the trailing shape of {shape}"
        eps = cc.raw_value(card, self.eps_name)
        eps_ok = isinstance(eps, (int, float)) and not isinstance(eps, bool)
        if not eps_ok and not (self.rms and eps is None):  # rms_norm's eps=None is the fp32 epsilon
            return f"{self.eps_name} {eps!r} is not a finite number"
        m, ncol = self._rows(card)
        if m == 0 or ncol == 0:
            return "empty input"
        if ncol > cc.MAX_I32 // 2:
            return "rows of 2**30 elements or more"
        if m > cc.MAX_I32:
            return "more than 2**31 - 1 rows (one grid dimension)"
        why = cc.affine_problem(card, ns)
        if why:
            return why
        stats = self._stat_outputs(card)
        if len(card.outputs) != 1 + len(stats):
            return f"{len(card.outputs)} outputs, expected {1 + len(stats)}"
        why = cc.output_problem(card, 0, x["dtype"], shape)
        for k in stats:
            why = why or cc.output_problem(card, k, None, None, numel=m)
        if len(stats) == 2 and card.outputs[1]["dtype"] != card.outputs[2]["dtype"]:
            why = why or "mean and rstd outputs differ in dtype"
        return why

    def _tensors(self, card: OperatorCard) -> list[dict[str, Any]]:
        """Tensors the row kernels access with vectors: input, out0 and the present weight/bias."""
        out = [card.outputs[0]]
        for k in ("input", "weight", "bias"):
            a = cc.tensor_arg(card, k)
            if a is not None:
                out.append(a)
        return out

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        x = cc.raw_arg(card, "input")
        assert x is not None
        _, ncol = self._rows(card)
        vecs = cc.vec_choices(cc.itemsize(x["dtype"]), ncol, self._tensors(card))
        nv = ncol // vecs[0]
        # Threads per row: up to 4 vectors each (one warp per row for short rows), ~256 threads per block.
        per_thread = -(-nv // 4)
        tpr = min(1024, max(32, -(-per_thread // 32) * 32))
        rpb = 1 << (max(1, 256 // tpr).bit_length() - 1)
        return {
            "block": cc.ordered(tpr * rpb, [256, 128, 512, 1024]),
            "rows_per_block": cc.ordered(rpb, [1, 2, 4, 8, 16]),
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

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        x = cc.raw_arg(card, "input")
        assert x is not None
        m, ncol = self._rows(card)
        geo = self.geometry(card, params)
        w, b = cc.tensor_arg(card, "weight"), cc.tensor_arg(card, "bias")
        has_w, has_b = w is not None, b is not None
        stats = self._stat_outputs(card)
        has_mean = not self.rms and len(stats) == 2
        has_rstd = bool(stats)
        ts = cc.ctype(card.outputs[stats[0]]["dtype"]) if stats else "float"
        kernel = f"{'rms' if self.rms else 'ln'}_{'regs' if geo['regs'] else 'stream'}"
        wb_params, wb_locals = cc.ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        st_params, st_locals = cc.ptr_params([(has_mean, "TS", "mean_out", ""), (has_rstd, "TS", "rstd_out", "")])
        body = cc.substitute(_ROWS_BODY, T=cc.ctype(x["dtype"]),
                    TW=cc.ctype(w["dtype"]) if w is not None else "float",
                    TB=cc.ctype(b["dtype"]) if b is not None else "float",
                    TS=ts, NCOL=ncol, M=m, V=params["vec"], TPR=geo["tpr"], RPB=geo["rpb"], K=geo["k"],
                    RMS=cc.cbool(self.rms), HAS_W=cc.cbool(has_w), HAS_B=cc.cbool(has_b), HAS_MEAN=cc.cbool(has_mean),
                    HAS_RSTD=cc.cbool(has_rstd))
        kern = cc.substitute(_ROWS_REGS if geo["regs"] else _ROWS_STREAM, KERNEL=kernel,
                    WB_PARAMS=wb_params + ", " if wb_params else "",
                    STAT_PARAMS=", " + st_params if st_params else "", WB_LOCALS=wb_locals, STAT_LOCALS=st_locals)
        dtypes = [x["dtype"], *(card.outputs[k]["dtype"] for k in stats), *(t["dtype"] for t in (w, b) if t is not None)]
        source = (f"// {card.op}, {card.signature_text}\n" + cc.prelude(dtypes, reduce=True, hinted=True, welford=True)
                  + body + kern)
        eps = cc.raw_value(card, self.eps_name)
        args = [("ptr", "input")] + [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b + [("ptr", "out0")]
        args += [("ptr", f"out{k}") for k in stats]
        args.append(("f32", FLT_EPSILON if eps is None else self.eps_name))
        rows_per_block = geo["rpb"]
        spec = "\n".join([
            f"# {self.name}: {geo['tpr']} threads per row, {rows_per_block} rows per block",
            "[[launch]]", f'kernel = "{kernel}"',
            f'grid = ["ceil_div(input.numel // {ncol}, {rows_per_block})"]',
            f"block = [{geo['tpr'] * rows_per_block}]", "args = " + cc.spec_args(args), ""])
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


TEMPLATES: list[Template] = [LayerNormTemplate(), RmsNormTemplate()]
