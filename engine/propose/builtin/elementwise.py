"""Elementwise template: unary activations/math and add/sub/mul/div with broadcasting, fp32/fp16/bf16.

One kernel shape covers every layout the card can have. The output must be dense (row-major or any
permutation of it, e.g. channels_last); dims are reordered into the output's memory order and merged
where every tensor walks them as one, so a same-layout op becomes a flat 1-D loop and a broadcast becomes
a few dims of index math with the sizes and strides baked in as constants (the card is exact).

Each thread handles `vec` consecutive elements along the innermost dim, `unroll` such groups per loop
trip (vec * unroll capped at 16; kernels are bounded for 1024-thread blocks). Per tensor, the group is one aligned vector access (inner stride 1, alignment allows), one load
splatted (inner stride 0: broadcast) or `vec` scalar accesses (anything else): misalignment costs speed,
never coverage. Values are computed in fp32 with eager's formulas and rounded once to the output dtype
(eager's "opmath"), so half types match eager to the last bit in most cases.

Mixed layouts (`strategy` "tile"): where an input runs along another dim than the output does (the
permuted residual stream of an audio or vision encoder added to a contiguous projection: eager walks one
of them element by element), a 32 x 32 tile of it goes through shared memory. The block reads the tile
along that input's unit-stride dim and writes the output along its own, so every access is coalesced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template

# ------------------------------------------------------------------------------------------ formulas
# Each returns the body of `float kf_op(float a, float b)` (b unused for unary ops), or raises
# _Decline. The formulas are eager's CUDA functors written out in fp32 (its opmath type).


_Decline = cc.Decline  # this card is outside what the template computes exactly


_SQRT1_2 = 0.70710678118654752440
_GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5  # M_SQRT2 * M_2_SQRTPI * 0.5
_UNARY_SIMPLE = {
    # NaN passes through relu like eager's clamp_min; -0.0 -> 0.0 compares equal.
    "relu": "return (a > 0.f || a != a) ? a : 0.f;",
    "silu": "return a / (1.0f + expf(-a));",
    "sigmoid": "return 1.0f / (1.0f + expf(-a));",
    "tanh": "return tanhf(a);",
    "neg": "return -a;",
    "exp": "return expf(a);",
    "rsqrt": "return rsqrtf(a);",
    "sqrt": "return sqrtf(a);",
    "abs": "return fabsf(a);",
    "reciprocal": "return 1.0f / a;",
    "log": "return logf(a);",
    "erf": "return erff(a);",
    "sin": "return sinf(a);",
    "cos": "return cosf(a);",
}
_UNARY_ARGS = {"gelu", "leaky_relu", "softplus", "pow"}
_BINARY = ("add", "sub", "mul", "div")


def _number(v: Any, what: str) -> float:
    """A scalar argument as eager's fp32 opmath sees it (static_cast<float>)."""
    if not isinstance(v, (bool, int, float)):
        raise _Decline(f"{what} is {type(v).__name__}, not a real number")
    f = cc.f32(float(v))
    if not math.isfinite(f):
        raise _Decline(f"{what}={v!r} is not a finite float32")
    return f


def _gelu(card: OperatorCard) -> str:
    approx = cc.value_arg(card, "approximate", "none")
    if approx == "tanh":
        beta, kappa = cc.float_literal(_GELU_BETA), cc.float_literal(0.044715)
        return (f"const float c = a * a * a;\n  const float inner = {beta} * (a + {kappa} * c);\n"
                "  return 0.5f * a * (1.0f + tanhf(inner));")
    if approx == "none":
        return f"return a * 0.5f * (1.0f + erff(a * {cc.float_literal(_SQRT1_2)}));"
    raise _Decline(f"gelu approximate={approx!r}")


# The `math = "fast"` variant of a tanh-based body: tanh(u) = 1 - 2 / (exp(2u) + 1) with the hardware exp.
_FAST_TANH = ("tanhf(inner)", "(1.0f - __fdividef(2.0f, __expf(2.0f * inner) + 1.0f))")


def _leaky_relu(card: OperatorCard) -> str:
    slope = _number(cc.value_arg(card, "negative_slope", 0.01), "negative_slope")
    return f"return a > 0.f ? a : a * {cc.float_literal(slope)};"


def _softplus(card: OperatorCard) -> str:
    beta = _number(cc.value_arg(card, "beta", 1), "beta")
    threshold = _number(cc.value_arg(card, "threshold", 20), "threshold")
    if beta == 0.0:
        raise _Decline("softplus beta=0")
    b, t = cc.float_literal(beta), cc.float_literal(threshold)
    return f"const float ab = a * {b};\n  return ab > {t} ? a : log1pf(expf(ab)) / {b};"


def _pow(card: OperatorCard, dtype: str) -> str:
    # ATen's pow(Tensor, Scalar) dispatch: 0 -> fill 1, 1 -> copy, ±0.5 -> sqrt/rsqrt, -1 -> reciprocal,
    # 2 / 3 / -2 -> products in the tensor's dtype (so 3 rounds the square first), else pow().
    e = cc.value_arg(card, "exponent")
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e):
        raise _Decline(f"exponent {e!r}")
    t = cc.ctype(dtype)
    table = {0.0: "return 1.0f;", 1.0: "return a;", 0.5: "return sqrtf(a);", -0.5: "return rsqrtf(a);",
             -1.0: "return 1.0f / a;", 2.0: "return a * a;",
             3.0: f"return kf_round<{t}>(a * a) * a;",
             -2.0: f"return 1.0f / kf_round<{t}>(a * a);"}
    if float(e) in table:
        return table[float(e)]
    if dtype != "float32":
        raise _Decline(f"exponent {e!r} on {dtype} (eager rounds the exponent to the dtype)")
    return f"return powf(a, {cc.float_literal(e)});"


# ----------------------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class _Operand:
    """A tensor input as the kernel walks it (strides over the plan's coalesced dims)."""

    arg: str            # schema name
    dtype: str
    strides: tuple[int, ...]
    align: int
    via_out: bool       # in-place self: read through the output pointer


@dataclass(frozen=True)
class _Plan:
    fn: str
    inplace: bool
    body: str                       # of kf_op(a, b)
    operands: tuple[_Operand, ...]  # a (and b when b is a tensor), in order
    b_literal: str | None           # b when it is a scalar
    out_dtype: str
    out_align: int
    sizes: tuple[int, ...]          # coalesced dims, outermost first; the output is dense over them
    numel: int

    @property
    def flat(self) -> bool:
        return len(self.sizes) <= 1


def _split_op(op: str) -> tuple[str, bool, str]:
    name = op.split("::", 1)[-1]
    base, _, overload = name.partition(".")
    inplace = base.endswith("_")
    return base.rstrip("_"), inplace, overload


def _ops() -> frozenset[str]:
    names = []
    for fn in [*_UNARY_SIMPLE, "gelu", "leaky_relu"]:
        names += [f"aten::{fn}", f"aten::{fn}_"]
    names.append("aten::softplus")  # ATen has no softplus_
    names += ["aten::pow.Tensor_Scalar", "aten::pow_.Scalar"]
    for fn in _BINARY:
        for ov in ("Tensor", "Scalar"):
            names += [f"aten::{fn}.{ov}", f"aten::{fn}_.{ov}"]
    return frozenset(names)


def _promote(dtypes: Sequence[str]) -> str:
    """torch.promote_types over float dtypes: equal stays, any mix of f32/f16/bf16 is f32."""
    return dtypes[0] if len(set(dtypes)) == 1 else "float32"


def _analyse(card: OperatorCard) -> _Plan:
    fn, inplace, overload = _split_op(card.op)
    if fn in _BINARY:
        if overload not in ("Tensor", "Scalar"):
            raise _Decline(f"overload {overload!r}")
    elif fn == "pow":
        if overload != ("Scalar" if inplace else "Tensor_Scalar"):
            raise _Decline(f"pow overload {overload!r}")
    elif fn not in _UNARY_SIMPLE and fn not in _UNARY_ARGS or overload:
        raise _Decline(f"op {card.op}")

    self_ = cc.usable_tensor(card, "self")
    tensors: list[tuple[str, dict[str, Any]]] = [("self", self_)]
    b_value: float | None = None
    if fn in _BINARY:
        other = cc.raw_arg(card, "other")
        if other is None:
            raise _Decline("no 'other' argument")
        if other.get("kind") == "tensor" and not other.get("absent"):
            why = cc.check_tensor(other, "other")
            if why:
                raise _Decline(why)
            tensors.append(("other", other))
        elif other.get("kind") == "value":
            b_value = _number(cc.value_arg(card, "other"), "other")
        else:
            raise _Decline("'other' is neither a tensor nor a number")

    out = cc.single_output(card)

    # Dtypes: eager computes in the promoted dtype's opmath (fp32 for every dtype here). That equals
    # loading each input exactly as fp32 unless an input would first be rounded to a narrower common
    # dtype (an f32 0-dim tensor next to a bf16 tensor): decline that.
    ranked = [t for _, t in tensors if len(t["shape"]) > 0] or [t for _, t in tensors]
    common = _promote([t["dtype"] for t in ranked])
    if common != "float32" and any(t["dtype"] != common for _, t in tensors):
        raise _Decline(f"mixed dtypes {[t['dtype'] for _, t in tensors]} round an input to {common}")
    if inplace:
        if out["dtype"] != self_["dtype"] or list(out["shape"]) != list(self_["shape"]):
            raise _Decline("in-place output is not self")
        if len(tensors) > 1 and cc.aliased_with(card, "self"):
            raise _Decline("in-place self overlaps another argument")
    elif out["dtype"] != common:
        raise _Decline(f"output dtype {out['dtype']} is not the promoted {common}")

    # Shapes: broadcast every input to the output's shape (stride 0 where it broadcasts).
    oshape = [int(n) for n in out["shape"]]
    numel = math.prod(oshape)
    if numel == 0:
        raise _Decline("empty output")
    bstrides: list[list[int]] = []
    for name, t in tensors:
        shape, stride = list(t["shape"]), list(t["stride"])
        if len(shape) > len(oshape):
            raise _Decline(f"{name} has more dims than the output")
        pad = len(oshape) - len(shape)
        row = []
        for d, n in enumerate(oshape):
            if d < pad:
                row.append(0)
                continue
            m, s = int(shape[d - pad]), int(stride[d - pad])
            if m == n:
                row.append(s if n > 1 else 0)
            elif m == 1:
                row.append(0)
            else:
                raise _Decline(f"{name} shape {shape} does not broadcast to {oshape}")
        bstrides.append(row)
    order = cc.dense_order(oshape, out["stride"])
    if order is None:
        raise _Decline(f"output strides {out['stride']} are not dense")
    if inplace and [bstrides[0][d] for d in order] != [int(out["stride"][d]) for d in order]:
        raise _Decline("in-place self is not laid out as the output")
    sizes = [oshape[d] for d in order]
    ostrides = [int(out["stride"][d]) for d in order]
    merged, mstrides = cc.coalesce(sizes, [ostrides] + [[r[d] for d in order] for r in bstrides])

    if fn in _UNARY_SIMPLE:
        body = _UNARY_SIMPLE[fn]
    elif fn == "gelu":
        body = _gelu(card)
    elif fn == "leaky_relu":
        body = _leaky_relu(card)
    elif fn == "softplus":
        body = _softplus(card)
    elif fn == "pow":
        body = _pow(card, self_["dtype"])
    else:
        body = _binary_body(card, fn, overload, b_is_scalar=b_value is not None)
    operands = tuple(
        _Operand(name, t["dtype"], tuple(st), int(t.get("align", 16)), via_out=inplace and name == "self")
        for (name, t), st in zip(tensors, mstrides[1:]))
    return _Plan(fn, inplace, body, operands,
                 None if b_value is None else cc.float_literal(b_value if fn != "div" else _recip(b_value)),
                 out["dtype"], int(out.get("align", 16)), tuple(merged), numel)


def _recip(b: float) -> float:
    # eager divides by a CPU scalar as a * (1.0f / b), the reciprocal computed once in fp32 on the host.
    if b == 0.0:
        raise _Decline("division by a zero scalar")
    inv = cc.f32(1.0 / b)
    if not math.isfinite(inv):
        raise _Decline(f"1/{b!r} overflows float32")
    return inv


def _binary_body(card: OperatorCard, fn: str, overload: str, *, b_is_scalar: bool) -> str:
    if fn in ("add", "sub"):
        alpha = _number(cc.value_arg(card, "alpha", 1), "alpha")
        # ATen's sub is add with -alpha: a + (-alpha) * b; alpha 1 is exactly a ± b.
        if alpha == 1.0:
            return "return a + b;" if fn == "add" else "return a - b;"
        k = alpha if fn == "add" else -alpha
        return f"return a + {cc.float_literal(k)} * b;"
    if fn == "mul":
        return "return a * b;"
    # div: a true division by a tensor; by a scalar, a multiply with its fp32 reciprocal (b holds it).
    return "return a * b;" if b_is_scalar else "return a / b;"


# ------------------------------------------------------------------------------------------ codegen


def _mode(plan: _Plan, op: _Operand, vec: int) -> str:
    """'vec' (aligned vector access), 'splat' (inner stride 0) or 'gather' (scalar accesses)."""
    if vec == 1:
        return "gather"
    inner = op.strides[-1] if op.strides else 0
    if inner == 0:
        return "splat"
    isz = cc.itemsize(op.dtype)
    need = min(16, vec * isz)
    align = plan.out_align if op.via_out else op.align
    if inner == 1 and align >= need and all(s * isz % need == 0 for s in op.strides[:-1]):
        return "vec"
    return "gather"


def _vec_ok(plan: _Plan, vec: int) -> bool:
    # Flat loops take any vec (a scalar tail finishes); otherwise a vector never crosses a row.
    return vec == 1 or plan.flat or plan.sizes[-1] % vec == 0


def _out_vec(plan: _Plan, vec: int) -> bool:
    return vec > 1 and plan.out_align >= min(16, vec * cc.itemsize(plan.out_dtype))


def _offset(plan: _Plan, op: _Operand, itype: str) -> str:
    """Element offset of flat output index `e` in one operand; its dims merge on their own (a
    contiguous input next to a broadcast one still indexes as `e`)."""
    sizes, (strides,) = cc.coalesce(plan.sizes, [op.strides])
    return cc.offset_code("e", sizes, strides, itype)


def _kernel_name(plan: _Plan) -> str:
    return f"kf_ew_{plan.fn}"


def _source(plan: _Plan, vec: int, unroll: int) -> str:
    nv = plan.numel // vec
    tail = plan.numel - nv * vec
    # Offsets reach at most numel * max stride; 32-bit index math when everything stays below 2**31.
    extent = max([plan.numel] + [sum((n - 1) * s for n, s in zip(plan.sizes, o.strides)) + 1
                                 for o in plan.operands])
    itype = cc.int_type(extent + plan.numel)
    tout = cc.ctype(plan.out_dtype)
    params, loads = [], []
    names = "ab"
    decls = []
    for k, op in enumerate(plan.operands):
        ptr = "out" if op.via_out else f"in{k}"
        t = cc.ctype(op.dtype)
        if not op.via_out:
            params.append(f"const {t}* __restrict__ in{k}")
        # Loaded values stay in the tensor's dtype until computed: half the registers for fp16/bf16.
        decls.append(f"kf_vec<{t}, {vec}> r{names[k]}[{unroll}];")
        offset = "e" if op.via_out else _offset(plan, op, itype)
        mode = _mode(plan, op, vec)
        x = f"r{names[k]}[u]"
        if mode == "vec":
            loads.append(f"{x} = *reinterpret_cast<const kf_vec<{t}, {vec}>*>({ptr} + ({offset}));")
        elif mode == "splat":
            loads.append(f"{{ const {t} t = {ptr}[{offset}];\n"
                         f"          #pragma unroll\n"
                         f"          for (int k = 0; k < {vec}; ++k) {x}.v[k] = t; }}")
        else:
            inner = op.strides[-1] if op.strides else 0
            step = "" if inner == 0 else (" + k" if inner == 1 else f" + ({itype})k * {inner}")
            loads.append(f"{{ const {itype} o = {offset};\n"
                         f"          #pragma unroll\n"
                         f"          for (int k = 0; k < {vec}; ++k) {x}.v[k] = {ptr}[o{step}]; }}")
    params.append(f"{tout}* __restrict__ out")
    b_arg = ("kf_to_float(rb[u].v[k])" if len(plan.operands) > 1 else (plan.b_literal or "0.f"))
    if _out_vec(plan, vec):
        store = f"kf_store_vec<{vec}>(out + e, y);"
    else:
        store = f"#pragma unroll\n        for (int k = 0; k < {vec}; ++k) out[e + k] = kf_from_float<{tout}>(y[k]);"
    tail_code = ""
    if tail:
        tail_loads = []
        for k, op in enumerate(plan.operands):
            ptr = "out" if op.via_out else f"in{k}"
            offset = "e" if op.via_out else _offset(plan, op, itype)
            tail_loads.append(f"const float {names[k]} = kf_to_float({ptr}[{offset}]);")
        if len(plan.operands) == 1:
            tail_loads.append(f"const float b = {plan.b_literal or '0.f'};")
        tail_code = (f"\n  // The last {tail} element(s) when numel is not a multiple of {vec}.\n"
                     f"  if (blockIdx.x == 0 && threadIdx.x < {tail}) {{\n"
                     f"    const {itype} e = ({itype}){nv * vec} + threadIdx.x;\n"
                     f"    {' '.join(tail_loads)}\n"
                     f"    out[e] = kf_from_float<{tout}>(kf_op(a, b));\n  }}")
    dtypes = {plan.out_dtype} | {o.dtype for o in plan.operands}
    desc = ", ".join(f"{o.arg} {o.dtype} strides {list(o.strides)} ({_mode(plan, o, vec)})" for o in plan.operands)
    return f"""// aten {plan.fn}{'_ (in place)' if plan.inplace else ''}: fp32 math, one rounding to {plan.out_dtype}.
// dims (output order, merged) {list(plan.sizes)}; {desc}; {vec} element(s) x {unroll} per thread per trip.
{cc.prelude(dtypes, vec=True, round_='kf_round' in plan.body)}
__device__ __forceinline__ float kf_op(float a, float b) {{
  (void)b;
  {plan.body}
}}

// Bounded for 1024 threads so every block size of the space can launch (≤ 64 registers).
extern "C" __global__ void __launch_bounds__(1024) {_kernel_name(plan)}({', '.join(params)}) {{
  const {itype} nv = {nv};
  const {itype} step = ({itype})gridDim.x * blockDim.x * {unroll};
  for ({itype} base = ({itype})blockIdx.x * blockDim.x * {unroll} + threadIdx.x; base < nv; base += step) {{
    {' '.join(decls)}
    // All loads of the trip first, so {unroll * len(plan.operands)} independent accesses are in flight.
    #pragma unroll
    for (int u = 0; u < {unroll}; ++u) {{
      const {itype} v = base + ({itype})u * blockDim.x;
      if (v < nv) {{
        const {itype} e = v * {vec};
        {(chr(10) + '        ').join(loads)}
      }}
    }}
    #pragma unroll
    for (int u = 0; u < {unroll}; ++u) {{
      const {itype} v = base + ({itype})u * blockDim.x;
      if (v < nv) {{
        const {itype} e = v * {vec};
        float y[{vec}];
        #pragma unroll
        for (int k = 0; k < {vec}; ++k) y[k] = kf_op(kf_to_float(ra[u].v[k]), {b_arg});
        {store}
      }}
    }}
  }}{tail_code}
}}
"""


# ------------------------------------------------------------------------------------------ mixed layouts

TILES = (64, 32)  # tile edge: 32 lanes x 1 or 2 elements each
WARP = 32


def _tile_dims(plan: _Plan) -> tuple[int, tuple[int, ...]] | None:
    """(p, tiled): the dim along which the tiled operands run with stride 1 and their indices, where some
    operand walks the output's innermost dim with a stride other than 0 or 1 but another dim with stride 1
    (all such operands the same dim); None where no operand needs it (or they disagree)."""
    if len(plan.sizes) < 2:
        return None
    last = len(plan.sizes) - 1
    dims: set[int] = set()
    tiled = []
    for k, op in enumerate(plan.operands):
        if op.via_out or op.strides[last] in (0, 1):
            continue
        unit = [d for d in range(last) if op.strides[d] == 1]
        if not unit:
            return None  # no dim to read it along contiguously: a tile gains nothing over a gather
        dims.add(unit[0])
        tiled.append(k)
    if len(dims) != 1:
        return None
    return next(iter(dims)), tuple(tiled)


def _tile_count(plan: _Plan, p: int, tile: int) -> int:
    """Tiles of the output: tile x tile over (p, q = innermost), times every other dim."""
    last = len(plan.sizes) - 1
    batch = math.prod(n for d, n in enumerate(plan.sizes[:last]) if d != p)
    return -(-plan.sizes[last] // tile) * -(-plan.sizes[p] // tile) * batch


def _tile_source(plan: _Plan, p: int, tiled: tuple[int, ...], tile: int, block: int) -> str:
    """The tiled kernel: one tile x tile square of dims (p, q = innermost) per block and loop trip
    (grid-stride over the tiles, the other dims outermost). The block is 32 lanes x `block / 32` rows; each
    lane takes tile / 32 neighbouring elements along the dim it walks. The direct operands' loads for the
    write half are issued before the barrier, with the tiled operands', so both are in flight together."""
    last = len(plan.sizes) - 1
    P, Q = plan.sizes[p], plan.sizes[last]
    rest = [d for d in range(last) if d != p]
    bsizes = [plan.sizes[d] for d in rest]
    nq, np_ = -(-Q // tile), -(-P // tile)
    tiles = _tile_count(plan, p, tile)
    rows, per = block // WARP, tile // WARP
    trips = -(-tile // rows)
    ostrides = [math.prod(plan.sizes[d + 1:]) for d in range(len(plan.sizes))]
    extent = max([plan.numel, tiles] + [sum((n - 1) * s for n, s in zip(plan.sizes, o.strides)) + 1
                                        for o in plan.operands])
    itype = cc.int_type(extent + plan.numel)
    tout = cc.ctype(plan.out_dtype)
    names = "ab"

    def at(strides: Sequence[int], pp: str, qq: str) -> str:
        boff = cc.offset_code("z", bsizes, [strides[d] for d in rest], itype)
        sp, sq = strides[p], strides[last]
        terms = [f"({boff})" if boff != "0" else "", f"{pp} * ({itype}){sp}" if sp else "",
                 (qq if sq == 1 else f"{qq} * ({itype}){sq}") if sq else ""]
        return " + ".join(x for x in terms if x) or "0"

    params, shared, decls, loads, prefetch, reads = [], [], [], [], [], []
    for k, op in enumerate(plan.operands):
        ptr = "out" if op.via_out else f"in{k}"
        t = cc.ctype(op.dtype)
        if not op.via_out:
            params.append(f"const {t}* __restrict__ in{k}")
        strides = op.strides if not op.via_out else tuple(ostrides)
        x = names[k]
        if k in tiled:
            shared.append(f"__shared__ float t{x}[{tile}][{tile + 1}];")
            loads.append(f"if (qq < {Q} && pp < {P}) t{x}[r][lane * {per} + j] = "
                         f"kf_to_float({ptr}[{at(strides, 'pp', 'qq')}]);")
            reads.append(f"const float {x} = t{x}[lane * {per} + j][r];")
        else:
            decls.append(f"float v{x}[{trips}][{per}];")
            prefetch.append(f"v{x}[i][j] = (pp < {P} && qq < {Q}) ? kf_to_float({ptr}[{at(strides, 'pp', 'qq')}]) : 0.f;")
            reads.append(f"const float {x} = v{x}[i][j];")
    if len(plan.operands) == 1:
        reads.append(f"const float b = {plan.b_literal or '0.f'};")
    params.append(f"{tout}* __restrict__ out")
    dtypes = {plan.out_dtype} | {o.dtype for o in plan.operands}
    desc = ", ".join(f"{o.arg} {o.dtype} strides {list(o.strides)}" + (" (tiled)" if k in tiled else "")
                     for k, o in enumerate(plan.operands))
    nl = chr(10)
    return f"""// aten {plan.fn}{'_ (in place)' if plan.inplace else ''}: fp32 math, one rounding to {plan.out_dtype}.
// dims (output order, merged) {list(plan.sizes)}; {desc}. Mixed layouts: {tile} x {tile} tiles of dim
// p = {p} ({P}) and q = {last} ({Q}, the output's innermost), {tiles} tiles in all; {rows} rows of 32 lanes.
{cc.prelude(dtypes, round_='kf_round' in plan.body)}
__device__ __forceinline__ float kf_op(float a, float b) {{
  (void)b;
  {plan.body}
}}

extern "C" __global__ void __launch_bounds__({block}) {_kernel_name(plan)}_tile({', '.join(params)}) {{
  {' '.join(shared)}
  const unsigned lane = threadIdx.x % {WARP}, row = threadIdx.x / {WARP};
  for ({itype} tile = blockIdx.x; tile < ({itype}){tiles}; tile += gridDim.x) {{
    const {itype} q0 = (tile % {nq}) * {tile}, p0 = ((tile / {nq}) % {np_}) * {tile}, z = tile / {nq * np_};
    {' '.join(decls)}
    // The tiled inputs, read along their own unit-stride dim (p): the lanes walk p.
    #pragma unroll
    for (int i = 0; i < {trips}; ++i) {{
      const unsigned r = row + i * {rows};
      #pragma unroll
      for (int j = 0; j < {per}; ++j) {{
        const {itype} pp = p0 + lane * {per} + j, qq = q0 + r;
        if (r < {tile}) {{ {(nl + '        ').join(loads)} }}
      }}
    }}
    // The other inputs, read along the output's innermost dim (q), in flight with those.
    #pragma unroll
    for (int i = 0; i < {trips}; ++i) {{
      const unsigned r = row + i * {rows};
      #pragma unroll
      for (int j = 0; j < {per}; ++j) {{
        const {itype} pp = p0 + r, qq = q0 + lane * {per} + j;
        (void)pp; (void)qq;
        {(nl + '        ').join(prefetch)}
      }}
    }}
    __syncthreads();
    // The output, written along its innermost dim (q): the lanes walk q.
    #pragma unroll
    for (int i = 0; i < {trips}; ++i) {{
      const unsigned r = row + i * {rows};
      #pragma unroll
      for (int j = 0; j < {per}; ++j) {{
        const {itype} pp = p0 + r, qq = q0 + lane * {per} + j;
        if (r < {tile} && pp < {P} && qq < {Q}) {{
          {(nl + '          ').join(reads)}
          out[{at(ostrides, 'pp', 'qq')}] = kf_from_float<{tout}>(kf_op(a, b));
        }}
      }}
    }}
    __syncthreads();  // the tiles are refilled in the next trip
  }}
}}
"""


# ------------------------------------------------------------------------------------------ template


BLOCKS = (256, 128, 512, 1024)
VECS = (1, 2, 4, 8)
UNROLLS = (1, 2, 4)
WAVES = (0, 1, 2, 4, 8)  # 0: one thread per work item; k: grid capped at k full waves, grid-stride loop
MAX_ITEMS = 16  # vec * unroll cap (see render)


class ElementwiseTemplate(Template):
    """Unary and binary elementwise ops, any dense output layout, broadcasting by strides."""

    name = "elementwise"
    ops = _ops()

    def _plan(self, card: OperatorCard) -> _Plan:
        return _analyse(card)

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        if card.op not in self.ops:
            return f"op {card.op} is not elementwise"
        return cc.why_declined(self._plan, card)

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        plan = self._plan(card)
        isz = max(cc.itemsize(plan.out_dtype), *(cc.itemsize(o.dtype) for o in plan.operands))
        vecs = [v for v in VECS if _vec_ok(plan, v)]
        # Default: the widest vector that is still one 16-byte access per tensor.
        best = max(v for v in vecs if v * isz <= 16)
        space: dict[str, list[Any]] = {"vec": [best] + [v for v in vecs if v != best], "block": list(BLOCKS),
                                       "unroll": list(UNROLLS), "waves": list(WAVES)}
        if _tile_dims(plan) is not None:
            # "tile" (mixed layouts through shared memory) first; "direct" is the one-pass kernel, which
            # reads the tiled operand element by element. `block` is then the tile's threads (32 x rows).
            space["strategy"] = ["tile", "direct"]
            space["tile"] = list(TILES)
        if _FAST_TANH[0] in plan.body:
            # tanh through exp: fewer instructions than tanhf, accurate to a few 1e-7 absolute in 1 + tanh;
            # verification decides whether the card's tolerance takes it. First for half-precision outputs,
            # whose rounding hides it. An estimate, not yet a measurement: at ~3 elements per clock per SM
            # (bf16 [1,2048,8192] in 20.9 us on the H200, 76 % of copy), tanhf's ~40 instructions an element
            # would fill the SMs' issue slots, as eager's SiLU formula did in the GroupNorm -> SiLU chain
            # (measured there: 252 us precise against 217 us fast).
            space["math"] = cc.math_choices(plan.out_dtype)
        return space

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        plan = self._plan(card)
        space = self.space(card, hw=hw)
        for k, vals in space.items():
            if params.get(k, vals[0] if k in ("math", "strategy", "tile") else None) not in vals:
                raise ValueError(f"{k}={params.get(k)!r} is outside {list(vals)}")
        vec, block, unroll, waves = (int(params[k]) for k in ("vec", "block", "unroll", "waves"))
        fast = params.get("math") == "fast"
        if fast:
            plan = replace(plan, body=plan.body.replace(*_FAST_TANH))
        # At most 16 elements per operand in flight per thread: more spills under the 64-register
        # bound that lets 1024-thread blocks launch, so larger unrolls of wide vectors are capped.
        unroll = min(unroll, max(1, MAX_ITEMS // vec))
        nv = plan.numel // vec
        blocks = max(1, -(-nv // (block * unroll)))
        if waves:
            blocks = min(blocks, hw.sms * max(1, hw.max_threads_per_sm // block) * waves)  # a wave: all resident
        args = [f'{{ ptr = "{o.arg}" }}' for o in plan.operands if not o.via_out]
        args.append('{ ptr = "self" }' if plan.inplace else '{ ptr = "out0" }')
        tile = _tile_dims(plan) if params.get("strategy", "direct") == "tile" else None
        if tile is not None:
            p, tiled = tile
            edge = int(params.get("tile", TILES[0]))
            tiles = _tile_count(plan, p, edge)
            grid = min(tiles, hw.sms * max(1, hw.max_threads_per_sm // block) * waves) if waves else tiles
            spec = (f"# {plan.numel} elements in {tiles} tiles of {edge} x {edge} over dims {p} and "
                    f"{len(plan.sizes) - 1}; grid {'capped at ' + str(waves) + ' wave(s)' if waves else 'a block per tile'}\n"
                    f"[[launch]]\nkernel = \"{_kernel_name(plan)}_tile\"\ngrid = [{grid}]\n"
                    f"block = [{block}]\nargs = [{', '.join(args)}]\n")
            intent = (f"{plan.fn}: mixed layouts, {edge}x{edge} tiles through shared memory, "
                      f"{block // WARP} rows per block, " + (f"grid-stride over {waves} wave(s)" if waves else
                                                               "a block per tile") + (", tanh via exp" if fast else ""))
            return Rendered(_tile_source(plan, p, tiled, edge, block), spec,
                            {**params, "vec": space["vec"][0], "unroll": 1}, intent)
        source = _source(plan, vec, unroll)
        spec = (f"# {plan.numel} elements, {nv} groups of {vec}; grid {'capped at ' + str(waves) + ' wave(s)' if waves else 'covers every group'}\n"
                f"[[launch]]\nkernel = \"{_kernel_name(plan)}\"\ngrid = [{blocks}]\nblock = [{block}]\n"
                f"args = [{', '.join(args)}]\n")
        intent = (f"{plan.fn}: {vec}-wide x{unroll} per thread, block {block}, "
                  + (f"grid-stride over {waves} wave(s)" if waves else "one pass") + (", tanh via exp" if fast else ""))
        return Rendered(source, spec, {**params, "unroll": unroll}, intent)  # the unroll rendered (capped)


TEMPLATES: list[Template] = [ElementwiseTemplate()]
