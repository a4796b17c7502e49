"""Small models whose module forwards are memory-bound chains, returning what real code returns: the one tensor the
chain makes (RMSNorm, LayerNorm, SiLU gates, GELU pieces: module cards a cast serves), and everything else a forward
may hand back around it (a tuple or list, a dict, a named tuple or dataclass, the output twice, a view of it, an input
or a parameter beside it, None, a return that differs between instances), and what else a cast skipping the forward
would lose (a module called twice in a row, a tensor kept on the module, a list or dict argument written into). The
module-return sweep
(tests/test_module_return_sweep.py, scripts/module_return_sweep.py) captures each, installs every module card it
binds with eager as the plan, and compares the model's output with and without the cast.

`PATTERNS[name](seed, g)` is (model, args): the model holds two `Layer`s, each a Linear, the module under test and
another Linear; `LEGIT` names the patterns whose module card must bind (and be served)."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

Pair = namedtuple("Pair", "out gate")


@dataclass
class Output:
    hidden: torch.Tensor


def _first(v):
    """The tensor the next Linear reads from what the module under test returned."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, dict):
        return next(iter(v.values()))
    if isinstance(v, Output):
        return v.hidden
    return v[0]


class Layer(nn.Module):
    def __init__(self, d, inner):
        super().__init__()
        self.proj_in, self.inner, self.proj_out = nn.Linear(d, d), inner, nn.Linear(d, d)

    def forward(self, x):
        got = self.inner(self.proj_in(x))
        # what the caller computes with: the gated value where a Gate returns its gate first (only it is read)
        main = got[1] if getattr(self.inner, "how", "") == "(h, y)" else _first(got)
        return self.proj_out(main.reshape(x.shape)), got


class Stack(nn.Module):
    """Two layers; the model's output holds each inner module's whole return value, so any difference shows."""

    def __init__(self, d, make):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d, make(i)) for i in range(2)])

    def forward(self, x):
        seen = []
        for layer in self.layers:
            x, got = layer(x)
            seen.append(got)
        return x, seen


# ------------------------------------------------------------------------------------------- module cards that bind


class RMS(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight, self.eps = nn.Parameter(1 + 0.1 * torch.randn(d)), 1e-6

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class ManualLayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight, self.bias = nn.Parameter(1 + 0.1 * torch.randn(d)), nn.Parameter(0.1 * torch.randn(d))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class SiLUGate(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat([F.silu(a) * b, b], dim=-1)


class GeluTanh(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x.pow(3))))


class TorchRMS(nn.Module):
    """torch.nn.RMSNorm's function, as a model's own module calls it."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)


class ViewedOut(nn.Module):
    """Returns a view its own forward makes last: the view is the chain's output, the return value."""

    def forward(self, x):
        return (torch.sigmoid(x) * x).view(-1, x.shape[-1])


class SameTensorBack(nn.Module):
    """`.float()` and `.contiguous()` of a float, contiguous tensor return that tensor itself: still the output."""

    def forward(self, x):
        return (torch.sigmoid(x) * x + 1.0).float().contiguous()


class ThroughChildren(nn.Module):
    """An eval-mode Dropout between its calls and an Identity it returns through: children that make no call and
    hand back the tensor they were given."""

    def __init__(self):
        super().__init__()
        self.drop, self.ident = nn.Dropout(0.1), nn.Identity()

    def forward(self, x):
        h = self.drop(torch.sigmoid(x) * x)
        return self.ident(h + 1.0)


class ConfiguredGate(nn.Module):
    """Returns the gate beside the output where a config object it holds says so (a flag set after install)."""

    def __init__(self, d, config):
        super().__init__()
        self.w, self.config = nn.Parameter(torch.randn(d)), config

    def forward(self, x):
        h = torch.sigmoid(x * self.w)
        y = h * x
        return (y, h) if self.config.return_gate else y


class ConfiguredAct(nn.Module):
    """Its activation and scale come from a config it holds, read at each call (transformers' `ACT2FN[config.act]`
    and `config.scale`): a model built with another config runs another forward."""

    def __init__(self, d, config):
        super().__init__()
        self.w, self.config = nn.Parameter(torch.randn(d)), config

    def forward(self, x):
        h = x * self.w * self.config.scale
        return torch.nn.functional.gelu(h) if self.config.act == "gelu" else torch.nn.functional.silu(h)


class CountingGate(nn.Module):
    """Counts its calls in an object it holds (`self.stats.calls += 1`): a cast that skips its forward skips that."""

    def __init__(self, d, stats):
        super().__init__()
        self.w, self.stats = nn.Parameter(torch.randn(d)), stats

    def forward(self, x):
        self.stats.calls += 1
        return torch.sigmoid(x * self.w) * x


class NormAct(nn.Module):
    """A block that only calls its children, a norm then an activation (a GroupNorm -> SiLU block)."""

    def __init__(self, d):
        super().__init__()
        self.norm, self.act = RMS(d), nn.SiLU()

    def forward(self, x):
        return self.act(self.norm(x))


class InPlaceOnInput(nn.Module):
    """Writes its input in place and returns it: the returned tensor is the caller's own."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x.mul_(self.w).add_(1.0)


class KeepsOutput(nn.Module):
    """Returns its output and keeps it as an attribute, which the caller reads."""

    def forward(self, x):
        self.last = torch.sigmoid(x) * x
        return self.last


class History(nn.Module):
    """Returns its output and appends it to a list it keeps (the list holds tensors: no plain state)."""

    def __init__(self):
        super().__init__()
        self.history = [torch.zeros(1)]

    def forward(self, x):
        y = torch.sigmoid(x) * x
        self.history.append(y)
        return y


class HistoryLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj_in, self.inner, self.proj_out = nn.Linear(d, d), History(), nn.Linear(d, d)

    def forward(self, x):
        got = self.inner(self.proj_in(x))
        return self.proj_out(self.inner.history[-1]), got


class ScaleSetEachCall(nn.Module):
    """Sets a plain attribute from the input's shape at each call (the same value each time): no change."""

    def __init__(self, d):
        super().__init__()
        self.scale = 1.0 / d ** 0.5

    def forward(self, x):
        self.scale = 1.0 / x.shape[-1] ** 0.5
        return torch.sigmoid(x * self.scale) * x


class IntoArgument(nn.Module):
    """Returns its output and also puts it in a dict (or list) its caller passes and reads afterwards."""

    def forward(self, x, cache):
        y = torch.sigmoid(x) * x
        if isinstance(cache, dict):
            cache["y"] = y
        else:
            cache.append(y)
        return y


class ArgumentLayer(nn.Module):
    def __init__(self, d, kind):
        super().__init__()
        self.proj_in, self.inner, self.proj_out, self.kind = nn.Linear(d, d), IntoArgument(), nn.Linear(d, d), kind

    def forward(self, x):
        cache = {} if self.kind == "dict" else []
        got = self.inner(self.proj_in(x), cache)
        return self.proj_out(cache["y"] if self.kind == "dict" else cache[0]), got


class KeepLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj_in, self.inner, self.proj_out = nn.Linear(d, d), KeepsOutput(), nn.Linear(d, d)

    def forward(self, x):
        got = self.inner(self.proj_in(x))
        return self.proj_out(self.inner.last), got


class WrittenAfter(nn.Module):
    """A caller that writes the module's output in place after it returns."""

    def __init__(self, d):
        super().__init__()
        self.proj_in, self.inner, self.proj_out = nn.Linear(d, d), GeluTanh(), nn.Linear(d, d)

    def forward(self, x):
        y = self.inner(self.proj_in(x))
        y.mul_(0.5)
        return self.proj_out(y), y


class Twice(nn.Module):
    """Calls its child twice in a row (`act(act(x))`, a loop over one norm): two invocations, no call between."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        for _ in range(2):
            x = self.child(x)
        return x


# --------------------------------------------------------------------------- returns other than the chain's output


class Gate(nn.Module):
    """The sigmoid gate and the gated value; `how` says what the forward returns."""

    def __init__(self, d, how):
        super().__init__()
        self.w, self.how = nn.Parameter(torch.randn(d)), how

    def forward(self, x):
        h = torch.sigmoid(x * self.w)
        y = h * x + 1.0
        return {
            "(h, y)": lambda: (h, y),
            "(y, h)": lambda: (y, h),
            "(y,)": lambda: (y,),
            "[y]": lambda: [y],
            "{y}": lambda: {"out": y},
            "Pair": lambda: Pair(y, h),
            "Output": lambda: Output(y),
            "(y, y)": lambda: (y, y),
            "(y, x)": lambda: (y, x),
            "(y, w)": lambda: (y, self.w),
            "(y, 1.0)": lambda: (y, 1.0),
            "y.detach()": lambda: y.detach(),
            "y.data": lambda: y.data,
            "y.view(-1)": lambda: y.view(-1, y.shape[-1]),
            "y[None]": lambda: y[None],
            "y.t()": lambda: y.transpose(-1, -2),
        }[self.how]()


class StatKept(nn.Module):
    """Keeps a statistic of its input and returns the input: the statistic is the chain's one output."""

    def forward(self, x):
        self.stat = (x * x).mean(-1, keepdim=True).sqrt()
        return x


class IntoList(nn.Module):
    """Appends its result to a list the caller reads, and returns None."""

    def __init__(self):
        super().__init__()
        self.sink = []

    def forward(self, x):
        self.sink.clear()
        self.sink.append(torch.sigmoid(x) * x)


class SinkLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj_in, self.inner, self.proj_out = nn.Linear(d, d), IntoList(), nn.Linear(d, d)

    def forward(self, x):
        got = self.inner(self.proj_in(x))
        return self.proj_out(self.inner.sink[0]), got


class PerInstance(nn.Module):
    """Returns the output alone in one instance and with its gate in the other (a flag set after construction)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        h = torch.sigmoid(x * self.w)
        y = h * x
        return (y, h) if getattr(self, "both", False) else y


class StatLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj_in, self.inner, self.proj_out = nn.Linear(d, d), StatKept(), nn.Linear(d, d)

    def forward(self, x):
        got = self.inner(self.proj_in(x))
        return self.proj_out(got) + self.inner.stat, got


def _shapes(seed):
    return [(2, 5, 32), (1, 3, 16), (3, 4, 24)][seed % 3]


def _x(seed, g, dtype=torch.float32):
    return (torch.randn(*_shapes(seed), generator=g).to(dtype),)


def _stack(make, dtype=torch.float32):
    def build(seed, g):
        d = _shapes(seed)[-1]
        torch.manual_seed(seed)
        return Stack(d, lambda i: make(d, i)).to(dtype).eval(), _x(seed, g, dtype)
    return build


def _layers(layer, dtype=torch.float32):
    def build(seed, g):
        d = _shapes(seed)[-1]
        torch.manual_seed(seed)
        return nn.Sequential(layer(d), _Keep(), layer(d)).to(dtype).eval(), _x(seed, g, dtype)
    return build


class _Keep(nn.Module):
    """Between two layers returning (x, got): passes x on, keeps the first layer's return in the output."""

    def forward(self, pair):
        self.kept = pair[1]
        return pair[0]


def configured(seed, g):
    """A Stack of ConfiguredGates sharing one config (`return_gate` off), and its input."""
    from types import SimpleNamespace

    d = _shapes(seed)[-1]
    torch.manual_seed(seed)
    config = SimpleNamespace(return_gate=False)
    return Stack(d, lambda i: ConfiguredGate(d, config)).eval(), _x(seed, g)


def config_act(seed, g, act="gelu", scale=1.0):
    """A Stack of ConfiguredActs sharing one config, and its input."""
    from types import SimpleNamespace

    d = _shapes(seed)[-1]
    torch.manual_seed(seed)
    config = SimpleNamespace(act=act, scale=scale)
    return Stack(d, lambda i: ConfiguredAct(d, config)).eval(), _x(seed, g)


def counting(seed, g):
    """A Stack of CountingGates sharing one stats object, and its input."""
    from types import SimpleNamespace

    d = _shapes(seed)[-1]
    torch.manual_seed(seed)
    stats = SimpleNamespace(calls=0)
    return Stack(d, lambda i: CountingGate(d, stats)).eval(), _x(seed, g)


def _per_instance(seed, g):
    d = _shapes(seed)[-1]
    torch.manual_seed(seed)
    model = Stack(d, lambda i: PerInstance(d)).eval()
    model.layers[1].inner.both = True
    return model, _x(seed, g)


LEGIT = {
    "rms fp32": _stack(lambda d, i: RMS(d)),
    "rms bf16": _stack(lambda d, i: RMS(d), torch.bfloat16),
    "manual layernorm": _stack(lambda d, i: ManualLayerNorm(d)),
    "silu gate": _stack(lambda d, i: SiLUGate()),
    "gelu tanh bf16": _stack(lambda d, i: GeluTanh(), torch.bfloat16),
    "F.rms_norm": _stack(lambda d, i: TorchRMS(d)),
    "view made last": _stack(lambda d, i: ViewedOut()),
    ".float().contiguous() of itself": _stack(lambda d, i: SameTensorBack()),
    "gelu called twice in a row": _stack(lambda d, i: Twice(GeluTanh())),
    "rms called twice in a row bf16": _stack(lambda d, i: Twice(RMS(d)), torch.bfloat16),
    "norm+act block called twice in a row": _stack(lambda d, i: Twice(NormAct(d))),
    "the caller writes the output in place": _layers(WrittenAfter),
    "sets a plain attribute alike at each call": _stack(lambda d, i: ScaleSetEachCall(d)),
    "eval dropout and identity children": _stack(lambda d, i: ThroughChildren()),
    "a config object it holds": configured,
}

OTHER_RETURNS = {
    f"returns {how}": _stack(lambda d, i, how=how: Gate(d, how))
    for how in ["(h, y)", "(y, h)", "(y,)", "[y]", "{y}", "Pair", "Output", "(y, y)", "(y, x)", "(y, w)",
                "(y, 1.0)", "y.detach()", "y.data", "y.view(-1)", "y[None]", "y.t()"]
} | {
    "returns its input, keeps a statistic": _layers(StatLayer),
    "returns None, result in a list": _layers(SinkLayer),
    "return differs between instances": _per_instance,
    "writes its input in place, returns it": _stack(lambda d, i: InPlaceOnInput(d)),
    "keeps its output as an attribute": _layers(KeepLayer),
    "appends its output to a list it keeps": _layers(HistoryLayer),
    "puts its output in a dict argument": _layers(lambda d: ArgumentLayer(d, "dict")),
    "appends its output to a list argument": _layers(lambda d: ArgumentLayer(d, "list")),
}

PATTERNS = {**LEGIT, **OTHER_RETURNS}
