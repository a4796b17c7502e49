"""Mean/sum over dims template: `aten::mean.dim`, `aten::sum.dim_IntList` and `_adaptive_avg_pool2d`
to 1x1 — global average pooling (NCHW or channels_last), last-dim means of RMS norms, and the like.

The input may have any strides: its offset is (kept-index part) + (reduced-index part), each computed
from the card's sizes and strides baked in as constants, so every mapping below is correct for every
layout and the strategies differ only in speed. The output must be row-major over the kept dims (what
eager returns, also for channels_last input). Sums accumulate in fp32 and finish like eager: mean
multiplies by its fp32 factor num_outputs / numel, the adaptive pool divides by H then W, and the
result is rounded once.

Strategies (param `strategy`):
  tile      reduced dims innermost and the input contiguous, small rows (≤ 384 bytes): a block copies a
            contiguous tile of rows into shared memory with 16-byte loads, then one thread sums each row.
  row       `group` lanes (2..32) of a warp per output, walking its reduced elements, shuffle reduction.
  block_row one block per output, for long reductions.
  column    one thread per `vec` adjacent outputs (kept innermost dim contiguous, e.g. channels_last
            pooling), walking the reduced elements; `split` threads share an output column and combine
            their partial sums through shared memory in a fixed order.
`vec` is the widest access a thread may make; each strategy uses the widest width ≤ vec that the
layout and alignment allow (1 at worst), so no combination is invalid.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template, intent_params

TILE_BYTES = 48 * 1024      # static shared memory a tile may use
TILE_ROW_BYTES = 384        # longest row the tile strategy takes (at least 128 rows per tile)
BLOCKS = (256, 128, 512, 1024)
GROUPS = (32, 16, 8, 4, 2)
SPLITS = (1, 2, 4, 8, 16, 32)
VECS = (8, 4, 2, 1)


_Decline = cc.Decline  # this card is outside what the template computes exactly


@dataclass(frozen=True)
class _Plan:
    kind: str                        # 'mean' | 'sum' | 'pool'
    in_dtype: str
    out_dtype: str
    m: int                           # outputs
    r: int                           # reduced elements per output
    kept_sizes: tuple[int, ...]      # merged kept dims (row-major = output order)
    kept_strides: tuple[int, ...]
    red_sizes: tuple[int, ...]       # merged reduced dims, largest stride first
    red_strides: tuple[int, ...]
    in_align: int
    out_align: int
    finish: str                      # C expression of the result from fp32 `{acc}`

    @property
    def itype(self) -> str:
        extent = sum((n - 1) * s for n, s in zip(self.kept_sizes + self.red_sizes,
                                                 self.kept_strides + self.red_strides)) + 1
        return cc.int_type(max(extent, self.m) + self.m + self.r)

    @property
    def isz(self) -> int:
        return cc.itemsize(self.in_dtype)

    @property
    def contiguous_rows(self) -> bool:
        """Reduced elements innermost and contiguous, consecutive outputs' rows adjacent."""
        red_ok = (self.red_sizes == (self.r,) and self.red_strides == (1,)) or self.r == 1
        kept_ok = self.m == 1 or (len(self.kept_sizes) == 1 and self.kept_strides[0] == self.r)
        return red_ok and kept_ok


def _dims(value: Any, ndim: int) -> list[int]:
    if isinstance(value, bool) or value is None:
        raise _Decline(f"dim={value!r}")
    dims = [value] if isinstance(value, int) else list(value)
    if not dims or any(isinstance(d, bool) or not isinstance(d, int) or not -ndim <= d < ndim for d in dims):
        raise _Decline(f"dim={value!r}")
    norm = sorted({d % ndim for d in dims})
    if len(norm) != len(dims):
        raise _Decline(f"repeated dims {value!r}")
    return norm


def _analyse(card: OperatorCard) -> _Plan:
    x = cc.usable_tensor(card, "self")
    out = cc.single_output(card)
    shape, stride = [int(s) for s in x["shape"]], [int(s) for s in x["stride"]]
    ndim = len(shape)
    if card.op in ("aten::mean.dim", "aten::sum.dim_IntList"):
        kind = "mean" if card.op == "aten::mean.dim" else "sum"
        dims = _dims(cc.value_arg(card, "dim", None), ndim)
        keepdim = bool(cc.value_arg(card, "keepdim", False))
        dtype = cc.value_arg(card, "dtype", None)
        want = x["dtype"] if dtype is None else str(dtype).removeprefix("torch.")
        if want != x["dtype"] and not (want == "float32" and x["dtype"] in ("float16", "bfloat16")):
            raise _Decline(f"dtype={want} (only none, or float32 for a half input)")
        if out["dtype"] != want:
            raise _Decline(f"output dtype {out['dtype']} is not {want}")
    elif card.op == "aten::_adaptive_avg_pool2d":
        kind = "pool"
        size = cc.value_arg(card, "output_size", None)
        if list(size or []) != [1, 1] or ndim not in (3, 4):
            raise _Decline(f"output_size={size!r} on {ndim}-d input (only 1x1 of 3-d/4-d)")
        dims, keepdim = [ndim - 2, ndim - 1], True
        if out["dtype"] != x["dtype"]:
            raise _Decline("output dtype differs from input")
    else:
        raise _Decline(f"op {card.op}")
    expect = [1 if d in dims else n for d, n in enumerate(shape)] if keepdim else \
        [n for d, n in enumerate(shape) if d not in dims]
    if list(out["shape"]) != expect:
        raise _Decline(f"output shape {out['shape']} is not {expect}")
    if not cc.is_contiguous(out["shape"], out["stride"]):
        raise _Decline(f"output strides {out['stride']} are not row-major over the kept dims")
    m = math.prod(n for d, n in enumerate(shape) if d not in dims)
    r = math.prod(shape[d] for d in dims)
    if m == 0 or r == 0:
        raise _Decline("empty reduction or output")  # eager fills NaN / 0: not worth a kernel
    kept = [d for d in range(ndim) if d not in dims]
    kept_sizes, (kept_strides,) = cc.coalesce([shape[d] for d in kept], [[stride[d] for d in kept]])
    red = sorted(dims, key=lambda d: -stride[d])
    red_sizes, (red_strides,) = cc.coalesce([shape[d] for d in red], [[stride[d] for d in red]])
    if kind == "mean":
        # eager's MeanOps: acc * (float(num_outputs) / float(numel)), computed in fp32.
        factor = cc.f32(cc.f32(m) / cc.f32(m * r))
        finish = f"{{acc}} * {cc.float_literal(factor)}"
    elif kind == "pool":
        finish = f"{{acc}} / {cc.float_literal(shape[-2])} / {cc.float_literal(shape[-1])}"
    else:
        finish = "{acc}"
    return _Plan(kind, x["dtype"], out["dtype"], m, r, tuple(kept_sizes), tuple(kept_strides),
                 tuple(red_sizes), tuple(red_strides), int(x.get("align", 16)), int(out.get("align", 16)),
                 finish)


# ------------------------------------------------------------------------------------ vector widths


def _aligned(plan: _Plan, v: int, strides: Sequence[int]) -> bool:
    need = min(16, v * plan.isz)
    return plan.in_align >= need and all(s * plan.isz % need == 0 for s in strides)


def _row_vec(plan: _Plan, vec: int) -> int:
    """Widest width ≤ vec for walking the reduced elements (innermost reduced dim contiguous)."""
    for v in (w for w in VECS if w <= vec):
        if v == 1:
            return 1
        if v * plan.isz > 16 or not plan.red_sizes or plan.red_strides[-1] != 1 or plan.red_sizes[-1] % v:
            continue
        if _aligned(plan, v, plan.red_strides[:-1] + plan.kept_strides):
            return v
    return 1


def _col_vec(plan: _Plan, vec: int) -> int:
    """Widest width ≤ vec over adjacent outputs (innermost kept dim contiguous)."""
    for v in (w for w in VECS if w <= vec):
        if v == 1:
            return 1
        if v * plan.isz > 16 or not plan.kept_sizes or plan.kept_strides[-1] != 1 or plan.kept_sizes[-1] % v:
            continue
        out_ok = plan.out_align >= min(16, v * cc.itemsize(plan.out_dtype))
        if out_ok and _aligned(plan, v, plan.kept_strides[:-1] + plan.red_strides):
            return v
    return 1


def _tile_rows(plan: _Plan, block: int) -> int:
    """Rows per tile: one per thread, as many as fit in the shared-memory budget (multiple of 32)."""
    fit = TILE_BYTES // (plan.r * plan.isz)
    return max(32, min(block, fit // 32 * 32))


def _tile_vec(plan: _Plan, vec: int, rows: int) -> int:
    for v in (w for w in VECS if w <= vec):
        need = min(16, v * plan.isz)
        if v == 1 or (v * plan.isz <= 16 and plan.in_align >= need and rows * plan.r * plan.isz % need == 0):
            return v
    return 1


# ------------------------------------------------------------------------------------------ codegen


def _name(plan: _Plan, strategy: str) -> str:
    return f"kf_{plan.kind}_{strategy}"


def _head(plan: _Plan, name: str, block: int) -> str:
    ti, to = cc.ctype(plan.in_dtype), cc.ctype(plan.out_dtype)
    return (f'extern "C" __global__ void __launch_bounds__({block}) '
            f"{name}(const {ti}* __restrict__ x, {to}* __restrict__ y) {{\n")


def _prelude(plan: _Plan, what: str) -> str:
    return (f"// aten {plan.kind} of {plan.m} outputs x {plan.r} elements ({plan.in_dtype} -> {plan.out_dtype}): "
            f"{what}.\n// kept dims {list(plan.kept_sizes)} strides {list(plan.kept_strides)}; reduced dims "
            f"{list(plan.red_sizes)} strides {list(plan.red_strides)}; fp32 sum, result = "
            f"{plan.finish.format(acc='sum')}.\n"
            + cc.prelude({plan.in_dtype, plan.out_dtype}, vec=True, reduce=True) + "\n")


def _store(plan: _Plan, index: str) -> str:
    return f"y[{index}] = kf_from_float<{cc.ctype(plan.out_dtype)}>({plan.finish.format(acc='acc')});"


STAGE_BYTES = 128  # raw bytes a thread may stage in registers to issue all its loads at once


def _walk(plan: _Plan, start: str, step: int, v: int, add: str, base: str = "xk") -> str:
    """Sum the reduced elements r = start, start + step, ... < R (each `v` wide) into the accumulator
    `add` names ('acc' or 'acc[j]'). When the trip count is small, every load of the thread is issued
    before the first add (the loads overlap instead of waiting on each other); else a loop."""
    it, ti = plan.itype, cc.ctype(plan.in_dtype)
    trips = -(-plan.r // step)
    roff = cc.offset_code("r", plan.red_sizes, plan.red_strides, it)
    if trips * v * plan.isz <= STAGE_BYTES and trips <= 16:
        # start < step for every thread, so whole trips never pass R when step divides it
        guard = "" if plan.r % step == 0 else f"if (r < ({it}){plan.r}) "
        return f"""    kf_vec<{ti}, {v}> w[{trips}];
    #pragma unroll
    for (int i = 0; i < {trips}; ++i) {{
      const {it} r = ({it})({start}) + ({it})i * {step};
      {guard}w[i] = *reinterpret_cast<const kf_vec<{ti}, {v}>*>({base} + ({roff}));
    }}
    #pragma unroll
    for (int i = 0; i < {trips}; ++i) {{
      const {it} r = ({it})({start}) + ({it})i * {step};
      {guard}{{
        #pragma unroll
        for (int j = 0; j < {v}; ++j) {add} += kf_to_float(w[i].v[j]);
      }}
    }}
"""
    return f"""    #pragma unroll 4
    for ({it} r = ({it})({start}); r < ({it}){plan.r}; r += {step}) {{
      float a[{v}];
      kf_load_vec<{v}>({base} + ({roff}), a);
      #pragma unroll
      for (int j = 0; j < {v}; ++j) {add} += a[j];
    }}
"""


def _row_source(plan: _Plan, block: int, vec: int, group: int) -> tuple[str, int]:
    v = _row_vec(plan, vec)
    it = plan.itype
    name = _name(plan, "row")
    koff = cc.offset_code("k", plan.kept_sizes, plan.kept_strides, it)
    src = _prelude(plan, f"{group} lanes per output, {v}-wide loads") + _head(plan, name, block)
    src += f"""  const {it} k = (({it})blockIdx.x * {block} + threadIdx.x) / {group};
  const int lane = threadIdx.x & {group - 1};
  // Lanes past the last output still join the shuffles (full-warp masks) but read nothing.
  const bool valid = k < ({it}){plan.m};
  float acc = 0.f;
  if (valid) {{
    const {cc.ctype(plan.in_dtype)}* xk = x + ({koff});
{_walk(plan, f"lane * {v}", group * v, v, "acc")}  }}
  acc = kf_warp_sum(acc, {group});
  if (valid && lane == 0) {_store(plan, "k")}
}}
"""
    return src, -(-plan.m * group // block)


def _block_row_source(plan: _Plan, block: int, vec: int) -> tuple[str, int]:
    v = _row_vec(plan, vec)
    it = plan.itype
    koff = cc.offset_code("k", plan.kept_sizes, plan.kept_strides, it)
    src = _prelude(plan, f"one block of {block} per output, {v}-wide loads")
    src += _head(plan, _name(plan, "block_row"), block)
    src += f"""  __shared__ float scratch[32];
  const {it} k = blockIdx.x;
  const {cc.ctype(plan.in_dtype)}* xk = x + ({koff});
  float acc = 0.f;
  {{
{_walk(plan, f"threadIdx.x * {v}", block * v, v, "acc")}  }}
  acc = kf_block_sum(acc, scratch);
  if (threadIdx.x == 0) {_store(plan, "k")}
}}
"""
    return src, plan.m


def _column_source(plan: _Plan, block: int, vec: int, split: int) -> tuple[str, int]:
    v = _col_vec(plan, vec)
    split = min(split, block // 32)  # keep at least a warp of columns per block
    bx = block // split
    it = plan.itype
    koff = cc.offset_code("k", plan.kept_sizes, plan.kept_strides, it)
    mv = plan.m // v
    src = _prelude(plan, f"a thread per {v} adjacent output(s), {split} thread(s) per column")
    src += _head(plan, _name(plan, "column"), block)
    combine = ""
    if split > 1:
        combine = f"""  // Partial sums of the {split} threads of a column, added in a fixed order.
  __shared__ float part[{split - 1}][{bx}][{v}];
  if (ty > 0) {{
    #pragma unroll
    for (int j = 0; j < {v}; ++j) part[ty - 1][tx][j] = acc[j];
  }}
  __syncthreads();
  if (ty > 0) return;
  #pragma unroll
  for (int q = 0; q < {split - 1}; ++q) {{
    #pragma unroll
    for (int j = 0; j < {v}; ++j) acc[j] += part[q][tx][j];
  }}
"""
    src += f"""  const int tx = threadIdx.x % {bx}, ty = threadIdx.x / {bx};
  const {it} kv = ({it})blockIdx.x * {bx} + tx;
  const bool valid = kv < ({it}){mv};
  float acc[{v}];
  #pragma unroll
  for (int j = 0; j < {v}; ++j) acc[j] = 0.f;
  const {it} k = (valid ? kv : 0) * {v};
  if (valid) {{
    const {cc.ctype(plan.in_dtype)}* xk = x + ({koff});
{_walk(plan, "ty", split, v, "acc[j]")}  }}
{combine}  if (!valid) return;
  float o[{v}];
  #pragma unroll
  for (int j = 0; j < {v}; ++j) o[j] = {plan.finish.format(acc='acc[j]')};
  kf_store_vec<{v}>(y + k, o);
}}
"""
    return src, -(-mv // bx)


def _tile_source(plan: _Plan, block: int, vec: int) -> tuple[str, int]:
    rows = _tile_rows(plan, block)
    v = _tile_vec(plan, vec, rows)
    it = plan.itype
    ti = cc.ctype(plan.in_dtype)
    tile = rows * plan.r
    per = -(-(tile // v) // block)  # vectors each thread copies
    vt = f"kf_vec<{ti}, {v}>"
    if per * v * plan.isz <= STAGE_BYTES:
        # every load of the thread in flight at once, then the shared-memory stores
        copy = f"""  {vt} w[{per}];
  #pragma unroll
  for (int q = 0; q < {per}; ++q) {{
    const int i = q * {block} + threadIdx.x;
    if (i < nvec) w[q] = *reinterpret_cast<const {vt}*>(x + start + ({it})i * {v});
  }}
  #pragma unroll
  for (int q = 0; q < {per}; ++q) {{
    const int i = q * {block} + threadIdx.x;
    if (i < nvec) *reinterpret_cast<{vt}*>(tile + i * {v}) = w[q];
  }}
"""
    else:
        copy = f"""  #pragma unroll 4
  for (int i = threadIdx.x; i < nvec; i += {block})
    *reinterpret_cast<{vt}*>(tile + i * {v}) = *reinterpret_cast<const {vt}*>(x + start + ({it})i * {v});
"""
    src = _prelude(plan, f"tiles of {rows} contiguous rows staged in shared memory with {v}-wide loads, "
                         "one thread per row")
    src += _head(plan, _name(plan, "tile"), block)
    src += f"""  __shared__ __align__(16) unsigned char raw[{tile * plan.isz}];
  {ti}* tile = reinterpret_cast<{ti}*>(raw);
  const {it} row0 = ({it})blockIdx.x * {rows};
  const {it} start = row0 * {plan.r};
  const int len = ({it}){plan.m * plan.r} - start < ({it}){tile} ? (int)(({it}){plan.m * plan.r} - start) : {tile};
  // Coalesced copy of the tile (whole vectors, then the few elements a partial last tile leaves).
  const int nvec = len / {v};
{copy}  for (int i = nvec * {v} + threadIdx.x; i < len; i += {block}) tile[i] = x[start + i];
  __syncthreads();
  const {it} k = row0 + threadIdx.x;
  if (threadIdx.x >= {rows} || k >= ({it}){plan.m}) return;
  const {ti}* row = tile + threadIdx.x * {plan.r};
  float acc = 0.f;
  #pragma unroll {8 if plan.r > 64 else ''}
  for (int j = 0; j < {plan.r}; ++j) acc += kf_to_float(row[j]);
  {_store(plan, "k")}
}}
"""
    return src, -(-plan.m // rows)


# ------------------------------------------------------------------------------------------ template


class PoolingTemplate(Template):
    """mean / sum over any set of dims (global average pooling, last-dim means), any input strides."""

    name = "pooling"
    ops = frozenset({"aten::mean.dim", "aten::sum.dim_IntList", "aten::_adaptive_avg_pool2d"})

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(_analyse, card)

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        plan = _analyse(card)
        strategies = ["row", "block_row", "column"]
        if plan.contiguous_rows and plan.r * plan.isz <= TILE_ROW_BYTES and plan.r > 1:
            strategies.insert(0, "tile")
        best_vec = 16 // plan.isz
        red_inner = bool(plan.red_strides) and plan.red_strides[-1] == 1
        kept_inner = bool(plan.kept_strides) and plan.kept_strides[-1] == 1
        groups_needed = -(-plan.r // _row_vec(plan, best_vec))  # vectors per output
        if "tile" in strategies and plan.m >= 2 * hw.sms:
            first = "tile"
        elif kept_inner and not red_inner and plan.m > 1:
            first = "column"
        elif groups_needed > 32 * 16:
            first = "block_row"
        else:
            first = "row"
        group = min(32, max(2, 1 << max(0, (groups_needed - 1).bit_length())))
        # Enough threads for the column strategy: split the reduction until ~128K threads run.
        threads = max(1, plan.m // _col_vec(plan, best_vec))
        split = next((s for s in SPLITS if threads * s >= 128 * 1024 or s >= plan.r), SPLITS[-1])
        split = min(split, 256 // 32)  # what the default block of 256 takes (≥ 32 columns per block)
        # Tiles: smaller blocks spread a small tensor over more SMs (on the H200 the 7x7 pooling of
        # [32,2048] ran in 256 tiles of 256 rows at 8.2 us; 128-row tiles double the blocks).
        blocks = [128, 256, 512, 1024] if first == "tile" else list(BLOCKS)
        return {
            "strategy": [first] + [s for s in strategies if s != first],
            "block": blocks,
            "vec": [best_vec] + [v for v in VECS if v != best_vec],
            "group": [group] + [g for g in GROUPS if g != group],
            "split": [split] + [s for s in SPLITS if s != split],
        }

    @staticmethod
    def _relevant(params: Mapping[str, Any]) -> set[str]:
        keys = {"strategy", "block", "vec"}
        if params["strategy"] == "row":
            keys.add("group")
        if params["strategy"] == "column":
            keys.add("split")
        return keys

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        """Change one parameter that matters for the current strategy (or the strategy itself)."""
        return cc.mutate_relevant(self.space(card, hw=hw), params, self._relevant, rng, intent_params(intent))

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        plan = _analyse(card)
        space = self.space(card, hw=hw)
        for k, vals in space.items():
            if k in params and params[k] not in vals:
                raise ValueError(f"{k}={params[k]!r} is outside {list(vals)}")
        p = {**{k: v[0] for k, v in space.items()}, **params}
        strategy, block, vec = p["strategy"], int(p["block"]), int(p["vec"])
        if strategy == "row":
            src, grid = _row_source(plan, block, vec, int(p["group"]))
            intent = f"{p['group']} lanes per output, block {block}, up to {vec}-wide loads"
        elif strategy == "block_row":
            src, grid = _block_row_source(plan, block, vec)
            intent = f"block of {block} per output, up to {vec}-wide loads"
        elif strategy == "column":
            src, grid = _column_source(plan, block, vec, int(p["split"]))
            intent = (f"thread per output column, split {min(int(p['split']), block // 32)}, block {block}, "
                      f"up to {vec}-wide")
        elif strategy == "tile" and strategy in space["strategy"]:
            src, grid = _tile_source(plan, block, vec)
            intent = f"shared-memory tiles of {_tile_rows(plan, block)} rows, block {block}"
        else:
            raise ValueError(f"strategy {strategy!r} is outside {space['strategy']}")
        spec = (f"[[launch]]\nkernel = \"{_name(plan, strategy)}\"\ngrid = [{grid}]\nblock = [{block}]\n"
                "args = [{ ptr = \"self\" }, { ptr = \"out0\" }]\n")
        return Rendered(src, spec, p, intent)


TEMPLATES: list[Template] = [PoolingTemplate()]
