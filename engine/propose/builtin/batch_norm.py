"""batch_norm template (inference): eval-mode batch norm on contiguous [N, C, *] input, for one card.

y = ((x - running_mean) * rsqrt(running_var + eps)) * weight + bias, in fp32 as eager's
batch_norm_elementwise computes it, rounded once. Strategies: `plane` (blocks per (n, c) plane, the
channel's parameters in registers) and `flat` (each block takes a run of elements and first tabulates
the parameters of the planes or channels it covers in shared memory).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template

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
  const float m = kf_to_float(__ldg(rm + c));
  const float is = rsqrtf(kf_to_float(__ldg(rv + c)) + eps);
  float wv = 1.f, bv = 0.f;
  if constexpr (HAS_W) wv = kf_to_float(__ldg(w + c));
  if constexpr (HAS_B) bv = kf_to_float(__ldg(bias + c));
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
    if (plane < C && xb == 0 && threadIdx.x == 0) { save_mean[c] = kf_from_float<TSM>(k.x); save_invstd[c] = kf_from_float<TSI>(k.y); }
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
        save_mean[c] = kf_from_float<TSM>(k.x);
        save_invstd[c] = kf_from_float<TSI>(k.y);
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
        x = cc.raw_arg(card, "input")
        assert x is not None
        shape = [int(s) for s in x["shape"]]
        return shape[0], shape[1], math.prod(shape[2:])

    def _save(self, card: OperatorCard) -> bool:
        return math.prod(card.outputs[1]["shape"]) > 0

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        if card.op not in self.ops:
            return f"op {card.op} is not inference batch_norm"
        if card.op != "aten::_native_batch_norm_legit_no_training" and cc.raw_value(card, "training") is not False:
            return "training mode (batch statistics) is not handled"
        x = cc.raw_arg(card, "input")
        why = cc.dense_tensor_problem(x, "input")
        if why:
            return why
        assert x is not None
        if len(x["shape"]) < 2:
            return "input has fewer than 2 dims"
        eps = cc.raw_value(card, self._eps_name(card))
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            return "eps is not a finite number"
        n, c, plane = self._dims(card)
        total = n * c * plane
        if total == 0:
            return "empty input"
        for k in ("running_mean", "running_var", "weight", "bias"):
            a = cc.tensor_arg(card, k)
            if a is None:
                if k.startswith("running"):
                    return f"{k} is absent (eval mode needs running statistics)"
                continue
            why = cc.dense_tensor_problem(a, k)
            if why:
                return why
            if [int(s) for s in a["shape"]] != [c]:
                return f"{k} shape {a['shape']}, expected [{c}]"
        want = 4 if card.op == "aten::cudnn_batch_norm" else 3
        if len(card.outputs) != want:
            return f"{len(card.outputs)} outputs, expected {want}"
        why = cc.output_problem(card, 0, x["dtype"], x["shape"])
        if why:
            return why
        save = [math.prod(d["shape"]) for d in card.outputs[1:3]]
        if card.op == "aten::cudnn_batch_norm":
            # cuDNN's eval outputs are all empty; anything else would need its own semantics.
            if any(math.prod(d["shape"]) for d in card.outputs[1:]):
                return "cudnn_batch_norm with non-empty saved statistics"
        elif save not in ([0, 0], [c, c]):
            return f"save_mean/save_invstd have {save} elements (expected 0 or C={c})"
        elif save == [c, c]:
            why = cc.output_problem(card, 1, None, [c]) or cc.output_problem(card, 2, None, [c])
            if why:
                return why
        if not self._plane_ok(card):
            return "more planes than one grid dimension holds"
        return None

    def _flat_table(self, card: OperatorCard, block: int, v: int, u: int,
                    hw: Hardware) -> tuple[int, int, bool] | None:
        """(elements per block, table entries, by channel) for the flat kernel, or None if no table fits."""
        n, c, plane = self._dims(card)
        # Fewer trips per thread for small tensors: ~4 blocks per SM keep enough loads in flight.
        iters = max(1, min(_FLAT_ITERS, n * c * plane // (block * v * u * 4 * hw.sms)))
        epb = block * v * u * iters
        by_plane = epb // plane + 2
        if c <= min(by_plane, _FLAT_TABLE_MAX):
            return epb, c, True
        if by_plane <= _FLAT_TABLE_MAX:
            return epb, by_plane, False
        return None

    def _plane_ok(self, card: OperatorCard) -> bool:
        """Whether the plane grid (N*C planes x blocks per plane) fits one grid dimension at any params."""
        n, c, plane = self._dims(card)
        return n * c * -(-plane // 128) <= cc.MAX_I32

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        x = cc.raw_arg(card, "input")
        assert x is not None
        n, c, plane = self._dims(card)
        isz = cc.itemsize(x["dtype"])
        vecs = cc.vec_choices(isz, plane, [x, card.outputs[0]])
        flat_vecs = cc.vec_choices(isz, n * c * plane, [x, card.outputs[0]])
        # Flat first: every thread busy whatever the plane size (a 56x56 plane leaves a quarter of a
        # 512-vector plane block idle), and its table costs a few entries per block.
        strategies = ["flat", "plane"]
        if self._flat_table(card, 128, 1, 1, hw) is None:
            strategies = ["plane"]
        return {
            "strategy": strategies,
            "block": [256, 128, 512],
            "vec": cc.ordered(flat_vecs[0], flat_vecs) if strategies[0] == "flat" else cc.ordered(vecs[0], vecs),
            "unroll": [2, 4, 1],
        }

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        x = cc.raw_arg(card, "input")
        assert x is not None
        n, c, plane = self._dims(card)
        total = n * c * plane
        block, u = int(params["block"]), int(params["unroll"])
        isz = cc.itemsize(x["dtype"])

        def width(strategy: str) -> int:
            # A width valid for the other strategy only: the widest valid one below it (speed, not meaning).
            valid = cc.vec_choices(isz, plane if strategy == "plane" else total, [x, card.outputs[0]])
            return next((q for q in valid if q <= int(params["vec"])), valid[-1])

        strategy, v = params["strategy"], width(params["strategy"])
        table = self._flat_table(card, block, v, u, hw) if strategy == "flat" else None
        if strategy == "flat" and table is None:  # no table fits at these params: per-plane blocks
            strategy, v = "plane", width("plane")
        w, b = cc.tensor_arg(card, "weight"), cc.tensor_arg(card, "bias")
        rm, rv = cc.raw_arg(card, "running_mean"), cc.raw_arg(card, "running_var")
        assert rm is not None and rv is not None
        has_w, has_b, save = w is not None, b is not None, self._save(card)
        # Saved statistics of any dtype eager gives them (their type is moot when they are empty).
        tsm, tsi = (d["dtype"] if d["dtype"] in cc.DTYPES else "float32" for d in card.outputs[1:3])
        wb_params, wb_locals = cc.ptr_params([(has_w, "TW", "w", "const "), (has_b, "TB", "bias", "const ")])
        sv_params, sv_locals = cc.ptr_params([(save, "TSM", "save_mean", ""), (save, "TSI", "save_invstd", "")])
        body = cc.substitute(_BN_BODY, T=cc.ctype(x["dtype"]),
                    TW=cc.ctype(w["dtype"]) if w is not None else "float",
                    TB=cc.ctype(b["dtype"]) if b is not None else "float",
                    TM=cc.ctype(rm["dtype"]), TVAR=cc.ctype(rv["dtype"]),
                    TSM=cc.ctype(tsm), TSI=cc.ctype(tsi),
                    IDX="int" if total + 2 * block * v * u * _FLAT_ITERS < cc.MAX_I32 else "long long",
                    C=c, HW=plane, TOTAL=total, V=v, BLOCK=block, U=u, HAS_W=cc.cbool(has_w), HAS_B=cc.cbool(has_b),
                    SAVE=cc.cbool(save))
        sub = {"WB_PARAMS": wb_params + ", " if wb_params else "", "WB_LOCALS": wb_locals,
               "SAVE_PARAMS": ", " + sv_params if sv_params else "", "SAVE_LOCALS": sv_locals}
        if strategy == "plane":
            xb = -(-(plane // v) // (block * u))
            kern = cc.substitute(_BN_PLANE, XB=xb, **sub)
            grid = f"input.shape[0] * input.shape[1] * {xb}"
            kernel = "bn_plane"
            how = f"{xb} block(s) per plane"
        else:
            assert table is not None
            epb, te, by_channel = table
            kern = cc.substitute(_BN_FLAT, EPB=epb, TE=te, BY_CHANNEL=cc.cbool(by_channel), **sub)
            grid = f"ceil_div(input.numel, {epb})"
            kernel = "bn_flat"
            how = f"{epb} elements per block, {te}-entry {'channel' if by_channel else 'plane'} table"
        dtypes = [x["dtype"], rm["dtype"], rv["dtype"], tsm, tsi, *(t["dtype"] for t in (w, b) if t is not None)]
        source = (f"// {card.op} (eval), {card.signature_text}: {strategy}\n" + cc.prelude(dtypes, hinted=True)
                  + body + kern)
        args = [("ptr", "input")] + [("ptr", "weight")] * has_w + [("ptr", "bias")] * has_b
        args += [("ptr", "running_mean"), ("ptr", "running_var"), ("ptr", "out0")]
        args += [("ptr", "out1"), ("ptr", "out2")] if save else []
        args.append(("f32", self._eps_name(card)))
        spec = "\n".join([
            f"# batch_norm (eval) {strategy}: {how}" + ("" if save else "; empty saved statistics: nothing to write"),
            "[[launch]]", f'kernel = "{kernel}"', f'grid = ["{grid}"]', f"block = [{block}]",
            "args = " + cc.spec_args(args), ""])
        intent = f"batch_norm eval {strategy}: [{n},{c},{plane}], block {block}, vec {v}, unroll {u}, {how}"
        # The params of the kernel rendered: a strategy or width that does not apply was narrowed above.
        return Rendered(source=source, spec=spec, params={**params, "strategy": strategy, "vec": v}, intent=intent)


TEMPLATES: list[Template] = [BatchNormTemplate()]

