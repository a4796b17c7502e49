"""Chain card templates: one kernel for a chain of memory-bound ATen calls (`kforge::chain`).

A chain card's signature holds its member graph (engine.capture.chains.chain_signature). `ChainGraph`
runs that graph once on meta tensors, so every value's dtype, shape, strides and (for views of an input)
storage offset are known exactly; views are then only addressing, and the heavy members are what a
kernel computes. Each member becomes fp32 device code rounded to its result dtype where eager rounds
(a bf16 `mul` rounds, a `_to_copy` to bf16 rounds, an upcast is exact), with the graph's own constants
(eps, the `1 + w`, exponents) baked in, so a kernel computes what the graph says, member by member.

Templates, first match wins:
  chain_rms_norm        a row reduction `mean(x.pow(2), -1, keepdim=True)` feeding `rsqrt(. + eps)` (or
                        `pow(., -0.5)`), with any pointwise prologue (a residual add, the upcast) and epilogue
                        (the weight as `x * w` or Gemma's `x * (1 + w)`, the downcasts); one row per warp(s).
  chain_group_norm_silu `native_group_norm` then `silu`: the group_norm template's kernels with SiLU applied
                        to the rounded normalised value before the store.
  chain_clone_group_norm `clone` to contiguous, `native_group_norm` (and `silu`) on a channels-last input
                        (F.group_norm on a channels-last CUDA tensor): the group_norm_cl kernels, no copy.
  chain_glu             `act(gate) * up`, act silu (SwiGLU) or gelu, exact or tanh (GeGLU).
  chain_modulate        AdaLN `x * (1 + scale) + shift`, scale and shift broadcast over the sequence.
  chain_pointwise       any other chain of the pointwise members below, broadcasting through views.
"""

from __future__ import annotations

import math
import random
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.builtin import cuda_common as cc
from engine.propose.builtin.template import H200, Rendered, Template, intent_params

CHAIN_OP = "kforge::chain"  # engine.capture.chains.CHAIN_OP (not imported: that pulls in the tracer)

Ref = tuple  # ("in", i) or ("node", j, k)

# Pointwise members a kernel computes (ATen overload -> how), each in fp32 then rounded to its result dtype.
POINTWISE = frozenset({
    "aten::_to_copy", "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor",
    "aten::rsqrt", "aten::pow.Tensor_Scalar", "aten::silu", "aten::gelu", "aten::sigmoid", "aten::tanh",
    "aten::neg", "aten::exp",
})
REDUCTIONS = frozenset({"aten::mean.dim"})
MAX_ROW = 16384  # longest row the register-resident row kernel takes


# ------------------------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Value:
    """One value of the chain, as eager makes it."""

    ref: Ref
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int                 # storage offset, in elements, from its input's first element (views)
    source: int | None          # the input this value is a view of (or is), else None
    node: int | None            # the heavy member that computes it, else None (an input or a view)


class ChainGraph:
    """A chain card's member graph with every value's dtype, shape and strides (Decline if unreadable)."""

    def __init__(self, card: OperatorCard):
        import torch

        from engine.capture.signature import decode_value, dtype_name
        from engine.ops import call_op, resolve_op

        if card.op != CHAIN_OP or "chain" not in card.signature:
            raise cc.Decline(f"op {card.op} is not a chain")
        self.card = card
        self.inputs = list(card.signature["args"])
        self.nodes = list(card.signature["chain"]["nodes"])
        self.outputs: list[Ref] = [("node", int(j), int(k)) for j, k in card.signature["chain"]["outputs"]]
        self.vals: dict[Ref, Value] = {}
        self.heavy: list[int] = []
        meta: dict[Ref, Any] = {}
        for i, a in enumerate(self.inputs):
            if a.get("kind") != "tensor" or a.get("absent"):
                raise cc.Decline(f"in{i} is not a tensor")
            why = cc.check_tensor(a, f"in{i}")
            if why:
                raise cc.Decline(why)
            t = torch.empty_strided(a["shape"], a["stride"], dtype=getattr(torch, a["dtype"]), device="meta")
            meta[("in", i)] = t
            self.vals[("in", i)] = Value(("in", i), a["dtype"], tuple(a["shape"]), tuple(a["stride"]), 0, i, None)
        for j, n in enumerate(self.nodes):
            op = resolve_op(n["op"])
            bound, source = [], None
            for a in n["args"]:
                if "tensor" in a:
                    r = tuple(a["tensor"])
                    bound.append((a["name"], meta[r]))
                    source = self.vals[r].source if source is None else source
                elif "tensors" in a:
                    raise cc.Decline(f"{n['op']} takes a tensor list")
                elif a["name"] == "device":
                    bound.append((a["name"], None))  # the captured device; meta tensors stay meta
                else:
                    bound.append((a["name"], decode_value(a["value"])))
            view = n["op"] in ("aten::_unsafe_view", "aten::_reshape_alias") or any(
                r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)
            if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                raise cc.Decline(f"{n['op']} writes in place")
            out = call_op(op, bound)
            results = list(out) if isinstance(out, (list, tuple)) else [out]
            if len(results) != n["results"]:
                raise cc.Decline(f"{n['op']} made {len(results)} results, the chain says {n['results']}")
            if view:
                srcs = [tuple(a["tensor"]) for a in n["args"] if "tensor" in a]
                if self.vals[srcs[0]].source is None:
                    raise cc.Decline(f"member {j} ({n['op']}) is a view of a computed value")
            else:
                self.heavy.append(j)
            for k, t in enumerate(results):
                if not isinstance(t, torch.Tensor):
                    raise cc.Decline(f"{n['op']} returns a non-tensor")
                r = ("node", j, k)
                meta[r] = t
                self.vals[r] = Value(r, dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()),
                                     int(t.storage_offset()) if view else 0, source if view else None,
                                     None if view else j)
        for r in self.outputs:
            if self.vals[r].node is None:
                raise cc.Decline("an output is a view of an input")

    # -- access

    def ops(self) -> list[str]:
        """The heavy members' ops, in order (views left out)."""
        return [self.nodes[j]["op"] for j in self.heavy]

    def args(self, j: int) -> dict[str, Any]:
        """Member j's arguments by name: a Ref for a tensor, else the decoded value."""
        from engine.capture.signature import decode_value

        out: dict[str, Any] = {}
        for a in self.nodes[j]["args"]:
            out[a["name"]] = tuple(a["tensor"]) if "tensor" in a else decode_value(a.get("value"))
        return out

    def tensor_args(self, j: int) -> list[Ref]:
        return [tuple(a["tensor"]) for a in self.nodes[j]["args"] if "tensor" in a]

    def producer(self, r: Ref) -> int | None:
        """The heavy member whose result `r` is (None for an input or a view)."""
        return self.vals[r].node

    def readers(self, j: int) -> list[int]:
        """Heavy members that read member j's results."""
        return [i for i in self.heavy if any(self.producer(r) == j for r in self.tensor_args(i))]

    def depends(self, j: int, on: int) -> bool:
        """Whether member j's result depends on member `on`'s."""
        if j == on:
            return True
        return any(p is not None and self.depends(p, on) for p in (self.producer(r) for r in self.tensor_args(j)))


_GRAPHS: OrderedDict[int, tuple[OperatorCard, ChainGraph]] = OrderedDict()
_GRAPHS_LOCK = threading.Lock()
_GRAPHS_KEPT = 64


def chain_graph(card: OperatorCard) -> ChainGraph:
    """`ChainGraph(card)`, kept for the last 64 cards by identity: a template's space, default, mutations and
    render each read the graph of the same card object, and building one runs every member on meta tensors
    (a search's thousand renders of chain cards spent most of their time there). A card is immutable; the
    entry holds it, so its id is not reused while kept. A Decline is raised again each time, not kept."""
    with _GRAPHS_LOCK:
        hit = _GRAPHS.get(id(card))
        if hit is not None and hit[0] is card:
            _GRAPHS.move_to_end(id(card))
            return hit[1]
    g = ChainGraph(card)
    with _GRAPHS_LOCK:
        _GRAPHS[id(card)] = (card, g)
        while len(_GRAPHS) > _GRAPHS_KEPT:
            _GRAPHS.popitem(last=False)
    return g


# ------------------------------------------------------------------------------------- device code


def _lit(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise cc.Decline(f"constant {v!r} is not a number")
    if not math.isfinite(float(v)):
        raise cc.Decline(f"constant {v!r} is not finite")
    return cc.float_literal(v)


def _check_pointwise(g: ChainGraph, j: int) -> None:
    """Decline a member the pointwise code does not compute exactly as eager does."""
    n, a = g.nodes[j], g.args(j)
    op = n["op"]
    if op not in POINTWISE:
        raise cc.Decline(f"member {j} ({op}) is not a pointwise member a chain kernel computes")
    out = g.vals[("node", j, 0)]
    if out.dtype not in cc.SUPPORTED:
        raise cc.Decline(f"member {j} ({op}) makes {out.dtype}")
    for r in g.tensor_args(j):
        if g.vals[r].dtype not in cc.SUPPORTED:
            raise cc.Decline(f"member {j} ({op}) reads {g.vals[r].dtype}")
    if op == "aten::_to_copy":
        if a.get("memory_format") not in (None,) and str(a.get("memory_format")) != "torch.preserve_format":
            raise cc.Decline(f"member {j}: _to_copy to memory format {a['memory_format']}")
        if a.get("non_blocking") not in (None, False):
            raise cc.Decline(f"member {j}: non-blocking _to_copy")
    if op in ("aten::add.Tensor", "aten::sub.Tensor"):
        _lit(a.get("alpha", 1))
    if op == "aten::gelu" and a.get("approximate", "none") not in ("none", "tanh"):
        raise cc.Decline(f"member {j}: gelu approximate={a.get('approximate')!r}")
    if op == "aten::pow.Tensor_Scalar":
        _lit(a["exponent"])
    for name in ("other", "self"):
        if name in a and not isinstance(a[name], tuple):
            _lit(a[name])


def _pow_code(x: str, e: float) -> str:
    # eager's pow_tensor_scalar special-cases these exponents (a square, a reciprocal square root, ...)
    special = {2.0: f"({x}) * ({x})", 3.0: f"({x}) * ({x}) * ({x})", 0.5: f"sqrtf({x})", -0.5: f"rsqrtf({x})",
               -1.0: f"1.f / ({x})", -2.0: f"1.f / (({x}) * ({x}))", 1.0: f"({x})"}
    return special.get(float(e), f"powf({x}, {_lit(e)})")


def _node_code(g: ChainGraph, j: int, operand: Any) -> str:
    """The fp32 C expression member j computes, its operands from `operand(ref or constant)`."""
    op, a = g.nodes[j]["op"], g.args(j)

    def x(name: str) -> str:
        v = a[name]
        return operand(v) if isinstance(v, tuple) else _lit(v)

    if op == "aten::_to_copy":
        body = x("self")
    elif op in ("aten::add.Tensor", "aten::sub.Tensor"):
        alpha = a.get("alpha", 1)
        other = x("other") if float(alpha) == 1.0 else f"{_lit(alpha)} * {x('other')}"
        body = f"{x('self')} {'+' if op == 'aten::add.Tensor' else '-'} {other}"
    elif op == "aten::mul.Tensor":
        body = f"{x('self')} * {x('other')}"
    elif op == "aten::div.Tensor":
        body = f"{x('self')} / {x('other')}"
    elif op == "aten::rsqrt":
        body = f"rsqrtf({x('self')})"
    elif op == "aten::pow.Tensor_Scalar":
        body = _pow_code(x("self"), a["exponent"])
    elif op == "aten::silu":
        body = f"kf_silu({x('self')})"
    elif op == "aten::gelu":
        body = f"kf_gelu_{a.get('approximate', 'none')}({x('self')})"
    elif op == "aten::sigmoid":
        body = f"1.f / (1.f + expf(-{x('self')}))"
    elif op == "aten::tanh":
        body = f"tanhf({x('self')})"
    elif op == "aten::neg":
        body = f"-{x('self')}"
    elif op == "aten::exp":
        body = f"expf({x('self')})"
    else:  # pragma: no cover - _check_pointwise declines first
        raise cc.Decline(f"{op} has no code")
    dt = g.vals[("node", j, 0)].dtype
    return f"({body})" if dt == "float32" else f"kf_round<{cc.ctype(dt)}>({body})"


MATH = r"""
// Eager's opmath formulas (fp32): silu x / (1 + e^-x), gelu 0.5 x (1 + erf(x / sqrt 2)) or its tanh form.
__device__ __forceinline__ float kf_silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float kf_gelu_none(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float kf_gelu_tanh(float x) {
  const float k = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(k));
}
"""


# `math = "fast"` for pointwise chains: the same formulas through the hardware exponential and an approximate
# division (tanh(u) = 1 - 2 / (e^2u + 1)), as the GroupNorm -> SiLU chain's: fewer
# instructions where a bf16 GLU's activation, not memory, can set the time. Verification decides per card.
MATH_FAST = r"""
__device__ __forceinline__ float kf_silu_fast(float x) { return __fdividef(x, 1.f + __expf(-x)); }
__device__ __forceinline__ float kf_gelu_tanh_fast(float x) {
  const float k = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (2.f - __fdividef(2.f, __expf(2.f * k) + 1.f));
}
"""
_FAST_CALLS = (("kf_silu(", "kf_silu_fast("), ("kf_gelu_tanh(", "kf_gelu_tanh_fast("))


def _bstrides(v: Value, shape: Sequence[int]) -> list[int]:
    """`v`'s strides broadcast to `shape` (right-aligned; a size-1 or missing dim walks with stride 0)."""
    pad = len(shape) - len(v.shape)
    if pad < 0:
        raise cc.Decline(f"{v.ref} has more dims than the iteration shape {list(shape)}")
    out = []
    for d, n in enumerate(shape):
        if d < pad:
            out.append(0)
            continue
        m, s = v.shape[d - pad], v.stride[d - pad]
        if m == n:
            out.append(int(s) if n > 1 else 0)
        elif m == 1:
            out.append(0)
        else:
            raise cc.Decline(f"{v.ref} of shape {list(v.shape)} does not broadcast to {list(shape)}")
    return out


def _load_code(var: str, ptr: str, v: Value, shape: Sequence[int], index: str, vec: int, align: int) -> str:
    """C lines filling `float var[vec]` with the values of input view `v` at flat indices index + 0..vec-1
    of `shape` (vec divides shape[-1]; index is a multiple of vec)."""
    st = _bstrides(v, shape)
    total = math.prod(shape)
    it = cc.int_type(max(total, 1) * 2)
    off = f"{v.offset} + " if v.offset else ""
    e = cc.ctype(v.dtype)
    if st and st[-1] == 0:
        return (f"float {var}[{vec}]; {{ const float s_ = kf_to_float({ptr}[{off}{cc.offset_code(index, shape, st, it)}]);"
                f" for (int j = 0; j < {vec}; ++j) {var}[j] = s_; }}")
    ok = (st and st[-1] == 1 and v.offset % vec == 0 and all(s % vec == 0 for s in st[:-1])
          and align >= min(16, vec * cc.itemsize(v.dtype)))
    if vec > 1 and ok:
        return f"float {var}[{vec}]; kf_load<{e}, {vec}, 0>({ptr} + {off}{cc.offset_code(index, shape, st, it)}, {var});"
    return (f"float {var}[{vec}]; for (int j = 0; j < {vec}; ++j) "
            f"{var}[j] = kf_to_float({ptr}[{off}{cc.offset_code(f'({index}) + j', shape, st, it)}]);")


def _input_ptrs(g: ChainGraph) -> list[str]:
    return [f"const {cc.ctype(a['dtype'])}* __restrict__ in{i}" for i, a in enumerate(g.inputs)]


def _output_ptrs(g: ChainGraph) -> list[str]:
    return [f"{cc.ctype(g.vals[r].dtype)}* __restrict__ out{k}" for k, r in enumerate(g.outputs)]


def _spec_args(g: ChainGraph) -> list[tuple[str, str]]:
    return [("ptr", f"in{i}") for i in range(len(g.inputs))] + [("ptr", f"out{k}") for k in range(len(g.outputs))]


def _check_outputs(g: ChainGraph, shape: Sequence[int]) -> None:
    """Every output is a dense tensor of `shape` (contiguous, or eager's permutation of it) with the dtype
    eager gives it."""
    card = g.card
    if len(card.outputs) != len(g.outputs):
        raise cc.Decline(f"the card lists {len(card.outputs)} outputs, the chain {len(g.outputs)}")
    for k, r in enumerate(g.outputs):
        v, d = g.vals[r], card.outputs[k]
        if list(v.shape) != list(shape):
            raise cc.Decline(f"output {k} has shape {list(v.shape)}, not the iteration shape {list(shape)}")
        why = cc.output_problem(card, k, v.dtype, shape, dense=True)
        if why:
            raise cc.Decline(why)
        if [int(s) for s in d["shape"]] != list(v.shape):
            raise cc.Decline(f"output {k} shape {d['shape']} differs from the graph's {list(v.shape)}")


def _out_align(g: ChainGraph, k: int) -> int:
    return int(g.card.outputs[k].get("align", 16))


def _store_code(g: ChainGraph, k: int, val: str, index: str, vec: int) -> str:
    """C lines storing `float val[vec]` at flat indices index + 0..vec-1 of output k's shape, through its
    strides (a permuted dense output: eager's layout for a permuted input)."""
    e = cc.ctype(g.vals[g.outputs[k]].dtype)
    d = g.card.outputs[k]
    shape, stride = [int(n) for n in d["shape"]], [int(s) for s in d["stride"]]
    aligned = _out_align(g, k) >= min(16, vec * cc.itemsize(g.vals[g.outputs[k]].dtype))
    if cc.is_contiguous(shape, stride):
        if vec > 1 and aligned:
            return f"kf_store<{e}, {vec}, 1>(out{k} + ({index}), {val});"
        return f"for (int j = 0; j < {vec}; ++j) out{k}[({index}) + j] = kf_from_float<{e}>({val}[j]);"
    it = cc.int_type(sum((n - 1) * s for n, s in zip(shape, stride)) + 1)
    if vec > 1 and aligned and stride[-1] == 1 and all(s % vec == 0 for n, s in zip(shape[:-1], stride[:-1]) if n > 1):
        return f"kf_store<{e}, {vec}, 1>(out{k} + ({cc.offset_code(index, shape, stride, it)}), {val});"
    return (f"for (int j = 0; j < {vec}; ++j) out{k}[{cc.offset_code(f'({index}) + j', shape, stride, it)}] = "
            f"kf_from_float<{e}>({val}[j]);")


def _dtypes(g: ChainGraph) -> list[str]:
    return sorted({v.dtype for v in g.vals.values() if v.dtype in cc.SUPPORTED})


# ------------------------------------------------------------------------------------- pointwise chains


@dataclass(frozen=True)
class PointwisePlan:
    shape: tuple[int, ...]       # iteration shape: the outputs'
    members: tuple[int, ...]     # heavy members, in order


def pointwise_plan(g: ChainGraph) -> PointwisePlan:
    """The chain as one pointwise loop over its outputs' shape (Decline when it is not one)."""
    if not g.heavy:
        raise cc.Decline("no member computes anything")
    for j in g.heavy:
        _check_pointwise(g, j)
    shape = g.vals[g.outputs[0]].shape
    _check_outputs(g, shape)
    for r, v in g.vals.items():
        if v.source is not None or v.node is not None:
            if any(r2 == r for j in g.heavy for r2 in g.tensor_args(j)) or r in g.outputs:
                _bstrides(v, shape)  # declines a value that does not broadcast to the outputs
    if math.prod(shape) == 0:
        raise cc.Decline("empty output")
    if math.prod(shape) > cc.MAX_I32:
        raise cc.Decline("2**31 or more elements")
    return PointwisePlan(tuple(shape), tuple(g.heavy))


_PW_KERNEL = r"""
constexpr long long NUMEL = $NUMEL;
constexpr int V = $V;
extern "C" __global__ void __launch_bounds__($BLOCK) $KERNEL($PARAMS) {
  const long long step = (long long)gridDim.x * $BLOCK * V;
  for (long long base = ((long long)blockIdx.x * $BLOCK + threadIdx.x) * V; base < NUMEL; base += step) {
$LOADS
    float $OUTS;
#pragma unroll
    for (int j = 0; j < V; ++j) {
$BODY
    }
$STORES
  }
}
"""


class _PointwiseChainTemplate(Template):
    """A pointwise chain as one grid-stride loop, V consecutive output elements per thread."""

    name = "chain_pointwise"
    ops = frozenset({CHAIN_OP})

    def shape_problem(self, g: ChainGraph) -> str | None:
        """Why this template's structure is not the chain's (None: it is)."""
        return None

    def analyse(self, card: OperatorCard) -> tuple[ChainGraph, PointwisePlan]:
        g = chain_graph(card)
        why = self.shape_problem(g)
        if why:
            raise cc.Decline(why)
        return g, pointwise_plan(g)

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(self.analyse, card)

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        g, plan = self.analyse(card)
        narrowest = min((g.vals[r] for r in g.outputs), key=lambda v: cc.itemsize(v.dtype))
        isz = cc.itemsize(narrowest.dtype)
        vecs = [v for v in (16 // isz, 8 // isz, 4 // isz, 2 // isz, 1) if v >= 1 and plan.shape[-1] % v == 0]
        vecs = list(dict.fromkeys(vecs))
        space: dict[str, list[Any]] = {"vec": vecs, "block": [256, 128, 512], "waves": [0, 4, 8]}
        if self._has_fast_form(g, plan):  # fast first where the (narrowest) output is half precision
            space["math"] = cc.math_choices(narrowest.dtype)
        return space

    @staticmethod
    def _has_fast_form(g: ChainGraph, plan: PointwisePlan) -> bool:
        """Whether a member's formula has a fast form (SiLU, tanh-GELU)."""
        return any(g.nodes[j]["op"] == "aten::silu" or (g.nodes[j]["op"] == "aten::gelu"
                                                        and g.args(j).get("approximate") == "tanh")
                   for j in plan.members)

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        g, plan = self.analyse(card)
        v, block, waves = int(params["vec"]), int(params["block"]), int(params["waves"])
        fn = params.get("math", "precise")  # a candidate from before the parameter existed: eager's formulas
        if fn not in ("fast", "precise"):
            raise ValueError(f"math={fn!r} is not fast or precise")
        fast = fn == "fast" and self._has_fast_form(g, plan)
        numel = math.prod(plan.shape)
        loads, names = [], {}
        for j in plan.members:
            for r in g.tensor_args(j):
                val = g.vals[r]
                if val.source is not None and r not in names:
                    names[r] = f"a{len(names)}"
                    align = int(g.inputs[val.source].get("align", 16))
                    loads.append("    " + _load_code(names[r], f"in{val.source}", val, plan.shape, "base", v, align))

        def operand(r: Ref) -> str:
            return f"{names[r]}[j]" if r in names else f"v{g.producer(r)}"

        body = [f"      const float v{j} = {_node_code(g, j, operand)};" for j in plan.members]
        if fast:
            for old, new in _FAST_CALLS:
                body = [line.replace(old, new) for line in body]
        body += [f"      o{k}[j] = v{g.producer(r)};" for k, r in enumerate(g.outputs)]
        stores = ["    " + _store_code(g, k, f"o{k}", "base", v) for k in range(len(g.outputs))]
        full = -(-numel // (block * v))
        grid = full if waves == 0 else max(1, min(full, hw.sms * waves * max(1, 2048 // block) // 8))
        kernel = f"{self.name}_k"
        src = cc.substitute(_PW_KERNEL, NUMEL=numel, V=v, BLOCK=block, KERNEL=kernel,
                            PARAMS=", ".join(_input_ptrs(g) + _output_ptrs(g)), LOADS="\n".join(loads),
                            OUTS=", ".join(f"o{k}[V]" for k in range(len(g.outputs))), BODY="\n".join(body),
                            STORES="\n".join(stores))
        source = (f"// {CHAIN_OP} {self.name}: {', '.join(g.ops())}\n"
                  + cc.prelude(_dtypes(g), round_=True, hinted=True) + MATH + (MATH_FAST if fast else "") + src)
        spec = "\n".join([
            f"# {self.name}: {numel} elements, {v} per thread, block {block}, {grid} blocks",
            "[[launch]]", f'kernel = "{kernel}"', f"grid = [{grid}]", f"block = [{block}]",
            "args = " + cc.spec_args(_spec_args(g)), ""])
        intent = (f"{self.name}: {' -> '.join(o.split('::')[1] for o in g.ops())} fused over {list(plan.shape)}, "
                  f"vec {v}, block {block}, " + ("one vector per thread" if waves == 0 else f"{grid} blocks looping")
                  + (", fast math" if fast else ""))
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


class GluChainTemplate(_PointwiseChainTemplate):
    """SwiGLU `silu(gate) * up` and GeGLU `gelu(gate[, tanh]) * up`."""

    name = "chain_glu"

    def shape_problem(self, g: ChainGraph) -> str | None:
        ops = g.ops()
        if len(ops) != 2 or ops[0] not in ("aten::silu", "aten::gelu") or ops[1] != "aten::mul.Tensor":
            return f"members {[o.split('::')[1] for o in ops]} are not act(gate) * up"
        act, mul = g.heavy
        srcs = g.tensor_args(mul)
        if len(srcs) != 2 or sum(g.producer(r) == act for r in srcs) != 1:
            return "the product does not multiply the activation by another input"
        if any(g.vals[r].source is None for r in srcs if g.producer(r) != act):
            return "up is not an input"
        if g.vals[g.tensor_args(act)[0]].source is None:
            return "gate is not an input"
        return None


class ModulateChainTemplate(_PointwiseChainTemplate):
    """AdaLN modulation `x * (1 + scale) + shift` (scale and shift broadcast over the sequence dim)."""

    name = "chain_modulate"

    def shape_problem(self, g: ChainGraph) -> str | None:
        ops = g.ops()
        if ops != ["aten::add.Tensor", "aten::mul.Tensor", "aten::add.Tensor"]:
            return f"members {[o.split('::')[1] for o in ops]} are not x * (1 + scale) + shift"
        one, mul, add = g.heavy
        a1, am, aa = g.args(one), g.args(mul), g.args(add)
        if not (isinstance(a1["self"], tuple) and a1.get("other") == 1 and a1.get("alpha", 1) == 1):
            return "the first add is not 1 + scale"
        if g.producer(am["other"]) != one and g.producer(am["self"]) != one:
            return "the product is not x * (1 + scale)"
        if g.producer(aa["self"]) != mul or not isinstance(aa["other"], tuple) or aa.get("alpha", 1) != 1:
            return "the last add is not (x * (1 + scale)) + shift"
        return None


# -------------------------------------------------------------------------------------------- RMSNorm


@dataclass(frozen=True)
class RowPlan:
    shape: tuple[int, ...]      # the reduced tensor's shape; rows are its last dim
    rows: int
    ncol: int
    mean: int                   # the reducing member
    prologue: tuple[int, ...]   # members before the reduction (the mean's input among them)
    epilogue: tuple[int, ...]   # members that read the reduction
    keep: tuple[int, ...]       # prologue members the epilogue reads (held in registers)
    variant: str                # 'x * w', 'x * (1 + w)', 'no weight', with 'add + ' for a residual add


def row_plan(g: ChainGraph) -> RowPlan:
    """The chain as RMSNorm: a prologue, `mean(x^2)` over the last dim, `rsqrt(. + eps)`, an epilogue."""
    means = [j for j in g.heavy if g.nodes[j]["op"] in REDUCTIONS]
    if len(means) != 1:
        raise cc.Decline(f"{len(means)} mean reductions, expected one")
    (m,) = means
    a = g.args(m)
    src = g.vals[a["self"]]
    nd = len(src.shape)
    if list(a.get("dim") or []) not in ([-1], [nd - 1]) or a.get("keepdim") is not True or a.get("dtype") is not None:
        raise cc.Decline(f"mean over dim={a.get('dim')} keepdim={a.get('keepdim')}, not the last dim kept")
    sq = g.producer(a["self"])
    if sq is None or g.nodes[sq]["op"] != "aten::pow.Tensor_Scalar" or float(g.args(sq)["exponent"]) != 2.0:
        raise cc.Decline("the mean is not of a square (x.pow(2))")
    readers = g.readers(m)
    if len(readers) != 1 or g.nodes[readers[0]]["op"] != "aten::add.Tensor" or g.args(readers[0]).get("other") is None \
            or isinstance(g.args(readers[0])["other"], tuple):
        raise cc.Decline("the mean square is not followed by + eps")
    (eps_add,) = readers
    r2 = g.readers(eps_add)
    is_rsqrt = len(r2) == 1 and (g.nodes[r2[0]]["op"] == "aten::rsqrt" or (
        g.nodes[r2[0]]["op"] == "aten::pow.Tensor_Scalar" and float(g.args(r2[0])["exponent"]) == -0.5))
    if not is_rsqrt:
        raise cc.Decline("mean(x^2) + eps is not followed by rsqrt (or pow -0.5)")
    for j in g.heavy:
        if j != m:
            _check_pointwise(g, j)
    if src.dtype not in cc.SUPPORTED:
        raise cc.Decline(f"the reduced tensor is {src.dtype}")
    shape = src.shape
    ncol, rows = int(shape[-1]), math.prod(shape[:-1])
    if ncol == 0 or rows == 0:
        raise cc.Decline("empty rows")
    if ncol > MAX_ROW:
        raise cc.Decline(f"rows of {ncol} elements (the register-resident kernel takes up to {MAX_ROW})")
    if rows * ncol > cc.MAX_I32:
        raise cc.Decline("2**31 or more elements")
    epi = tuple(j for j in g.heavy if j != m and g.depends(j, m))
    pro = tuple(j for j in g.heavy if j != m and j not in epi)
    for j in (*pro, *epi):
        for r in g.tensor_args(j):
            _bstrides(g.vals[r], shape)
    keep = tuple(j for j in pro if any(g.producer(r) == j for e in epi for r in g.tensor_args(e)))
    _check_outputs(g, shape)
    adds = [j for j in g.heavy if g.nodes[j]["op"] == "aten::add.Tensor"]
    one_plus = any(g.args(j).get("other") == 1 for j in adds)
    muls = [j for j in epi if g.nodes[j]["op"] == "aten::mul.Tensor"]
    variant = "x * (1 + w)" if one_plus else ("x * w" if len(muls) >= 2 else "no weight")
    if any(j in pro and all(isinstance(g.args(j).get(k), tuple) for k in ("self", "other")) for j in adds):
        variant = "add + " + variant
    return RowPlan(tuple(shape), rows, ncol, m, pro, epi, keep, variant)


_ROW_KERNEL = r"""
constexpr int NCOL = $NCOL;
constexpr long long M = $M;
constexpr int V = $V, TPR = $TPR, RPB = $RPB, K = $K;
constexpr int NWR = TPR / 32;
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
extern "C" __global__ void __launch_bounds__(TPR * RPB) $KERNEL($PARAMS) {
  __shared__ float red[RPB * NWR];
  const int t = threadIdx.x % TPR;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / TPR;
  const bool ok = row < M;            // no early return: the row's warps meet at the barrier
  const long long r0 = ok ? row : 0;
$KEEP
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * TPR + t) * V;
    if (ok && c < NCOL) {
      const long long base = r0 * NCOL + c;
$PRO_LOADS
$PRO_OUTS
#pragma unroll
      for (int j = 0; j < V; ++j) {
$PRO_BODY
      }
$PRO_STORES
    }
  }
  s = row_sum(s, red);
  const float mean_sq = $MEAN;
  if (!ok) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * TPR + t) * V;
    if (c < NCOL) {
      const long long base = row * NCOL + c;
$EPI_LOADS
$EPI_OUTS
#pragma unroll
      for (int j = 0; j < V; ++j) {
$EPI_BODY
      }
$EPI_STORES
    }
  }
}
"""


class RmsNormChainTemplate(Template):
    """RMSNorm chains (with upcast, weight `x * w` or `x * (1 + w)`, an optional residual add): rows held in
    registers, fp32 sum of squares, every member rounded where eager rounds."""

    name = "chain_rms_norm"
    ops = frozenset({CHAIN_OP})

    def analyse(self, card: OperatorCard) -> tuple[ChainGraph, RowPlan]:
        g = chain_graph(card)
        return g, row_plan(g)

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(self.analyse, card)

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        g, plan = self.analyse(card)
        isz = min(cc.itemsize(g.vals[r].dtype) for r in g.outputs)
        vecs = list(dict.fromkeys(v for v in (16 // isz, 8 // isz, 4 // isz, 1) if plan.ncol % v == 0))
        nv = plan.ncol // vecs[0]
        per_thread = -(-nv // 4)
        tpr = min(1024, max(32, -(-per_thread // 32) * 32))
        rpb = 1 << (max(1, 256 // tpr).bit_length() - 1)
        return {"block": cc.ordered(tpr * rpb, [256, 128, 512, 1024]), "rows_per_block": cc.ordered(rpb, [1, 2, 4, 8]),
                "vec": vecs}

    @staticmethod
    def geometry(plan: RowPlan, params: Mapping[str, Any]) -> dict[str, int]:
        v, block, rpb = int(params["vec"]), int(params["block"]), int(params["rows_per_block"])
        nv = plan.ncol // v
        tpr = max(32, (block // rpb) // 32 * 32)
        tpr = min(tpr, max(32, -(-nv // 32) * 32), 1024)
        rpb = max(1, min(rpb, 1024 // tpr))
        return {"tpr": tpr, "rpb": rpb, "k": -(-nv // tpr)}

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        g, plan = self.analyse(card)
        geo = self.geometry(plan, params)
        v = int(params["vec"])
        out_of = {g.producer(r): k for k, r in enumerate(g.outputs)}

        def loads(members: Sequence[int], prefix: str) -> tuple[list[str], dict[Ref, str]]:
            lines, names = [], {}
            for j in members:
                for r in g.tensor_args(j):
                    val = g.vals[r]
                    if val.source is not None and r not in names:
                        names[r] = f"{prefix}{len(names)}"
                        align = int(g.inputs[val.source].get("align", 16))
                        lines.append("      " + _load_code(names[r], f"in{val.source}", val, plan.shape, "base", v,
                                                           align))
            return lines, names

        pro_loads, pro_names = loads(plan.prologue, "p")
        epi_loads, epi_names = loads(plan.epilogue, "e")

        def pro_operand(r: Ref) -> str:
            return f"{pro_names[r]}[j]" if r in pro_names else f"v{g.producer(r)}"

        def epi_operand(r: Ref) -> str:
            if r in epi_names:
                return f"{epi_names[r]}[j]"
            p = g.producer(r)
            if p == plan.mean:
                return "mean_sq"
            return f"keep{p}[k][j]" if p in plan.keep else f"v{p}"

        sq_in = g.args(plan.mean)["self"]
        pro_body = [f"        const float v{j} = {_node_code(g, j, pro_operand)};" for j in plan.prologue]
        pro_body += [f"        keep{j}[k][j] = v{j};" for j in plan.keep]
        pro_body.append(f"        s += v{g.producer(sq_in)};")
        pro_outs = [j for j in plan.prologue if j in out_of]
        pro_body += [f"        o{out_of[j]}[j] = v{j};" for j in pro_outs]
        epi_body = [f"        const float v{j} = {_node_code(g, j, epi_operand)};" for j in plan.epilogue]
        epi_outs = [j for j in plan.epilogue if j in out_of]
        epi_body += [f"        o{out_of[j]}[j] = v{j};" for j in epi_outs]
        mdt = g.vals[("node", plan.mean, 0)].dtype
        mean = "s / (float)NCOL" if mdt == "float32" else f"kf_round<{cc.ctype(mdt)}>(s / (float)NCOL)"
        kernel = "chain_rms_norm_k"

        def decl(js: Sequence[int]) -> str:
            return ("      float " + ", ".join(f"o{out_of[j]}[V]" for j in js) + ";") if js else ""

        src = cc.substitute(
            _ROW_KERNEL, NCOL=plan.ncol, M=plan.rows, V=v, TPR=geo["tpr"], RPB=geo["rpb"], K=geo["k"], KERNEL=kernel,
            PARAMS=", ".join(_input_ptrs(g) + _output_ptrs(g)),
            KEEP="\n".join(f"  float keep{j}[K][V];" for j in plan.keep),
            PRO_LOADS="\n".join(pro_loads), PRO_OUTS=decl(pro_outs), PRO_BODY="\n".join(pro_body),
            PRO_STORES="\n".join("      " + _store_code(g, out_of[j], f"o{out_of[j]}", "base", v) for j in pro_outs),
            MEAN=mean, EPI_LOADS="\n".join(epi_loads), EPI_OUTS=decl(epi_outs), EPI_BODY="\n".join(epi_body),
            EPI_STORES="\n".join("      " + _store_code(g, out_of[j], f"o{out_of[j]}", "base", v) for j in epi_outs))
        source = (f"// {CHAIN_OP} {self.name} ({plan.variant}): {', '.join(g.ops())}\n"
                  + cc.prelude(_dtypes(g), round_=True, hinted=True, reduce=True) + MATH + src)
        grid = -(-plan.rows // geo["rpb"])
        spec = "\n".join([
            f"# {self.name} ({plan.variant}): {geo['tpr']} threads per row, {geo['rpb']} rows per block",
            "[[launch]]", f'kernel = "{kernel}"', f"grid = [{grid}]", f"block = [{geo['tpr'] * geo['rpb']}]",
            "args = " + cc.spec_args(_spec_args(g)), ""])
        intent = (f"{self.name} ({plan.variant}): {plan.rows} rows of {plan.ncol}, {geo['tpr']} threads/row x "
                  f"{geo['rpb']} rows/block, vec {v}, {geo['k']} vectors/thread in registers")
        return Rendered(source=source, spec=spec, params=dict(params), intent=intent)


# ----------------------------------------------------------------------------------- GroupNorm + SiLU


def gn_sub_card(g: ChainGraph, j: int, where: list[int], input_from: Ref | None = None) -> OperatorCard:
    """Member j (a native_group_norm) of the chain as a card of its own, over the chain's inputs: its input,
    weight and bias must each be an input itself (`input_from`: the input a layout-only member before it read,
    e.g. a clone to contiguous); outputs (y, mean, rstd) from the chain's, `where[k]` naming the group_norm
    result the chain's output k is."""
    args = []
    for a in g.nodes[j]["args"]:
        if "tensor" in a:
            r = input_from if a["name"] == "input" and input_from is not None else tuple(a["tensor"])
            v = g.vals[r]
            if v.source is None or v.offset or tuple(g.inputs[v.source]["shape"]) != v.shape:
                raise cc.Decline(f"group_norm {a['name']} is not an input itself")
            args.append({**g.inputs[v.source], "name": a["name"]})
        elif a["name"] in ("weight", "bias"):
            args.append({"name": a["name"], "kind": "tensor", "absent": True})
        else:
            args.append({"name": a["name"], "kind": "value", "value": a.get("value")})
    outs = [None, None, None]
    for k, w in enumerate(where):
        outs[w] = g.card.outputs[k] if k < len(g.card.outputs) else None
    if any(o is None for o in outs):
        raise cc.Decline("the card lists fewer outputs than the chain")
    outs[0] = {**outs[0]}
    return OperatorCard(card_id=g.card.card_id, op="aten::native_group_norm",
                        signature={"op": "aten::native_group_norm", "args": args, "aliases": []},
                        signature_text="native_group_norm", outputs=outs)


def gn_chain_spec(spec: str, g: ChainGraph, j: int, where: list[int], input_from: Ref | None = None,
                  extra: Mapping[str, str] | None = None) -> str:
    """A group_norm kernel's launch spec for the chain: it names input/weight/bias/out0..2 and N, group; a
    chain card names in0.. and its outputs in the chain's order, and has no N, group or eps arguments.
    `extra`: further names of the kernel's card and the chain inputs they are (e.g. input_bias -> in1)."""
    a = g.args(j)
    names = dict(extra or {})
    for argname in ("input", "weight", "bias"):
        ref = input_from if argname == "input" and input_from is not None else a.get(argname)
        if isinstance(ref, tuple):
            names[argname] = f"in{g.vals[ref].source}"
    for k in range(3):
        spec = spec.replace(f'"out{k}"', f'"@res{k}"')
    for k, w in enumerate(where):
        spec = spec.replace(f'"@res{w}"', f'"out{k}"')
    for old, new in names.items():
        spec = spec.replace(f'"{old}"', f'"{new}"')
    spec = spec.replace('{ f32 = "eps" }', f'{{ f32 = "{cc.f32(float(a["eps"]))!r}" }}')
    spec = spec.replace("N * group", str(int(a["N"]) * int(a["group"])))
    if "@res" in spec:
        raise ValueError("an output of the group_norm kernel has no place in the chain")
    return spec


def with_silu(source: str, apply_line: str, dtype: str, fn: str) -> str:
    """A group_norm kernel's source with SiLU applied where `apply_line` computes the normalised value (rounded
    to the output dtype first, as eager stores it before silu reads it); `fn` fast or precise."""
    if source.count(apply_line) != 1:
        raise ValueError("the group_norm kernel's apply step is not where this template expects it")
    if fn not in ("fast", "precise"):
        raise ValueError(f"math={fn!r} is not fast or precise")
    lhs, rhs = apply_line.split(" = ", 1)
    silu = "kf_silu_fast(" if fn == "fast" else "kf_silu("
    apply = f"{{ const float g_ = kf_round<T>({rhs.rstrip(';')}); {lhs.strip()} = {silu}g_); }}"
    extra = ("" if "kf_round" in source else _ROUND) + ("" if "kf_silu" in source else MATH)
    extra += MATH_FAST if fn == "fast" else ""
    at = source.index(f"\ntypedef {cc.ctype(dtype)} T;")  # the kernel body, after the prelude
    return source[:at] + extra + source[at:].replace(apply_line, apply)


def _flip_math(params: Mapping[str, Any], fn: str, rng: random.Random, intent: str | None) -> dict[str, Any] | None:
    """A SiLU chain's mutation of `math` alone (fast <-> precise; `fn` the current one), taken half the time
    when the intent names it and one time in eight otherwise; None: mutate the kernel's parameters instead."""
    if rng.random() < (0.5 if "math" in intent_params(intent) else 0.125):
        return {**params, "math": "precise" if fn == "fast" else "fast"}
    return None


_ROUND = r"""
template <typename T> __device__ __forceinline__ float kf_round(float x) { return kf_to_float(kf_from_float<T>(x)); }
"""
# The group_norm strategies whose kernels apply through gn_apply_range alone (the cluster kernel applies to its
# stash in a loop of its own).
GN_CHAIN_STRATEGIES = ("stream", "fused", "split")
_GN_APPLY_ASSIGN = "f[u][j] = fmaf(f[u][j], k.x, k.y);"  # where SiLU goes (with_silu checks it is there once)
_GNCL_APPLY = "f[j] = fmaf(f[j], k.x, k.y);"  # group_norm_cl's apply step, where SiLU goes
# `math = "fast"`: SiLU through the hardware exponential and an approximate division (two multi-function-unit
# instructions, no IEEE division's refinement or expf's range reduction). On the VAE's largest tensors the
# precise form's instructions, not memory, set the time of the apply step: the chain took 252 us where the
# same kernel without SiLU took 189 us (H200, 2026-12-03). Either rounds to the same bf16/fp16 value except
# where the fp32 result lies within a few ulp of a rounding boundary; verification decides per card. Its
# kf_silu_fast is MATH_FAST's, shared with the pointwise chains.


class GroupNormSiluChainTemplate(Template):
    """`native_group_norm` then `silu` (a VAE / UNet block): the group_norm template's stream, fused and split
    kernels, SiLU applied to the normalised value rounded as eager stores it; mean and rstd written
    where the chain returns them. On a channels-last input (a twin, engine.capture.twins) the group_norm_cl
    kernels, the same SiLU in their apply step."""

    name = "chain_group_norm_silu"
    ops = frozenset({CHAIN_OP})

    def analyse(self, card: OperatorCard) -> tuple[ChainGraph, OperatorCard, list[int]]:
        """The graph, the native_group_norm card it holds, and which outputs are (y, mean, rstd) of it."""
        g = chain_graph(card)
        ops = g.ops()
        if ops != ["aten::native_group_norm", "aten::silu"] or g.heavy != [0, 1]:
            raise cc.Decline(f"members {[o.split('::')[1] for o in ops]} are not native_group_norm, silu")
        if g.tensor_args(1) != [("node", 0, 0)]:
            raise cc.Decline("silu does not read the normalised tensor")
        y, mean, rstd = (g.vals[("node", 0, k)] for k in range(3))
        if g.vals[("node", 1, 0)].dtype != y.dtype:
            raise cc.Decline("silu changes the dtype")
        if ("node", 0, 0) in g.outputs:
            raise cc.Decline("the un-activated normalised tensor is an output too")
        if ("node", 1, 0) not in g.outputs:
            raise cc.Decline("the activation is not an output")
        order = {("node", 1, 0): 0, ("node", 0, 1): 1, ("node", 0, 2): 2}
        if not set(g.outputs) <= set(order):
            raise cc.Decline("outputs other than silu(y), mean, rstd")
        if set(g.outputs) != set(order):
            raise cc.Decline("mean and rstd are not both outputs (the group_norm kernels write both)")
        sub = gn_sub_card(g, 0, [order[r] for r in g.outputs])
        why = self._inner(sub).accepts(sub)
        if why:
            raise cc.Decline(f"{self._inner(sub).name}: {why}")
        return g, sub, [order[r] for r in g.outputs]

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(self.analyse, card)

    @staticmethod
    def _channels_last(sub: OperatorCard) -> bool:
        from engine.propose.builtin.group_norm_cl import channels_last

        x = sub.signature["args"][0]
        return channels_last(x["shape"], x["stride"]) and not cc.is_contiguous(x["shape"], x["stride"])

    def _inner(self, sub: OperatorCard) -> Template:
        """group_norm's kernels, or group_norm_cl's for a channels-last input (a twin: the input a convolution
        leaves under torch.compile, engine.capture.twins)."""
        if self._channels_last(sub):
            from engine.propose.builtin.group_norm_cl import GroupNormChannelsLastTemplate

            return GroupNormChannelsLastTemplate()
        from engine.propose.builtin.group_norm import GroupNormTemplate

        return GroupNormTemplate()

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        _, sub, _ = self.analyse(card)
        space = dict(self._inner(sub).space(sub, hw=hw))
        if "strategy" in space:
            space["strategy"] = [s for s in space["strategy"] if s in GN_CHAIN_STRATEGIES]
        space["math"] = cc.math_choices(sub.signature["args"][0]["dtype"])
        return space

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        _, sub, _ = self.analyse(card)
        fn = params.get("math", self.space(card, hw=hw)["math"][0])
        flipped = _flip_math(params, fn, rng, intent)
        if flipped is not None:
            return flipped
        inner = self._inner(sub)
        for _ in range(16):
            p = inner.mutate(sub, {k: v for k, v in params.items() if k != "math"}, rng, intent, hw=hw)
            if "strategy" not in p or p.get("strategy") in GN_CHAIN_STRATEGIES:
                return {**p, "math": fn}
        return dict(params)

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        g, sub, where = self.analyse(card)
        cl = self._channels_last(sub)
        if not cl and params.get("strategy") not in GN_CHAIN_STRATEGIES:
            raise ValueError(f"strategy {params.get('strategy')!r} is not one of {', '.join(GN_CHAIN_STRATEGIES)}")
        fn = params.get("math", "precise")  # a candidate from before the parameter existed: eager's formula
        r = self._inner(sub).render(sub, {k: v for k, v in params.items() if k != "math"}, hw=hw)
        source = with_silu(r.source, _GNCL_APPLY if cl else _GN_APPLY_ASSIGN, sub.signature["args"][0]["dtype"], fn)
        source = f"// {CHAIN_OP} {self.name}\n" + source
        spec = gn_chain_spec(r.spec, g, 0, where)
        intent = r.intent.replace("group_norm", "group_norm + silu", 1) + (", fast SiLU" if fn == "fast" else "")
        return Rendered(source=source, spec=spec, params={**r.params, "math": fn}, intent=intent)


class CloneGroupNormChainTemplate(Template):
    """`clone` to contiguous, `native_group_norm` (and `silu`) on a channels-last input: what eager runs for
    F.group_norm on a channels-last CUDA tensor (CUDA GroupNorm takes contiguous input only), in a model run
    channels-last or after a permuted attention output. The group_norm_cl kernels read the input where it is
    and write the contiguous output: no copy, and SiLU applied to the rounded normalised value before the
    store."""

    name = "chain_clone_group_norm"
    ops = frozenset({CHAIN_OP})

    def analyse(self, card: OperatorCard) -> tuple[ChainGraph, OperatorCard, list[int], bool]:
        """The graph, the channels-last native_group_norm card it amounts to, which outputs are (y, mean,
        rstd), and whether SiLU follows."""
        g = chain_graph(card)
        ops = g.ops()
        silu = ops == ["aten::clone", "aten::native_group_norm", "aten::silu"]
        if ops != ["aten::clone", "aten::native_group_norm"] and not silu:
            raise cc.Decline(f"members {[o.split('::')[1] for o in ops]} are not clone, native_group_norm(, silu)")
        c, n = g.heavy[0], g.heavy[1]
        copied = ("node", c, 0)
        (src,) = g.tensor_args(c)
        if not cc.is_contiguous(g.vals[copied].shape, g.vals[copied].stride):
            raise cc.Decline("the clone does not make the input contiguous")
        if g.args(n).get("input") != copied:
            raise cc.Decline("native_group_norm does not read the clone")
        if copied in g.outputs:
            raise cc.Decline("the contiguous copy is an output too")
        y = ("node", n, 0)
        if silu:
            s_ = g.heavy[2]
            if g.tensor_args(s_) != [y] or g.vals[("node", s_, 0)].dtype != g.vals[y].dtype:
                raise cc.Decline("silu does not read the normalised tensor in its dtype")
            if y in g.outputs:
                raise cc.Decline("the un-activated normalised tensor is an output too")
            y = ("node", s_, 0)
        order = {y: 0, ("node", n, 1): 1, ("node", n, 2): 2}
        if set(g.outputs) != set(order):
            raise cc.Decline("outputs are not the normalised tensor, mean and rstd (the kernels write all three)")
        where = [order[r] for r in g.outputs]
        sub = gn_sub_card(g, n, where, input_from=src)
        from engine.propose.builtin.group_norm_cl import GroupNormChannelsLastTemplate

        why = GroupNormChannelsLastTemplate().accepts(sub)
        if why:
            raise cc.Decline(f"group_norm_cl: {why}")
        return g, sub, where, silu

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(self.analyse, card)

    def _inner(self):
        from engine.propose.builtin.group_norm_cl import GroupNormChannelsLastTemplate

        return GroupNormChannelsLastTemplate()

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        _, sub, _, silu = self.analyse(card)
        space = dict(self._inner().space(sub, hw=hw))
        if silu:
            space["math"] = cc.math_choices(sub.signature["args"][0]["dtype"])
        return space

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        _, sub, _, silu = self.analyse(card)
        if silu:
            flipped = _flip_math(params, params.get("math", self.space(card, hw=hw)["math"][0]), rng, intent)
            if flipped is not None:
                return flipped
        kept = {k: v for k, v in params.items() if k != "math"}
        p = self._inner().mutate(sub, kept, rng, intent, hw=hw)
        return {**p, **({"math": params.get("math", "precise")} if silu else {})}

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        g, sub, where, silu = self.analyse(card)
        c, n = g.heavy[0], g.heavy[1]
        (src,) = g.tensor_args(c)
        r = self._inner().render(sub, {k: v for k, v in params.items() if k != "math"}, hw=hw)
        source, intent = r.source, r.intent.replace("group_norm", "clone + group_norm", 1)
        fn = params.get("math", "precise")
        if silu:
            source = with_silu(source, _GNCL_APPLY, sub.signature["args"][0]["dtype"], fn)
            intent = intent.replace("group_norm", "group_norm + silu", 1) + (", fast SiLU" if fn == "fast" else "")
        spec = gn_chain_spec(r.spec, g, n, where, input_from=src)
        out = {**r.params, **({"math": fn} if silu else {})}
        return Rendered(source=f"// {CHAIN_OP} {self.name}\n" + source, spec=spec, params=out, intent=intent)


class ConvBiasGroupNormSiluChainTemplate(Template):
    """A per-channel `add` (x + b, b of shape [1, C, 1, ...]), `native_group_norm` on its result, then `silu`:
    what a convolution's bias, split off by Inductor, and the GroupNorm (+ SiLU) after it compute (the SD3.5
    VAE's resnet blocks: conv1 -> norm2 -> SiLU). The group_norm_cl kernels add b[c] as they load x (its
    `input_bias`), so the sum is never written or read back: under torch.compile that saves the pointwise
    pass Inductor would make to store it. Channels-last inputs only (the layout Inductor holds a
    convolution's output in); a contiguous card is declined, its twin (engine.capture.twins) is not."""

    name = "chain_bias_group_norm_silu"
    ops = frozenset({CHAIN_OP})

    def analyse(self, card: OperatorCard) -> tuple[ChainGraph, OperatorCard, list[int], Ref, int]:
        """The graph, the group_norm_cl card with its input bias, which outputs are (y, mean, rstd), the
        ref of x, and the chain input that holds b."""
        g = chain_graph(card)
        ops = g.ops()
        if ops != ["aten::add.Tensor", "aten::native_group_norm", "aten::silu"]:
            raise cc.Decline(f"members {[o.split('::')[1] for o in ops]} are not add, native_group_norm, silu")
        a_, n_, s_ = g.heavy
        add = g.args(a_)
        if add.get("alpha", 1) != 1:
            raise cc.Decline("the add scales its second operand (alpha)")
        x, b = add.get("self"), add.get("other")
        if not (isinstance(x, tuple) and isinstance(b, tuple)):
            raise cc.Decline("the add does not read two tensors")
        xv, bv, sv = g.vals[x], g.vals[b], g.vals[("node", a_, 0)]
        if xv.source is None or xv.offset or xv.shape != sv.shape:
            raise cc.Decline("the add's first operand is not a full-size chain input")
        c = sv.shape[1] if len(sv.shape) >= 3 else 0
        if (bv.source is None or bv.offset or len(bv.shape) != len(sv.shape)
                or list(bv.shape) != [1, c] + [1] * (len(sv.shape) - 2) or (c > 1 and bv.stride[1] != 1)):
            raise cc.Decline(f"the add's second operand {list(bv.shape)} is not a per-channel bias [1, {c}, 1, ...]")
        src = g.inputs[bv.source]
        if math.prod(src["shape"]) != c or not cc.is_contiguous(src["shape"], src["stride"]):
            raise cc.Decline("the bias is not a dense tensor of C values")
        if len({xv.dtype, bv.dtype, sv.dtype}) != 1:
            raise cc.Decline(f"the add mixes dtypes ({xv.dtype}, {bv.dtype} -> {sv.dtype})")
        if g.args(n_).get("input") != ("node", a_, 0):
            raise cc.Decline("native_group_norm does not read the add's result")
        if ("node", a_, 0) in g.outputs:
            raise cc.Decline("x + b is an output too (the kernels never store it)")
        y = ("node", n_, 0)
        if g.tensor_args(s_) != [y] or g.vals[("node", s_, 0)].dtype != g.vals[y].dtype:
            raise cc.Decline("silu does not read the normalised tensor in its dtype")
        if y in g.outputs:
            raise cc.Decline("the un-activated normalised tensor is an output too")
        order = {("node", s_, 0): 0, ("node", n_, 1): 1, ("node", n_, 2): 2}
        if set(g.outputs) != set(order):
            raise cc.Decline("outputs are not silu(y), mean and rstd (the kernels write all three)")
        where = [order[r] for r in g.outputs]
        sub = gn_sub_card(g, n_, where, input_from=x)
        bias = {**src, "name": "input_bias", "shape": [c], "stride": [1]}
        sub = OperatorCard(card_id=sub.card_id, op=sub.op, signature={**sub.signature,
                           "args": [*sub.signature["args"], bias]}, signature_text=sub.signature_text,
                           outputs=sub.outputs)
        from engine.propose.builtin.group_norm_cl import GroupNormChannelsLastTemplate

        why = GroupNormChannelsLastTemplate().accepts(sub)
        if why:
            raise cc.Decline(f"group_norm_cl: {why}" + (" (input bias folding needs a channels-last input)"
                                                         if why.startswith("input is contiguous") else ""))
        return g, sub, where, x, bv.source

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        return cc.why_declined(self.analyse, card)

    def _inner(self) -> Template:
        from engine.propose.builtin.group_norm_cl import GroupNormChannelsLastTemplate

        return GroupNormChannelsLastTemplate()

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        sub = self.analyse(card)[1]
        space = dict(self._inner().space(sub, hw=hw))
        space["math"] = cc.math_choices(sub.signature["args"][0]["dtype"])
        return space

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        sub = self.analyse(card)[1]
        fn = params.get("math", self.space(card, hw=hw)["math"][0])
        flipped = _flip_math(params, fn, rng, intent)
        if flipped is not None:
            return flipped
        p = self._inner().mutate(sub, {k: v for k, v in params.items() if k != "math"}, rng, intent, hw=hw)
        return {**p, "math": fn}

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        g, sub, where, x, b_in = self.analyse(card)
        fn = params.get("math", "precise")
        r = self._inner().render(sub, {k: v for k, v in params.items() if k != "math"}, hw=hw)
        source = with_silu(r.source, _GNCL_APPLY, sub.signature["args"][0]["dtype"], fn)
        spec = gn_chain_spec(r.spec, g, g.heavy[1], where, input_from=x, extra={"input_bias": f"in{b_in}"})
        intent = (r.intent.replace("group_norm", "bias + group_norm + silu", 1)
                  + (", fast SiLU" if fn == "fast" else ""))
        return Rendered(source=f"// {CHAIN_OP} {self.name}\n" + source, spec=spec,
                        params={**r.params, "math": fn}, intent=intent)


TEMPLATES: list[Template] = [RmsNormChainTemplate(), ConvBiasGroupNormSiluChainTemplate(), GroupNormSiluChainTemplate(),
                             CloneGroupNormChainTemplate(), GluChainTemplate(), ModulateChainTemplate(),
                             _PointwiseChainTemplate()]
