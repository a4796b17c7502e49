"""Softmax / log-softmax template: `aten::_softmax` and `aten::_log_softmax` over a contiguous last dim.

Eager's numerics, in fp32: m = max(x), s = sum(exp(x - m)), then exp(x - m) / s (softmax) or
(x - m) - log(s) (log-softmax), rounded once to the output dtype. Accurate `expf`/`logf` throughout (the
fp32 reduction tolerance is 1e-5 relative). Strategies (param `strategy`):
  warp   rows of ≤ 2048 elements: a power-of-two group of lanes per row (a whole warp for rows > 16
         vectors), the row in registers, shuffle reductions.
  block  one block per row: the row in registers when it fits (≤ 32 values per thread), else passes
         over global memory: with `online` (the default) one pass keeping a running (max, sum of exp),
         without it a max pass and a sum pass; then the write pass.
  split  long rows and few of them: `chunks` blocks per row. Kernel 1 writes each chunk's
         (max, sum of exp) to a workspace; kernel 2 merges the row's partials (same order in every block,
         so the result is deterministic) and writes its chunk.
  cluster  one launch: a thread block cluster (sm_90, `cluster` blocks) per row; each block reduces its
         chunk, the partials meet at the cluster's hardware barrier, every block merges them in the same
         order and writes its chunk (from registers when it fits): one read, one write, no second launch.
Outer dims may have any strides (the row offset is computed from them); the output is contiguous.
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

MAX_CACHED = 32     # row values a thread keeps in registers (block and split strategies)
MAX_WARP_ROW = 64   # values per lane in the warp strategy (rows of up to 2048 elements)
MIN_CHUNK = 1024    # elements per chunk in the split strategy


_Decline = cc.Decline  # this card is outside what the template computes exactly


@dataclass(frozen=True)
class _Plan:
    log: bool
    in_dtype: str
    out_dtype: str
    rows: int
    n: int                          # row length (the reduced dim)
    outer_sizes: tuple[int, ...]    # merged outer dims, for the input row offset
    outer_strides: tuple[int, ...]
    in_align: int
    out_align: int

    @property
    def itype(self) -> str:
        extent = sum((k - 1) * s for k, s in zip(self.outer_sizes, self.outer_strides)) + self.n
        return cc.int_type(max(extent, self.rows * self.n) + self.n)


def _analyse(card: OperatorCard) -> _Plan:
    if card.op not in ("aten::_softmax", "aten::_log_softmax"):
        raise _Decline(f"op {card.op}")
    x = cc.usable_tensor(card, "self")
    out = cc.single_output(card)
    shape, stride = [int(s) for s in x["shape"]], [int(s) for s in x["stride"]]
    if not shape:
        raise _Decline("0-dim input")
    dim = cc.value_arg(card, "dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        raise _Decline(f"dim {dim!r}")
    dim %= len(shape)
    half_to_float = bool(cc.value_arg(card, "half_to_float", False))
    if half_to_float:
        if x["dtype"] == "float32" or out["dtype"] != "float32":
            raise _Decline("half_to_float needs a half input and a float32 output")
    elif out["dtype"] != x["dtype"]:
        raise _Decline(f"output dtype {out['dtype']} differs from input {x['dtype']}")
    if list(out["shape"]) != shape or not cc.is_contiguous(shape, out["stride"]):
        raise _Decline("output is not a contiguous tensor of the input's shape")
    if math.prod(shape) == 0:
        raise _Decline("empty tensor")
    if any(n != 1 for n in shape[dim + 1:]):
        raise _Decline(f"softmax over dim {dim} is not over the last non-trivial dim")
    n = shape[dim]
    if n > 1 and stride[dim] != 1:
        raise _Decline(f"the reduced dim has stride {stride[dim]}, not 1")
    sizes, (strides,) = cc.coalesce(shape[:dim], [stride[:dim]])
    return _Plan(card.op == "aten::_log_softmax", x["dtype"], out["dtype"], math.prod(shape[:dim]), n,
                 tuple(sizes), tuple(strides), int(x.get("align", 16)), int(out.get("align", 16)))


def _vec_ok(plan: _Plan, vec: int) -> bool:
    if vec == 1:
        return True
    if plan.n % vec or vec * cc.itemsize(plan.in_dtype) > 16:
        return False
    need_in = min(16, vec * cc.itemsize(plan.in_dtype))
    need_out = min(16, vec * cc.itemsize(plan.out_dtype))
    return (plan.in_align >= need_in and all(s * cc.itemsize(plan.in_dtype) % need_in == 0
                                              for s in plan.outer_strides)
            and plan.out_align >= need_out and plan.n * cc.itemsize(plan.out_dtype) % need_out == 0)


def _lanes(plan: _Plan, vec: int) -> int:
    """Lanes per row in the warp strategy: enough for one vector each, a power of two ≤ 32."""
    groups = -(-plan.n // vec)
    return min(32, 1 << max(0, (groups - 1).bit_length()))


def _chunk_len(plan: _Plan, chunks: int, vec: int) -> tuple[int, int]:
    """(chunk length, real chunk count): lengths are whole vectors and no chunk is empty."""
    length = -(-plan.n // chunks)
    length = -(-length // vec) * vec
    return length, -(-plan.n // length)


def _ept(length: int, block: int, vec: int) -> int:
    """Values per thread when `block` threads cover `length` in vectors of `vec`."""
    return -(-length // (block * vec)) * vec


# ------------------------------------------------------------------------------------------ codegen


def _head(plan: _Plan, name: str, block: int, extra: str = "", out: bool = True) -> str:
    ti, to = cc.ctype(plan.in_dtype), cc.ctype(plan.out_dtype)
    y = f", {to}* __restrict__ y" if out else ""
    return (f'extern "C" __global__ void __launch_bounds__({block}) '
            f'{name}(const {ti}* __restrict__ x{y}{extra})')


def _row_ptrs(plan: _Plan, row: str, out: bool = True) -> str:
    it = plan.itype
    off = cc.offset_code(row, plan.outer_sizes, plan.outer_strides, it)
    text = f"  const {cc.ctype(plan.in_dtype)}* xr = x + ({off});\n"
    if out:
        text += f"  {cc.ctype(plan.out_dtype)}* yr = y + ({it}){row} * ({it}){plan.n};\n"
    return text


def _finish(plan: _Plan, value: str) -> str:
    """The output value of one element from its input `value` (m, s / ls in scope)."""
    return f"({value} - m) - ls" if plan.log else f"expf({value} - m) / s"


def _cached_stats(plan: _Plan, groups: int, vec: int, stride: str, bound: str, reduce_max: str,
                  reduce_sum: str, keep_exp: bool = True) -> str:
    """Load the segment into v[groups][vec], then m and s; softmax keeps exp(v - m) in v if keep_exp."""
    keep = " v[g][k] = e;" if keep_exp and not plan.log else ""
    return f"""  float v[{groups}][{vec}];
  #pragma unroll
  for (int g = 0; g < {groups}; ++g) {{
    const {plan.itype} j = ({plan.itype})(g * {stride} + t) * {vec};
    if ({bound}) kf_load_vec<{vec}>(xr + j, v[g]);
    else {{
      #pragma unroll
      for (int k = 0; k < {vec}; ++k) v[g][k] = -INFINITY;
    }}
  }}
  float m = -INFINITY;
  #pragma unroll
  for (int g = 0; g < {groups}; ++g) {{
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) m = fmaxf(m, v[g][k]);
  }}
  m = {reduce_max};
  float s = 0.f;
  #pragma unroll
  for (int g = 0; g < {groups}; ++g) {{
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) {{ const float e = expf(v[g][k] - m); s += e;{keep} }}
  }}
  s = {reduce_sum};
"""


def _cached_write(plan: _Plan, groups: int, vec: int, stride: str, bound: str, raw: bool = False) -> str:
    """Write v's outputs: v holds exp(x - m) for softmax after _cached_stats, the inputs when `raw`."""
    value = _finish(plan, "v[g][k]") if raw else ("(v[g][k] - m) - ls" if plan.log else "v[g][k] / s")
    ls = "  const float ls = logf(s);\n" if plan.log else ""
    return f"""{ls}  #pragma unroll
  for (int g = 0; g < {groups}; ++g) {{
    const {plan.itype} j = ({plan.itype})(g * {stride} + t) * {vec};
    if ({bound}) {{
      float o[{vec}];
      #pragma unroll
      for (int k = 0; k < {vec}; ++k) o[k] = {value};
      kf_store_vec<{vec}>(yr + j, o);
    }}
  }}
"""


def _stream_stats(plan: _Plan, vec: int, block: int, length: str, online: bool) -> str:
    """m and s of xr[0, length) by the whole block, reading global memory (1 or 2 passes)."""
    it = plan.itype
    loop = f"#pragma unroll 4\n  for ({it} j = ({it})t * {vec}; j < {length}; j += {block * vec})"
    load = f"float a[{vec}];\n    kf_load_vec<{vec}>(xr + j, a);"
    if online:
        return f"""  // One pass with a running (max, sum of exp) per thread, then an exact block merge.
  float m = -INFINITY, s = 0.f;
  {loop} {{
    {load}
    float mn = m;
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) mn = fmaxf(mn, a[k]);
    if (mn == -INFINITY) continue;  // nothing finite yet: keep (-inf, 0)
    s = (mn == m) ? s : s * expf(m - mn);
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) s += expf(a[k] - mn);
    m = mn;
  }}
  const float mt = m;
  m = kf_block_max(m, scratch);
  s = kf_block_sum(mt == -INFINITY ? 0.f : s * expf(mt - m), scratch);
"""
    return f"""  // Pass 1: max; pass 2: sum of exp (the row is re-read, mostly from L2).
  float m = -INFINITY;
  {loop} {{
    {load}
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) m = fmaxf(m, a[k]);
  }}
  m = kf_block_max(m, scratch);
  float s = 0.f;
  {loop} {{
    {load}
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) s += expf(a[k] - m);
  }}
  s = kf_block_sum(s, scratch);
"""


def _stream_write(plan: _Plan, vec: int, block: int, length: str) -> str:
    it = plan.itype
    ls = "  const float ls = logf(s);\n" if plan.log else ""
    return f"""{ls}  #pragma unroll 4
  for ({it} j = ({it})t * {vec}; j < {length}; j += {block * vec}) {{
    float a[{vec}], o[{vec}];
    kf_load_vec<{vec}>(xr + j, a);
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) o[k] = {_finish(plan, "a[k]")};
    kf_store_vec<{vec}>(yr + j, o);
  }}
"""


def _prelude(plan: _Plan, what: str, cluster: bool = False) -> str:
    op = "log_softmax" if plan.log else "softmax"
    return (f"// aten::_{op} of {plan.rows} rows x {plan.n} ({plan.in_dtype} -> {plan.out_dtype}): {what}.\n"
            f"// fp32 max / sum / exp with accurate expf, one rounding on store.\n"
            + cc.prelude({plan.in_dtype, plan.out_dtype}, vec=True, reduce=True, cluster=cluster) + "\n")


def _warp_source(plan: _Plan, block: int, vec: int) -> tuple[str, str, int]:
    lanes = _lanes(plan, vec)
    groups = -(-plan.n // (lanes * vec))
    rows_per_block = block // lanes
    it = plan.itype
    name = "kf_log_softmax_warp" if plan.log else "kf_softmax_warp"
    src = _prelude(plan, f"{lanes} lanes per row, {groups * vec} values per lane in registers")
    src += _head(plan, name, block) + " {\n"
    src += f"""  const int t = threadIdx.x & {lanes - 1};
  const {it} row = (({it})blockIdx.x * {block} + threadIdx.x) / {lanes};
  // Lanes of rows past the end still join the shuffles (full-warp masks) but touch no memory.
  const bool valid = row < ({it}){plan.rows};
  const {it} r = valid ? row : 0;
"""
    src += _row_ptrs(plan, "r")
    bound = f"valid && j < {plan.n}"
    src += _cached_stats(plan, groups, vec, str(lanes), bound, f"kf_warp_max(m, {lanes})",
                         f"kf_warp_sum(s, {lanes})")
    src += _cached_write(plan, groups, vec, str(lanes), bound) + "}\n"
    grid = -(-plan.rows // rows_per_block)
    return src, name, grid


def _block_source(plan: _Plan, block: int, vec: int, online: bool) -> tuple[str, str, int]:
    ept = _ept(plan.n, block, vec)
    name = "kf_log_softmax_block" if plan.log else "kf_softmax_block"
    cached = ept <= MAX_CACHED
    what = (f"one block of {block} per row, {ept} values per thread in registers" if cached else
            f"one block of {block} per row, {'online single pass' if online else 'max and sum passes'} "
            "over global memory, then the write pass")
    src = _prelude(plan, what)
    src += _head(plan, name, block) + " {\n"
    src += f"  __shared__ float scratch[32];\n  const int t = threadIdx.x;\n  const {plan.itype} row = blockIdx.x;\n"
    src += _row_ptrs(plan, "row")
    if cached:
        groups = ept // vec
        bound = f"j < {plan.n}"
        src += _cached_stats(plan, groups, vec, str(block), bound, "kf_block_max(m, scratch)",
                             "kf_block_sum(s, scratch)")
        src += _cached_write(plan, groups, vec, str(block), bound)
    else:
        src += _stream_stats(plan, vec, block, str(plan.n), online)
        src += _stream_write(plan, vec, block, str(plan.n))
    return src + "}\n", name, plan.rows


def _split_source(plan: _Plan, block: int, vec: int, chunks: int, online: bool) -> tuple[str, list[str], int, int]:
    length, count = _chunk_len(plan, chunks, vec)
    ept = _ept(length, block, vec)
    cached = ept <= MAX_CACHED
    it = plan.itype
    base = "kf_log_softmax" if plan.log else "kf_softmax"
    k1, k2 = f"{base}_partial", f"{base}_finish"
    src = _prelude(plan, f"{count} chunks of {length} per row; kernel 1 writes (max, sum) per chunk, "
                         "kernel 2 merges them and writes")
    head1 = _head(plan, k1, block, ", float* __restrict__ ws", out=False)
    head2 = _head(plan, k2, block, ", const float* __restrict__ ws")
    setup = f"""  __shared__ float scratch[32];
  const int t = threadIdx.x;
  const {it} row = blockIdx.x / {count};
  const {it} start = ({it})(blockIdx.x % {count}) * {length};
  const {it} len = min(({it}){length}, ({it}){plan.n} - start);
"""
    src += head1 + " {\n" + setup + _row_ptrs(plan, "row", out=False) + "  xr += start;\n"
    if cached:
        src += _cached_stats(plan, ept // vec, vec, str(block), "j < len", "kf_block_max(m, scratch)",
                             "kf_block_sum(s, scratch)")
    else:
        src += _stream_stats(plan, vec, block, "len", online)
    src += "  if (t == 0) { ws[2 * blockIdx.x] = m; ws[2 * blockIdx.x + 1] = s; }\n}\n\n"
    src += head2 + " {\n" + setup + _row_ptrs(plan, "row") + "  xr += start;\n  yr += start;\n"
    if cached:  # the chunk's loads are issued first and land while the partials merge
        src += f"""  float v[{ept // vec}][{vec}];
  #pragma unroll
  for (int g = 0; g < {ept // vec}; ++g) {{
    const {it} j = ({it})(g * {block} + t) * {vec};
    if (j < len) kf_load_vec<{vec}>(xr + j, v[g]);
  }}
"""
    src += f"""  // Merge the row's {count} partials: each thread folds a fixed subset in order, then the block.
  const float* p = ws + 2 * row * {count};
  float m = -INFINITY, s = 0.f;
  for (int q = t; q < {count}; q += {block}) kf_lse_merge(m, s, p[2 * q], p[2 * q + 1]);
  const float mt = m;
  m = kf_block_max(m, scratch);
  s = kf_block_sum(mt == -INFINITY ? 0.f : s * expf(mt - m), scratch);
"""
    if cached:
        src += _cached_write(plan, ept // vec, vec, str(block), "j < len", raw=True) + "}\n"
    else:
        src += _stream_write(plan, vec, block, "len") + "}\n"
    return src, [k1, k2], plan.rows * count, count


def _cluster_source(plan: _Plan, block: int, vec: int, size: int, online: bool) -> tuple[str, str, int]:
    """One launch: a cluster of `size` blocks per row. Each block reduces its chunk, publishes (max, sum)
    to the workspace, meets its cluster at a hardware barrier, merges the row's partials in rank order
    (the same in every block) and writes its chunk, from registers when the chunk fits."""
    per_block = -(-plan.n // size)
    length = -(-per_block // vec) * vec  # whole vectors; trailing blocks of a row may get less (or none)
    ept = _ept(length, block, vec)
    cached = ept <= MAX_CACHED
    it = plan.itype
    name = "kf_log_softmax_cluster" if plan.log else "kf_softmax_cluster"
    src = _prelude(plan, f"a cluster of {size} blocks per row, chunks of {length}, partials merged after a "
                         "cluster barrier", cluster=True)
    head = _head(plan, name, block, ", float* __restrict__ ws").replace(
        "__launch_bounds__", f"__cluster_dims__({size}, 1, 1) __launch_bounds__", 1)
    src += head + f""" {{
  __shared__ float scratch[32];
  __shared__ float total[2];
  const int t = threadIdx.x;
  const {it} row = blockIdx.x / {size};
  const {it} start = ({it})(blockIdx.x % {size}) * {length};
  const {it} len = start < ({it}){plan.n} ? min(({it}){length}, ({it}){plan.n} - start) : ({it})0;
"""
    src += _row_ptrs(plan, "row") + "  xr += start;\n  yr += start;\n"
    if cached:
        src += _cached_stats(plan, ept // vec, vec, str(block), "j < len", "kf_block_max(m, scratch)",
                             "kf_block_sum(s, scratch)", keep_exp=False)
    else:
        src += _stream_stats(plan, vec, block, "len", online)
    src += f"""  if (t == 0) {{ __stcg(ws + 2 * blockIdx.x, m); __stcg(ws + 2 * blockIdx.x + 1, s); }}
  kf_cluster_sync();  // the cluster's partials are all written
  if (t == 0) {{
    const float* p = ws + 2 * row * {size};
    float mm = -INFINITY, ss = 0.f;
    #pragma unroll
    for (int q = 0; q < {size}; ++q) kf_lse_merge(mm, ss, __ldcg(p + 2 * q), __ldcg(p + 2 * q + 1));
    total[0] = mm;
    total[1] = ss;
  }}
  __syncthreads();
  m = total[0];
  s = total[1];
"""
    if cached:
        src += _cached_write(plan, ept // vec, vec, str(block), "j < len", raw=True)
    else:
        src += _stream_write(plan, vec, block, "len")
    return src + "}\n", name, plan.rows * size


# ------------------------------------------------------------------------------------------ template

BLOCKS = (256, 128, 512, 1024)
CHUNKS = (8, 16, 32, 64, 128, 256, 512, 1024)
# Blocks per row in the cluster strategy. 8 is sm_90's portable limit; 16 needs the non-portable opt-in
# (the lane and the cast runtime set it) and a GPC with 16 free SMs, which the H200 has.
CLUSTERS = (16, 8, 4, 2)


class SoftmaxTemplate(Template):
    """Softmax and log-softmax over a contiguous last dim (warp / block / split strategies)."""

    name = "softmax"
    ops = frozenset({"aten::_softmax", "aten::_log_softmax"})

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(_analyse, card)

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        plan = _analyse(card)
        vecs = [v for v in (1, 2, 4, 8) if _vec_ok(plan, v)]
        best = max(v for v in vecs if v * cc.itemsize(plan.in_dtype) <= 16)
        strategies = ["block"]
        if plan.n <= 32 * MAX_WARP_ROW:
            strategies.append("warp")
        # Split only where rows are too few to fill the GPU, into chunks of ≥ MIN_CHUNK elements (on the
        # H200, 2048-wide rows in 8 chunks ran 11x slower than a block per row: tiny blocks, two launches).
        chunks = [c for c in CHUNKS if plan.n // c >= MIN_CHUNK] if plan.rows < 8 * hw.sms else []
        if chunks:
            strategies.append("split")
        clusters = ([c for c in CLUSTERS if plan.n // c >= MIN_CHUNK]
                    if plan.rows < 8 * hw.sms and cc.has_clusters(hw) else [])
        if clusters:
            strategies.append("cluster")
        # Default: warp for short rows, split when the rows alone cannot fill the GPU, else block.
        if plan.n <= 1024:
            first = "warp"
        elif chunks and plan.rows < 2 * hw.sms:
            first = "split"
        else:
            first = "block"
        space: dict[str, list[Any]] = {
            "strategy": [first] + [s for s in strategies if s != first],
            "block": list(BLOCKS),
            "vec": [best] + [v for v in vecs if v != best],
            "online": [True, False],  # one streaming pass fewer; matters only for rows not in registers
        }
        if chunks:
            # About two blocks per SM in all: on the H200, [4, 262144] took 11 us in 128 chunks per row
            # and 24 us in 1024 (more blocks, more scheduling and partials); fewer is the better side.
            want = 2 * hw.sms / plan.rows
            near = min(chunks, key=lambda c: (abs(math.log2(c / want)), c))
            space["chunks"] = [near] + [c for c in chunks if c != near]
        if clusters:
            space["cluster"] = clusters
        return space

    def _relevant(self, card: OperatorCard, params: Mapping[str, Any]) -> set[str]:
        """Parameters that change the kernel for this strategy (the others are left at defaults)."""
        plan = _analyse(card)
        strategy, block, vec = params["strategy"], int(params["block"]), int(params["vec"])
        keys = {"strategy", "block", "vec"}
        if strategy == "block" and _ept(plan.n, block, vec) > MAX_CACHED:
            keys.add("online")
        if strategy == "split":
            keys.add("chunks")
            length, _ = _chunk_len(plan, int(params["chunks"]), vec)
            if _ept(length, block, vec) > MAX_CACHED:
                keys.add("online")
        if strategy == "cluster":
            keys.add("cluster")
            if _ept(-(-plan.n // int(params["cluster"])), block, vec) > MAX_CACHED:
                keys.add("online")
        return keys

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        """Change one parameter that matters for the current strategy (or the strategy itself)."""
        return cc.mutate_relevant(self.space(card, hw=hw), params, lambda p: self._relevant(card, p), rng,
                                  intent_params(intent))

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        plan = _analyse(card)
        space = self.space(card, hw=hw)
        for k, vals in space.items():
            if k in params and params[k] not in vals:
                raise ValueError(f"{k}={params[k]!r} is outside {list(vals)}")
        p = {**self.default(card, hw=hw), **params}
        strategy, block, vec, online = p["strategy"], int(p["block"]), int(p["vec"]), bool(p["online"])
        if strategy == "warp":
            src, name, grid = _warp_source(plan, block, vec)
            spec = (f"[[launch]]\nkernel = \"{name}\"\ngrid = [{grid}]\nblock = [{block}]\n"
                    "args = [{ ptr = \"self\" }, { ptr = \"out0\" }]\n")
            intent = f"warp per row ({_lanes(plan, vec)} lanes), {vec}-wide loads, block {block}"
        elif strategy == "block":
            src, name, grid = _block_source(plan, block, vec, online)
            spec = (f"[[launch]]\nkernel = \"{name}\"\ngrid = [{grid}]\nblock = [{block}]\n"
                    "args = [{ ptr = \"self\" }, { ptr = \"out0\" }]\n")
            intent = f"block of {block} per row, {vec}-wide loads" + (", online" if online else "")
        elif strategy == "split":
            src, (k1, k2), grid, count = _split_source(plan, block, vec, int(p["chunks"]), online)
            spec = (f"# {count} chunks per row: per-chunk (max, sum) partials, then merge + write\n"
                    f"[[workspace]]\nname = \"partials\"\nbytes = {plan.rows * count * 8}\n\n"
                    f"[[launch]]\nkernel = \"{k1}\"\ngrid = [{grid}]\nblock = [{block}]\n"
                    "args = [{ ptr = \"self\" }, { ptr = \"ws.partials\" }]\n\n"
                    f"[[launch]]\nkernel = \"{k2}\"\ngrid = [{grid}]\nblock = [{block}]\n"
                    "args = [{ ptr = \"self\" }, { ptr = \"out0\" }, { ptr = \"ws.partials\" }]\n")
            intent = f"split rows into {count} chunks, block {block}, {vec}-wide loads"
        elif strategy == "cluster":
            size = int(p["cluster"])
            src, name, grid = _cluster_source(plan, block, vec, size, online)
            spec = (f"# clusters of {size} blocks per row (__cluster_dims__), partials through the workspace\n"
                    f"[[workspace]]\nname = \"partials\"\nbytes = {grid * 8}\n\n"
                    f"[[launch]]\nkernel = \"{name}\"\ngrid = [{grid}]\nblock = [{block}]\n"
                    "args = [{ ptr = \"self\" }, { ptr = \"out0\" }, { ptr = \"ws.partials\" }]\n")
            intent = f"cluster of {size} blocks per row, block {block}, {vec}-wide loads"
        else:
            raise ValueError(f"strategy {strategy!r}")
        return Rendered(src, spec, p, intent)


TEMPLATES: list[Template] = [SoftmaxTemplate()]
