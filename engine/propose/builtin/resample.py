"""Nearest-neighbour upsampling template: `aten::upsample_nearest2d` (F.interpolate(mode="nearest"), nn.Upsample),
NCHW or channels-last, fp32/fp16/bf16.

A pure gather: output (n, c, oh, ow) = input (n, c, ih, iw) with eager CUDA's source index, computed the same
way in fp32: ih = min(int(floorf(oh * hs)), IH - 1), hs = 1 / scales_h (in double, then rounded to float) where a
positive scale is given, else IH / OH in fp32 (`compute_scales_value`, `nearest_neighbor_compute_source_index`).
Every index equals eager's, so the output is eager's bit for bit; the scales and sizes are baked in.

The output is written in the layout eager gives: row-major for a contiguous input, channels-last for a
channels-last one (the SD3.5 VAE decoder's up blocks under a layout route). Strategies follow the output:
  rows      output row-major: a thread writes `vec` consecutive pixels of an output row as one vector (its
            `vec` source pixels read one by one; they are at most `vec` adjacent elements, in L1).
  channels  output channels-last: a thread copies `vec` consecutive channels of one pixel, one vector load
            (where the input's channels are unit-stride and aligned) and one vector store.
Each thread handles `unroll` vectors a block apart. The input may have any strides (baked in).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template

BLOCKS = (256, 128, 512)
UNROLLS = (1, 2, 4)

_Decline = cc.Decline


def _f32_div(a: int, b: int) -> float:
    """a / b in fp32 (IEEE division of two floats: what `static_cast<float>(a) / b` computes on the GPU)."""
    import torch

    return float(torch.tensor(float(a), dtype=torch.float32) / torch.tensor(float(b), dtype=torch.float32))


def source_scale(in_size: int, out_size: int, scale: Any) -> float:
    """Eager CUDA's `compute_scales_value<float>`: 1 / scale (double, then float) for a positive scale, else
    in_size / out_size in fp32."""
    if scale is not None and float(scale) > 0:
        return cc.f32(1.0 / float(scale))
    return _f32_div(in_size, out_size)


def source_index(out_index: int, scale: float, in_size: int) -> int:
    """Eager's `nearest_neighbor_compute_source_index`, in fp32 (what the kernel computes)."""
    return min(int(math.floor(cc.f32(cc.f32(float(out_index)) * scale))), in_size - 1)


def _plan(card: OperatorCard) -> dict[str, Any]:
    x = cc.usable_tensor(card, "self")   # a float dtype the kernels read, on CUDA
    shape = [int(s) for s in x["shape"]]
    if len(shape) != 4:
        raise _Decline(f"a {len(shape)}-D input (the template takes 4-D images)")
    size = cc.value_arg(card, "output_size", None)
    if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise _Decline(f"output_size {size!r} (the template takes the two output sizes)")
    n, c, ih, iw = shape
    oh, ow = (int(s) for s in size)
    scales = [cc.value_arg(card, k, None) for k in ("scales_h", "scales_w")]
    for s in scales:
        if s is not None and not (isinstance(s, (int, float)) and math.isfinite(float(s))):
            raise _Decline(f"scale {s!r}")
    out = cc.single_output(card)
    if out["dtype"] != x["dtype"] or [int(v) for v in out["shape"]] != [n, c, oh, ow]:
        raise _Decline(f"output {out['dtype']}{out['shape']}, expected {x['dtype']}{[n, c, oh, ow]}")
    if min(shape) <= 0 or n * c * oh * ow == 0:
        raise _Decline("an empty tensor")
    if cc.aliased_with(card, "self"):
        raise _Decline("the input shares storage with another argument")
    o_shape = [n, c, oh, ow]
    o_stride = [int(v) for v in out["stride"]]
    if cc.is_contiguous(o_shape, o_stride):
        strategy = "rows"
    elif cc.channels_last(o_shape, o_stride):
        strategy = "channels"
    else:
        raise _Decline(f"output strides {o_stride} are neither row-major nor channels-last")
    xs = [int(v) for v in x["stride"]]
    extent = sum((d - 1) * s for d, s in zip(shape, xs)) + 1
    return {"x": x, "out": out, "n": n, "c": c, "ih": ih, "iw": iw, "oh": oh, "ow": ow, "xs": xs,
            "hs": source_scale(ih, oh, scales[0]), "ws": source_scale(iw, ow, scales[1]), "strategy": strategy,
            "itype": cc.int_type(max(extent, n * c * oh * ow) + 1)}


class UpsampleNearestTemplate(Template):
    name = "upsample_nearest"
    ops = frozenset({"aten::upsample_nearest2d"})

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(_plan, card)

    @staticmethod
    def _space(p: dict[str, Any]) -> dict[str, list[Any]]:
        isz = cc.itemsize(p["x"]["dtype"])
        if p["strategy"] == "rows":
            vecs = cc.vec_choices(isz, p["ow"], [p["out"]])
        elif p["xs"][1] != 1 and p["c"] > 1:
            vecs = [1]   # channels not unit-stride in the input: one element a load
        else:
            vecs = cc.vec_choices(isz, p["c"], [p["out"], p["x"]])
        return {"vec": vecs or [1], "block": list(BLOCKS), "unroll": list(UNROLLS)}

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        return self._space(_plan(card))

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        p = _plan(card)
        for k, vals in self._space(p).items():
            if params.get(k) not in vals:
                raise ValueError(f"{k}={params.get(k)!r} is outside {list(vals)}")
        vec, block, unroll = (int(params[k]) for k in ("vec", "block", "unroll"))
        dtype = p["x"]["dtype"]
        n, c, oh, ow = p["n"], p["c"], p["oh"], p["ow"]
        nv = n * c * oh * ow // vec
        blocks = max(1, -(-nv // (block * unroll)))
        if blocks > cc.MAX_I32:
            raise ValueError(f"{blocks} blocks exceed one grid dimension")
        sn, sc, sh, sw = p["xs"]
        it = p["itype"]
        kernel = f"kf_upsample_nearest_{p['strategy']}"
        common = dict(T=cc.ctype(dtype), IT=it, BLOCK=block, UNROLL=unroll, VEC=vec, NV=nv, KERNEL=kernel,
                      C=c, OH=oh, OW=ow, IH=p["ih"], IW=p["iw"], SN=sn, SC=sc, SH=sh, SW=sw,
                      HS=cc.float_literal(p["hs"]), WS=cc.float_literal(p["ws"]))
        body = _ROWS if p["strategy"] == "rows" else _CHANNELS
        source = cc.prelude([dtype], vec=True) + cc.substitute(_HEAD + body, **common)
        spec = (f"# {n * c * oh * ow} outputs as {nv} vectors of {vec}, {unroll} per thread\n"
                f"[[launch]]\nkernel = \"{kernel}\"\ngrid = [{blocks}]\nblock = [{block}]\n"
                f"args = {cc.spec_args([('ptr', 'self'), ('ptr', 'out0')])}\n")
        what = ("output rows: a vector of pixels per thread" if p["strategy"] == "rows"
                else "channels-last: a vector of channels per thread")
        intent = (f"nearest {p['ih']}x{p['iw']} -> {oh}x{ow}, {what}, {vec}-wide, x{unroll}, block {block}")
        return Rendered(source, spec, dict(params), intent)


_HEAD = r"""
// Eager CUDA's nearest source index (fp32), sizes and scales baked in.
__device__ __forceinline__ int kf_src_h(int o) { return min((int)floorf((float)o * $HS), $IH - 1); }
__device__ __forceinline__ int kf_src_w(int o) { return min((int)floorf((float)o * $WS), $IW - 1); }
"""

_ROWS = r"""
extern "C" __global__ void __launch_bounds__($BLOCK) $KERNEL(const $T* __restrict__ x, $T* __restrict__ y) {
  const $IT first = ($IT)blockIdx.x * ($BLOCK * $UNROLL) + threadIdx.x;
  #pragma unroll
  for (int u = 0; u < $UNROLL; ++u) {
    const $IT v = first + ($IT)u * $BLOCK;
    if (v >= ($IT)$NV) return;
    const int ow0 = (int)(v % ($IT)($OW / $VEC)) * $VEC;
    $IT r = v / ($IT)($OW / $VEC);
    const int oh = (int)(r % ($IT)$OH);
    r /= ($IT)$OH;
    const $IT c = r % ($IT)$C, n = r / ($IT)$C;
    const $T* row = x + n * ($IT)$SN + c * ($IT)$SC + ($IT)kf_src_h(oh) * ($IT)$SH;
    kf_vec<$T, $VEC> w;
    #pragma unroll
    for (int k = 0; k < $VEC; ++k) w.v[k] = row[($IT)kf_src_w(ow0 + k) * ($IT)$SW];
    *reinterpret_cast<kf_vec<$T, $VEC>*>(y + v * ($IT)$VEC) = w;
  }
}
"""

_CHANNELS = r"""
extern "C" __global__ void __launch_bounds__($BLOCK) $KERNEL(const $T* __restrict__ x, $T* __restrict__ y) {
  const $IT first = ($IT)blockIdx.x * ($BLOCK * $UNROLL) + threadIdx.x;
  #pragma unroll
  for (int u = 0; u < $UNROLL; ++u) {
    const $IT v = first + ($IT)u * $BLOCK;
    if (v >= ($IT)$NV) return;
    const $IT c0 = (v % ($IT)($C / $VEC)) * $VEC;
    $IT r = v / ($IT)($C / $VEC);
    const int ow = (int)(r % ($IT)$OW);
    r /= ($IT)$OW;
    const int oh = (int)(r % ($IT)$OH);
    const $IT n = r / ($IT)$OH;
    const $T* src = x + n * ($IT)$SN + ($IT)kf_src_h(oh) * ($IT)$SH + ($IT)kf_src_w(ow) * ($IT)$SW + c0 * ($IT)$SC;
    kf_vec<$T, $VEC> w;
    if ($SC == 1) {
      w = *reinterpret_cast<const kf_vec<$T, $VEC>*>(src);
    } else {
      #pragma unroll
      for (int k = 0; k < $VEC; ++k) w.v[k] = src[($IT)k * ($IT)$SC];
    }
    *reinterpret_cast<kf_vec<$T, $VEC>*>(y + v * ($IT)$VEC) = w;
  }
}
"""

TEMPLATES: list[Template] = [UpsampleNearestTemplate()]
