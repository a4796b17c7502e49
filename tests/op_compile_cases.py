"""Single-op variants under torch.compile, the correctness sweep's harness and cases (CPU;
tests/test_op_compile_sweep.py, scripts/op_compile_sweep.py).

A case is a call A of one ATen overload, proven as a cast's variant at the CPU key (its plan is PyTorch's own kernel,
so a correct hit computes what eager does), and a function B compiled with that cast through `compose.compile`, which
differs from A in one detail (a scalar, a keyword, an absent weight, a dtype, a layout, a view, an in-place form, a
dynamic size...) or is A. B's outputs must match eager's within plain torch.compile's noise, and the variant must run
only where `fire` allows it: "no" (B's call is not A's), "yes" (B is A), "ok" (either)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from engine.capture.signature import bind_arguments, signature_of
from engine.cast import compose, runtime
from engine.cast.guard import first_shape, layout_of, signature_key

aten = torch.ops.aten


class OpCast:
    """What compose needs of a cast: a digest, and one variant per proven call at the CPU key (plan: eager's kernel)."""

    def __init__(self, name: str = "sweep"):
        self.digest = f"{name}-{uuid.uuid4().hex}"  # fresh: no earlier run's cache entry matches
        self.plans: list[runtime.Plan] = []

    def prove(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None) -> OpCast:
        lay = layout_of(op)
        sig = signature_of(op, bind_arguments(op, list(args), dict(kwargs or {})))
        name = lay.op_name

        kw_only = [a.kwarg_only for a in op._schema.arguments]

        def run(bound):  # keyword-only arguments (gelu's approximate, addmm's beta) go by name
            args = [v for v, k in zip(bound, kw_only) if not k]
            kwargs = {a.name: v for a, v, k in zip(op._schema.arguments, bound, kw_only) if k}
            return runtime.routes()[(name, "CPU")].original.call_boxed(torch._C._dispatch_keyset_full(), *args,
                                                                       **kwargs)

        plan = runtime.Plan(f"{op}-{len(self.plans)}", run)
        self.plans.append(plan)
        runtime.add_entries(self, [(name, signature_key(lay, sig, 0), plan, first_shape(sig))], "CPU")
        return self

    def remove(self) -> None:
        runtime.remove_owner(self)

    @property
    def hits(self) -> int:
        return sum(p.hits for p in self.plans)


def _r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + len(shape) * 7 + sum(shape))
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


@dataclass(frozen=True)
class Case:
    op: Any                 # the overload proven
    a: Callable[[], tuple]  # () -> (args, kwargs) of the proven call
    b: Callable             # (*inputs) -> outputs, compiled with the cast
    inputs: Callable[[], tuple]  # () -> B's inputs (fresh per run)
    fire: str = "ok"
    dynamic: bool | None = False
    more: tuple = ()        # further input makers, run after the first (automatic dynamic, other sizes)
    mode: str | None = None


X = (2, 8, 4, 4)
GN = aten.native_group_norm.default


def _gn_a(eps=1e-5, weight=True, x=None):
    x = _r(*X) if x is None else x
    return (x, _r(8) if weight else None, _r(8) if weight else None, 2, 8, 16, 4, eps), {}


def _gn_in():
    return (_r(*X), _r(8), _r(8))


CASES: dict[str, Case] = {
    # group norm (decomposed by Inductor, so kept by the veto)
    "gn same": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5), _gn_in, "yes"),
    "gn eps": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w, b, 1e-6), _gn_in, "no"),
    "gn eps -0.0 vs 0.0": Case(GN, lambda: _gn_a(eps=0.0), lambda x, w, b: F.group_norm(x, 4, w, b, -0.0), _gn_in,
                               "no"),
    "gn no weight": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, None, None, 1e-5), _gn_in, "no"),
    "gn weight, proven without": Case(GN, lambda: _gn_a(weight=False), lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5),
                                      _gn_in, "no"),
    "gn groups": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 2, w, b, 1e-5), _gn_in, "no"),
    "gn channels-last input": Case(GN, _gn_a, lambda x, w, b: F.group_norm(_cl(x), 4, w, b, 1e-5), _gn_in, "no"),
    "gn channels-last, proven cl": Case(GN, lambda: _gn_a(x=_cl(_r(*X))), lambda x, w, b: F.group_norm(_cl(x * 1), 4, w,
                                                                                                  b, 1e-5), _gn_in, "ok"),
    "gn transposed view": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x.transpose(2, 3), 4, w, b, 1e-5), _gn_in, "no"),
    "gn offset view": Case(GN, _gn_a, lambda x, w, b: F.group_norm(torch.cat([x, x])[2:], 4, w, b, 1e-5), _gn_in, "ok"),
    "gn input slice of a graph input": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x[:, :, :, :], 4, w, b, 1e-5),
                                            _gn_in, "ok"),
    # x[1:] starts 512 bytes in: the same dtype, shape, strides and alignment as A's, so A's call
    "gn batch slice (aligned offset)": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x[1:], 4, w, b, 1e-5),
                                            lambda: (_r(3, 8, 4, 4), _r(8), _r(8)), "ok"),
    "gn misaligned offset": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x[1:257].view(X), 4, w, b, 1e-5),
                                 lambda: (_r(300), _r(8), _r(8)), "ok"),
    "gn reduce-overhead": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5), _gn_in, "yes",
                               mode="reduce-overhead"),
    "gn channels-last, dynamic": Case(GN, lambda: _gn_a(x=_cl(_r(*X))), lambda x, w, b: F.group_norm(_cl(x * 1), 4,
                                                                                                      w, b, 1e-5),
                                      _gn_in, "ok", dynamic=True, more=(lambda: (_r(3, 8, 4, 4), _r(8), _r(8)),)),
    "gn weight is a view": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w[::2], b[::2], 1e-5),
                                lambda: (_r(*X), _r(16), _r(16)), "no"),
    "gn after relu_ in place": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x.relu_(), 4, w, b, 1e-5), _gn_in, "ok"),
    "gn twice, out reused": Case(GN, _gn_a, lambda x, w, b: F.group_norm(F.group_norm(x, 4, w, b, 1e-5), 4, w, b,
                                                                         1e-5).add_(1), _gn_in, "ok"),
    "gn output transposed": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5).transpose(1, 3).contiguous()
                                 + 1, _gn_in, "ok"),
    "gn output to conv": Case(GN, _gn_a, lambda x, w, b: F.conv2d(F.group_norm(x, 4, w, b, 1e-5), _r(8, 8, 1, 1)),
                              _gn_in, "ok"),
    "gn bf16 call, fp32 proven": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x.bfloat16(), 4, w.bfloat16(),
                                                                              b.bfloat16(), 1e-5).float(), _gn_in, "no"),
    "gn dynamic, other size": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5), _gn_in, "ok",
                                   dynamic=True, more=(lambda: (_r(3, 8, 4, 4), _r(8), _r(8)),)),
    "gn automatic dynamic": Case(GN, _gn_a, lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5), _gn_in, "ok",
                                 dynamic=None, more=(lambda: (_r(3, 8, 4, 4), _r(8), _r(8)),
                                                     lambda: (_r(5, 8, 4, 4), _r(8), _r(8)), _gn_in)),
    # layer norm
    "ln same": Case(aten.native_layer_norm.default, lambda: ((_r(4, 16), [16], _r(16), _r(16), 1e-5), {}),
                    lambda x, w, b: F.layer_norm(x, [16], w, b), lambda: (_r(4, 16), _r(16), _r(16)), "yes"),
    "ln no bias": Case(aten.native_layer_norm.default, lambda: ((_r(4, 16), [16], _r(16), _r(16), 1e-5), {}),
                       lambda x, w, b: F.layer_norm(x, [16], w, None), lambda: (_r(4, 16), _r(16), _r(16)), "no"),
    "ln eps 1e-6": Case(aten.native_layer_norm.default, lambda: ((_r(4, 16), [16], _r(16), _r(16), 1e-5), {}),
                        lambda x, w, b: F.layer_norm(x, [16], w, b, 1e-6), lambda: (_r(4, 16), _r(16), _r(16)), "no"),
    # softmax
    "softmax same": Case(aten._softmax.default, lambda: ((_r(4, 16), -1, False), {}), lambda x: F.softmax(x, -1),
                         lambda: (_r(4, 16),), "yes"),
    "softmax dim 1 vs -1": Case(aten._softmax.default, lambda: ((_r(4, 16), -1, False), {}), lambda x: F.softmax(x, 1),
                                lambda: (_r(4, 16),), "ok"),
    "softmax dim 0": Case(aten._softmax.default, lambda: ((_r(16, 16), -1, False), {}), lambda x: F.softmax(x, 0),
                          lambda: (_r(16, 16),), "no"),
    "softmax dtype=float32 on bf16": Case(aten._softmax.default, lambda: ((_r(4, 16, dtype=torch.bfloat16), -1, False),
                                                                           {}),
                                          lambda x: F.softmax(x, -1, dtype=torch.float32),
                                          lambda: (_r(4, 16, dtype=torch.bfloat16),), "no"),
    "log_softmax vs softmax": Case(aten._softmax.default, lambda: ((_r(4, 16), -1, False), {}),
                                   lambda x: F.log_softmax(x, -1), lambda: (_r(4, 16),), "no"),
    "softmax transposed input": Case(aten._softmax.default, lambda: ((_r(16, 16), -1, False), {}),
                                     lambda x: F.softmax(x.t(), -1), lambda: (_r(16, 16),), "no"),
    # pointwise with scalars
    "clamp min 0 vs 0.0 on ints": Case(aten.clamp.default, lambda: ((_r(4, 16, dtype=torch.int64), 0), {}),
                                       lambda x: torch.clamp(x, min=0.0), lambda: (_r(4, 16, dtype=torch.int64),), "no"),
    "clamp min 0.0 vs 0 on ints": Case(aten.clamp.default, lambda: ((_r(4, 16, dtype=torch.int64), 0.0), {}),
                                       lambda x: torch.clamp(x, min=0), lambda: (_r(4, 16, dtype=torch.int64),), "no"),
    "clamp same": Case(aten.clamp.default, lambda: ((_r(4, 16), -0.5, 0.5), {}), lambda x: torch.clamp(x, -0.5, 0.5),
                       lambda: (_r(4, 16),), "ok"),
    "clamp max only vs min": Case(aten.clamp.default, lambda: ((_r(4, 16), 0.5), {}), lambda x: torch.clamp(x, None, 0.5),
                                  lambda: (_r(4, 16),), "no"),
    "pow 2 vs 2.0 on ints": Case(aten.pow.Tensor_Scalar, lambda: ((_r(4, 16, dtype=torch.int64), 2), {}),
                                 lambda x: torch.pow(x, 2.0), lambda: (_r(4, 16, dtype=torch.int64),), "no"),
    "pow 2.0 vs 2 on ints": Case(aten.pow.Tensor_Scalar, lambda: ((_r(4, 16, dtype=torch.int64), 2.0), {}),
                                 lambda x: torch.pow(x, 2), lambda: (_r(4, 16, dtype=torch.int64),), "no"),
    "leaky_relu -0.0 vs 0.0": Case(aten.leaky_relu.default, lambda: ((_r(4, 16), 0.0), {}),
                                   lambda x: 1 / F.leaky_relu(x, -0.0), lambda: (_r(4, 16),), "no"),
    "hardtanh -0.0 max": Case(aten.hardtanh.default, lambda: ((_r(4, 16), -1.0, 0.0), {}),
                              lambda x: 1 / F.hardtanh(x, -1.0, -0.0), lambda: (_r(4, 16),), "no"),
    "gelu tanh vs none": Case(aten.gelu.default, lambda: ((_r(4, 16),), {}), lambda x: F.gelu(x, approximate="tanh"),
                              lambda: (_r(4, 16),), "no"),
    "add alpha": Case(aten.add.Tensor, lambda: ((_r(4, 16), _r(4, 16)), {}), lambda x, y: torch.add(x, y, alpha=2),
                      lambda: (_r(4, 16), _r(4, 16)), "no"),
    "add_ in place": Case(aten.add_.Tensor, lambda: ((_r(4, 16), _r(4, 16)), {}), lambda x, y: x.add_(y) * 1,
                          lambda: (_r(4, 16), _r(4, 16)), "ok"),
    "add out=": Case(aten.add.out, lambda: ((_r(4, 16), _r(4, 16)), {"out": torch.empty(4, 16)}),
                     lambda x, y: torch.add(x, y, out=torch.empty(4, 16)) * 1, lambda: (_r(4, 16), _r(4, 16)), "ok"),
    "relu_ in place": Case(aten.relu_.default, lambda: ((_r(4, 16),), {}), lambda x: x.relu_() + 0,
                           lambda: (_r(4, 16),), "ok"),
    "silu_ in place": Case(aten.silu.default, lambda: ((_r(4, 16),), {}), lambda x: F.silu(x, inplace=True) + 0,
                           lambda: (_r(4, 16),), "ok"),
    # reductions with dtype / keepdim / dims
    "sum dtype float64": Case(aten.sum.dim_IntList, lambda: ((_r(4, 16), [-1]), {}),
                              lambda x: x.sum(-1, dtype=torch.float64), lambda: (_r(4, 16),), "no"),
    "sum keepdim": Case(aten.sum.dim_IntList, lambda: ((_r(4, 16), [-1]), {}), lambda x: x.sum(-1, keepdim=True) * 1,
                        lambda: (_r(4, 16),), "no"),
    "mean dim 1 vs -1": Case(aten.mean.dim, lambda: ((_r(4, 16), [-1]), {}), lambda x: x.mean(1) * 1,
                             lambda: (_r(4, 16),), "ok"),
    "var correction 0 vs 1": Case(aten.var.correction, lambda: ((_r(4, 16), [-1]), {"correction": 1}),
                                  lambda x: x.var(-1, correction=0), lambda: (_r(4, 16),), "no"),
    "var correction 1 vs 1.0": Case(aten.var.correction, lambda: ((_r(4, 16), [-1]), {"correction": 1}),
                                    lambda x: torch.var(x, -1, correction=1.0), lambda: (_r(4, 16),), "ok"),
    "cumsum dtype": Case(aten.cumsum.default, lambda: ((_r(4, 16), -1), {}), lambda x: x.cumsum(-1, dtype=torch.float64),
                         lambda: (_r(4, 16),), "no"),
    # matmul family
    "addmm beta": Case(aten.addmm.default, lambda: ((_r(16), _r(4, 16), _r(16, 16)), {}),
                       lambda b, x, w: torch.addmm(b, x, w, beta=0.5), lambda: (_r(16), _r(4, 16), _r(16, 16)), "no"),
    "addmm transposed weight": Case(aten.addmm.default, lambda: ((_r(16), _r(4, 16), _r(16, 16)), {}),
                                    lambda b, x, w: torch.addmm(b, x, w.t()), lambda: (_r(16), _r(4, 16), _r(16, 16)),
                                    "no"),
    "addmm same": Case(aten.addmm.default, lambda: ((_r(16), _r(4, 16), _r(16, 16)), {}),
                       lambda b, x, w: torch.addmm(b, x, w), lambda: (_r(16), _r(4, 16), _r(16, 16)), "ok"),
    "bmm transposed": Case(aten.bmm.default, lambda: ((_r(2, 8, 8), _r(2, 8, 8)), {}),
                           lambda x, y: torch.bmm(x, y.transpose(1, 2)), lambda: (_r(2, 8, 8), _r(2, 8, 8)), "no"),
    "baddbmm alpha": Case(aten.baddbmm.default, lambda: ((_r(2, 8, 8), _r(2, 8, 8), _r(2, 8, 8)), {}),
                          lambda b, x, y: torch.baddbmm(b, x, y, alpha=2.0), lambda: (_r(2, 8, 8), _r(2, 8, 8),
                                                                                      _r(2, 8, 8)), "no"),
    # pooling / upsampling
    "avg_pool ceil_mode": Case(aten.avg_pool2d.default, lambda: ((_r(*X), [2, 2], [2, 2]), {}),
                               lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), lambda: (_r(*X),), "no"),
    "avg_pool divisor_override": Case(aten.avg_pool2d.default, lambda: ((_r(*X), [2, 2], [2, 2]), {}),
                                      lambda x: F.avg_pool2d(x, 2, 2, divisor_override=3), lambda: (_r(*X),), "no"),
    "upsample nearest scale": Case(aten.upsample_nearest2d.vec, lambda: ((_r(*X), [8, 8], None), {}),
                                   lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), lambda: (_r(*X),), "ok"),
    "upsample bilinear align_corners": Case(aten.upsample_bilinear2d.vec, lambda: ((_r(*X), [8, 8], False, None), {}),
                                            lambda x: F.interpolate(x, size=(8, 8), mode="bilinear", align_corners=True),
                                            lambda: (_r(*X),), "no"),
    # Controls: B is A. Where one of these does not hit, Inductor lowers the op itself (nothing reaches the cast's
    # override under compile), and the op's "no" cases above only say the values are eager's.
    "pow same (control)": Case(aten.pow.Tensor_Scalar, lambda: ((_r(4, 16), 2.0), {}), lambda x: torch.pow(x, 2.0),
                               lambda: (_r(4, 16),), "ok"),
    "leaky_relu same (control)": Case(aten.leaky_relu.default, lambda: ((_r(4, 16), 0.0), {}),
                                      lambda x: F.leaky_relu(x, 0.0), lambda: (_r(4, 16),), "ok"),
    "gelu same (control)": Case(aten.gelu.default, lambda: ((_r(4, 16),), {}), lambda x: F.gelu(x),
                                lambda: (_r(4, 16),), "ok"),
    "sum same (control)": Case(aten.sum.dim_IntList, lambda: ((_r(4, 16), [-1]), {}), lambda x: x.sum(-1),
                               lambda: (_r(4, 16),), "ok"),
    "var same (control)": Case(aten.var.correction, lambda: ((_r(4, 16), [-1]), {"correction": 1}),
                               lambda x: x.var(-1), lambda: (_r(4, 16),), "ok"),
    "bmm same (control)": Case(aten.bmm.default, lambda: ((_r(2, 8, 8), _r(2, 8, 8)), {}), lambda x, y: torch.bmm(x, y),
                               lambda: (_r(2, 8, 8), _r(2, 8, 8)), "ok"),
    "avg_pool same (control)": Case(aten.avg_pool2d.default, lambda: ((_r(*X), [2, 2], [2, 2]), {}),
                                    lambda x: F.avg_pool2d(x, 2, 2), lambda: (_r(*X),), "ok"),
    "upsample bilinear same (control)": Case(aten.upsample_bilinear2d.vec, lambda: ((_r(*X), [8, 8], False, None), {}),
                                             lambda x: F.interpolate(x, size=(8, 8), mode="bilinear"),
                                             lambda: (_r(*X),), "ok"),
}


@dataclass
class Outcome:
    hits: int = 0
    problems: list[str] = field(default_factory=list)


def _flat(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _flat(o)]


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape or not got.is_floating_point() or got.dtype != want.dtype:
        return 0.0
    fin = torch.isfinite(want) & torch.isfinite(got)
    return (got.double() - want.double()).abs()[fin].max().item() if fin.any() else 0.0


def differs(got: torch.Tensor, want: torch.Tensor, noise: float) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{list(got.shape)} where eager gives {want.dtype}{list(want.shape)}"
    if not got.is_floating_point():
        return None if torch.equal(got, want) else f"{int((got != want).sum())} of {got.numel()} elements differ"
    if not torch.equal(torch.isnan(got), torch.isnan(want)) or \
            not torch.equal(torch.isinf(got) & torch.signbit(got), torch.isinf(want) & torch.signbit(want)):
        return "infinities or NaNs differ"
    err = _err(got, want)
    fin = torch.isfinite(want)
    scale = want.double().abs()[fin].max().item() if fin.any() else 1.0
    tol = max(8 * noise, 4 * torch.finfo(want.dtype).eps * max(scale, 1.0))
    return None if err <= tol else f"max error {err:.3g}, eager vs torch.compile {noise:.3g}"


def _fresh(inputs: tuple) -> tuple:
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)


def sweep_case(name: str, plain: bool = True) -> Outcome:
    """Prove A's call in a fresh cast, compile B with it, run each input set: B's outputs against eager's (within
    plain compile's noise) and the variant's hits against the case's `fire`."""
    case = CASES[name]
    out = Outcome()
    args, kwargs = case.a()
    cast = OpCast().prove(case.op, args, kwargs)
    runs = [case.inputs()] + [m() for m in case.more]
    try:
        with torch.no_grad():
            with runtime.suspended():
                wants = [_flat(case.b(*_fresh(i))) for i in runs]
            noise = [0.0] * len(runs)
            if plain:
                torch._dynamo.reset()
                fast = torch.compile(case.b, dynamic=case.dynamic)
                with runtime.suspended():
                    for k, i in enumerate(runs):
                        noise[k] = max((_err(g, w) for g, w in zip(_flat(fast(*_fresh(i))), wants[k])), default=0.0)
            torch._dynamo.reset()
            fast = compose.compile(cast, case.b, dynamic=case.dynamic, mode=case.mode)
            for k, i in enumerate(runs):
                gots = _flat(fast(*_fresh(i)))
                for j, (g, w) in enumerate(zip(gots, wants[k])):
                    if (why := differs(g, w, noise[k])) is not None:
                        out.problems.append(f"run {k} output {j}: {why}")
    finally:
        torch._dynamo.reset()
        out.hits = cast.hits
        cast.remove()
    if case.fire == "no" and out.hits:
        out.problems.append(f"A's variant ran {out.hits} time(s) on B's call, which is not A's")
    if case.fire == "yes" and not out.hits:
        out.problems.append("A's variant never ran on A's own call")
    return out
