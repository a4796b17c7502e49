"""Near-miss models for the pattern-card correctness sweep under torch.compile (tests/test_pattern_compile_sweep.py,
scripts/pattern_compile_sweep.py): each case is a model A whose chains are captured and made a cast's pattern cards
(plan: eager's own `run_chain`), and a model B, compiled with that cast, that differs from A in one detail a
replacement must not ignore (a constant, an operand order, a dtype, an extra reader of an intermediate, a view between
members, a graph break, ...). `fire` says whether a replacement in B is right ("no": it must not fire, "ok": either
way, "yes": it must), the values B computes are always checked against eager and plain torch.compile.

Every chain sits in a submodule after a projection, as in tests/chain_sweep_models.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from chain_sweep_models import Around, Fn

F32, BF16 = torch.float32, torch.bfloat16


@dataclass(frozen=True)
class Case:
    a: Callable            # (x, *params) -> outputs: the chain captured for the cast
    b: Callable            # the chain compiled with it
    shape: tuple = (6, 6)  # the projected input's shape (square: a swapped or transposed operand still fits)
    params: tuple = ()     # shapes of extra inputs (random floats), passed after x
    fire: str = "ok"       # "no": a replacement in B is wrong; "yes": B is A and must be replaced; "ok": either
    dtype: torch.dtype = F32
    dynamic: bool | None = False
    b_shape: tuple | None = None  # B run at another shape than A was captured at (dynamic compiles)
    ints: bool = False     # x is an int64 tensor (no projection)
    b_dtype: torch.dtype | None = None  # B's dtype, where it is not A's


def model(fn: Callable, case: Case, shape: tuple | None = None, seed: int = 0, dtype: torch.dtype | None = None
          ) -> tuple[torch.nn.Module, tuple]:
    """The model running `fn` in a submodule, and its inputs (the same values for A and B at one shape)."""
    shape, dtype = shape or case.shape, dtype or case.dtype
    g = torch.Generator().manual_seed(seed)
    if case.ints:
        m = Around(Fn(fn))
        x = torch.randint(-20, 20, shape, generator=g)
    else:
        torch.manual_seed(seed)
        m = Around(Fn(fn), shape[-1], dtype=dtype)
        x = torch.randn(shape, generator=g).to(dtype)
    rest = tuple(torch.randn(s if s != "x" else shape, generator=g).to(dtype) for s in case.params)
    return m.eval(), (x, *rest)


def _rms(eps):
    def f(x, w):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)) * w
    return f


def _gn(groups, eps=1e-5):
    def f(x):
        return F.silu(F.group_norm(x, groups, eps=eps)) * 2.0
    return f


def _graph_break(x, y):
    h = torch.sigmoid(x) * y
    torch._dynamo.graph_break()
    return h * 2.0 + 1.0


def _twice(x, y):
    return (torch.sigmoid(x) * y) + (torch.sigmoid(y) * x)


def _extra_reader(x, y):
    s = torch.sigmoid(x)
    return s * y * 2.0, s


def _intermediate_out(x):
    h = x * 2.0
    return h.sigmoid() + 1.0, h


def _two_out(x):
    h = torch.exp(x) * 0.5
    return h, torch.tanh(h) + x


def _bound_to_intermediate(x, y):
    s = torch.sigmoid(x)
    return s * s + y


def _product_twice(x, w, b):
    h = x * w
    return (h + h).tanh() + b


def _written_after(x, y):
    h = torch.sigmoid(x) * y * 2.0
    y.add_(1.0)
    return h, y


def _written_before(x, y):
    y.mul_(3.0)
    return torch.sigmoid(x) * y * 2.0


def _neg_zero(zero):
    def f(x):
        return torch.reciprocal(torch.relu(x).mul(zero).sub(0.0)).clamp(-5.0, 5.0) + x
    return f


CASES: dict[str, Case] = {
    # A itself: the replacement must fire and compute what eager does
    "same rms": Case(_rms(1e-6), _rms(1e-6), params=(6,), fire="yes"),
    "same gn+silu": Case(_gn(2), _gn(2), shape=(2, 4, 3, 3), fire="yes"),
    # a constant other than the proven one
    "rms eps": Case(_rms(1e-6), _rms(1e-2), params=(6,), fire="no"),
    "group count": Case(_gn(2), _gn(4), shape=(2, 4, 3, 3), fire="no"),
    "group norm eps": Case(_gn(2), _gn(2, eps=1e-2), shape=(2, 4, 3, 3), fire="no"),
    "layer norm eps": Case(lambda x: F.layer_norm(x, (6,), eps=1e-5) * 2.0, lambda x: F.layer_norm(x, (6,), eps=1e-2) * 2.0,
                           fire="no"),
    "softmax in float32 or not": Case(lambda x: torch.softmax(x.to(BF16), -1, dtype=F32) * 2.0,
                                      lambda x: torch.softmax(x.to(BF16), -1).float() * 2.0, fire="no"),
    "bf16 round trip added": Case(lambda x: (x * 3.0).sigmoid(), lambda x: (x * 3.0).to(torch.bfloat16).float().sigmoid(),
                                  fire="no"),
    "gelu approximate": Case(lambda x: F.gelu(x * 2.0) + 1.0, lambda x: F.gelu(x * 2.0, approximate="tanh") + 1.0,
                             fire="no"),
    "sum dtype": Case(lambda x: (x * 2.0).sum(-1) + 1.0, lambda x: (x * 2.0).sum(-1, dtype=torch.float64) + 1.0,
                      fire="no"),
    "cumsum dtype": Case(lambda x: (x * 2.0).cumsum(-1) + 1.0, lambda x: (x * 2.0).cumsum(-1, dtype=torch.float64) + 1.0,
                         fire="no"),
    "var correction": Case(lambda x: (x * 2.0).var(-1, keepdim=True) + x,
                           lambda x: (x * 2.0).var(-1, keepdim=True, unbiased=False) + x, fire="no"),
    "std correction": Case(lambda x: x / ((x * 2.0).std(-1, keepdim=True) + 1.0),
                           lambda x: x / ((x * 2.0).std(-1, keepdim=True, correction=0) + 1.0), fire="no"),
    "leaky slope": Case(lambda x: F.leaky_relu(x * 2.0, 0.01) + 1.0, lambda x: F.leaky_relu(x * 2.0, 0.2) + 1.0,
                        fire="no"),
    "add alpha": Case(lambda x, y: torch.add(x, y, alpha=2).sigmoid(), lambda x, y: torch.add(x, y, alpha=3).sigmoid(),
                      params=("x",), fire="no"),
    "softmax dim": Case(lambda x: torch.softmax(x * 2.0, -1) + 1.0, lambda x: torch.softmax(x * 2.0, 0) + 1.0,
                        fire="no"),
    "keepdim": Case(lambda x: x * x.mean(-1, keepdim=True) + 1.0, lambda x: x * x.mean(-1) + 1.0, fire="no"),
    "cast dtype": Case(lambda x: (x.to(torch.bfloat16) * 3.0).float() + 1.0,
                       lambda x: (x.to(torch.float16) * 3.0).float() + 1.0, fire="no"),
    "bf16 round trip dropped": Case(lambda x: (x * 3.0).to(torch.bfloat16).float().sigmoid(),
                                    lambda x: (x * 3.0).sigmoid(), fire="no"),
    "clamp bounds": Case(lambda x: (x * 2.0).clamp(-1.0, 0.5).exp(), lambda x: (x * 2.0).clamp(-0.5, 1.0).exp(),
                         fire="no"),
    "int scalar vs float scalar on ints": Case(lambda x: (x * 3 + 1) % 5, lambda x: (x * 3.0 + 1) % 5,
                                               shape=(6, 6), ints=True, fire="no"),
    "float scalar vs int scalar on ints": Case(lambda x: (x * 3.0 + 1) % 5, lambda x: (x * 3 + 1) % 5,
                                               shape=(6, 6), ints=True, fire="no"),
    "int pow exponent": Case(lambda x: (x + 1).pow(2) - 3, lambda x: (x + 1).pow(2.0) - 3, ints=True, fire="no"),
    "where other int vs float on ints": Case(lambda x: torch.where(x > 0, x * 2, 1) + 1,
                                             lambda x: torch.where(x > 0, x * 2, 1.0) + 1, ints=True, fire="no"),
    "negative zero": Case(_neg_zero(0.0), _neg_zero(-0.0), fire="no"),
    # operands bound otherwise than in A (a replacement is right when it binds them as B has them)
    "x*w+b vs b*w+x": Case(lambda x, w, b: torch.sigmoid(x * w + b), lambda x, w, b: torch.sigmoid(b * w + x),
                           params=("x", "x")),
    "sub order": Case(lambda x, y: (x - y).exp() * 2.0, lambda x, y: (y - x).exp() * 2.0, params=("x",)),
    "div order": Case(lambda x, y: (x / (y.abs() + 1.0)).tanh(), lambda x, y: (y / (x.abs() + 1.0)).tanh(),
                      params=("x",)),
    "transposed operand": Case(lambda x, y: (x * y + 1.0).relu(), lambda x, y: (x * y.t() + 1.0).relu(),
                               params=("x",)),
    "broadcast other dim": Case(lambda x, w: (x * w + 1.0).tanh(), lambda x, w: (x * w[:, None] + 1.0).tanh(),
                                params=(6,)),
    "broadcast operands swapped": Case(lambda x, w: (x + w).sigmoid() * 2.0, lambda x, w: (w + x).sigmoid() * 2.0,
                                       shape=(4, 6), params=(6,)),
    "cat order": Case(lambda x, y: torch.cat([x.sigmoid(), y], -1) * 2.0, lambda x, y: torch.cat([y.sigmoid(), x], -1) * 2.0,
                      params=("x",)),
    "slice start": Case(lambda x: x[:, 1:].sigmoid() * 2.0, lambda x: x[:, 2:].sigmoid() * 2.0, fire="no"),
    # an intermediate with another reader, views between members, in-place members
    "input written after the chain": Case(lambda x, y: torch.sigmoid(x) * y * 2.0, _written_after, params=("x",)),
    "input written before the chain": Case(lambda x, y: torch.sigmoid(x) * y * 2.0, _written_before, params=("x",)),
    "extra reader of an intermediate": Case(lambda x, y: torch.sigmoid(x) * y * 2.0, _extra_reader, params=("x",)),
    "intermediate returned": Case(lambda x: (x * 2.0).sigmoid() + 1.0, _intermediate_out),
    "two outputs, one read": Case(_two_out, lambda x: _two_out(x)[1]),
    "two outputs, the first read twice": Case(_two_out, lambda x: (lambda h, o: (h + 1.0, h * 3.0, o))(*_two_out(x))),
    "transpose between members": Case(lambda x: (x * 2.0).sigmoid() + 1.0, lambda x: (x * 2.0).t().sigmoid() + 1.0,
                                      fire="no"),
    "in-place variant": Case(lambda x, y: (x * y + 1.0).tanh(), lambda x, y: (x * y).add_(1.0).tanh(),
                             params=("x",)),
    "intermediate bound as an input": Case(lambda x, y: torch.sigmoid(x) * y, _bound_to_intermediate, params=("x",)),
    "product bound as the addend": Case(lambda x, w, b: (x * w + b).tanh(), _product_twice, params=("x", "x")),
    # the pattern beside, inside or around other chains
    "graph break inside": Case(lambda x, y: (torch.sigmoid(x) * y) * 2.0 + 1.0, _graph_break, params=("x",)),
    "twice with shared inputs": Case(lambda x, y: torch.sigmoid(x) * y, _twice, params=("x",)),
    "prefix of a longer chain": Case(lambda x, y: F.silu(x) * y, lambda x, y: (F.silu(x) * y) * 2.0 + y,
                                     params=("x",)),
    "longer than the chain": Case(lambda x, y: (F.silu(x) * y) * 2.0 + y, lambda x, y: F.silu(x) * y,
                                  params=("x",), fire="no"),
    # other dtypes and sizes than proven: the guard must decline
    "bf16 model, fp32 card": Case(lambda x, w: (x * w + 1.0).sigmoid(), lambda x, w: (x * w + 1.0).sigmoid(),
                                  params=(6,), b_dtype=BF16, fire="no"),
    "dynamic, other size": Case(_rms(1e-6), _rms(1e-6), shape=(4, 6), params=(6,), dynamic=True, b_shape=(7, 6)),
    "automatic dynamic batch": Case(_rms(1e-6), _rms(1e-6), shape=(4, 6), params=(6,), dynamic=None, b_shape=(7, 6)),
    "automatic dynamic pointwise": Case(lambda x, y: torch.sigmoid(x) * y * 2.0, lambda x, y: torch.sigmoid(x) * y * 2.0,
                                        shape=(4, 6), params=("x",), dynamic=None, b_shape=(7, 6)),
    "dynamic pointwise, other size": Case(lambda x, y: torch.sigmoid(x) * y * 2.0, lambda x, y: torch.sigmoid(x) * y * 2.0,
                                          shape=(4, 6), params=("x",), dynamic=True, b_shape=(7, 6)),
}
