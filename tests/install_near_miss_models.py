"""Model pairs for the install near-miss sweep: a model A whose module cards a cast proves, and a model B that
differs from A in one construction detail (an attribute, a held config, a child, a class attribute, a global the
forward reads, a callable it holds, the class itself...), or that is changed after the cast is installed. The sweep
(tests/test_install_near_miss_sweep.py, scripts/install_near_miss_sweep.py) captures A, installs every module card it
binds into B with eager as the plan, and compares B's output with and without the cast: the cast may decline (a miss
costs speed), never change what B computes.

`CASES[name]` is a `Case`: `a(seed, g)` and `b(seed, g)` are (model, args); `env` is entered around everything done
with B (a class attribute or a global set for B, put back after); `after(model)` changes B once the cast is
installed (or returns the model to run in its place: a deep copy); `mode` is entered around each run of B;
`served`: B is A (a control), so the cast must serve it."""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import sys
import types
from collections import namedtuple
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from module_return_models import Stack, _shapes, _x

# ----------------------------------------------------------------------------------------------- the modules proven


class Norm(nn.Module):
    """An RMSNorm whose eps and scale are plain attributes."""

    def __init__(self, d, eps=1e-6, scale=1.0):
        super().__init__()
        self.weight, self.eps, self.scale = nn.Parameter(1 + 0.1 * torch.randn(d)), eps, scale

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h * self.scale


class HeldAct(nn.Module):
    """Holds its activation as an attribute (a function, a partial, a lambda, a bound method)."""

    def __init__(self, d, act):
        super().__init__()
        self.w, self.act = nn.Parameter(1 + 0.1 * torch.randn(d)), act

    def forward(self, x):
        return self.act(x * self.w) + 1.0


class ConfigAct(nn.Module):
    """Reads its activation's name and a scale from `self.config.<path>` at each call (`path` '' for the config
    itself, 'text_config' for a nested one)."""

    def __init__(self, d, config, path=""):
        super().__init__()
        self.w, self.config, self.path = nn.Parameter(1 + 0.1 * torch.randn(d)), config, path

    def cfg(self):
        c = self.config
        for p in filter(None, self.path.split(".")):
            c = c[int(p)] if p.isdigit() else getattr(c, p)
        return c

    def forward(self, x):
        c = self.cfg()
        h = x * self.w * c.scale
        return (F.gelu(h) if c.act == "gelu" else F.silu(h)) + 1.0


class ItemConfigAct(ConfigAct):
    """Reads the config by item (a dict, a list of them)."""

    def cfg(self):
        c = self.config
        for p in filter(None, self.path.split(".")):
            c = c[int(p)] if isinstance(c, (list, tuple)) else c[p]
        return c

    def forward(self, x):
        c = self.cfg()
        h = x * self.w * c["scale"]
        return (F.gelu(h) if c["act"] == "gelu" else F.silu(h)) + 1.0


class Mode(enum.Enum):
    GELU = 1
    SILU = 2


class ModeAct(nn.Module):
    """Branches on a mode it holds (an Enum, a set of flags)."""

    def __init__(self, d, mode):
        super().__init__()
        self.w, self.mode = nn.Parameter(1 + 0.1 * torch.randn(d)), mode

    def forward(self, x):
        h = x * self.w
        gelu = self.mode is Mode.GELU if isinstance(self.mode, Mode) else "gelu" in self.mode
        return (F.gelu(h) if gelu else F.silu(h)) + 1.0


class ClassScaled(nn.Module):
    """Reads a class attribute (`self.SCALE`, `type(self).ACT`)."""

    SCALE = 1.0
    ACT = "gelu"

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        h = x * self.w * self.SCALE
        return (F.gelu(h) if type(self).ACT == "gelu" else F.silu(h)) + 1.0


class PropertyScaled(nn.Module):
    """Reads a property computed from its attributes."""

    def __init__(self, d, base=1.0):
        super().__init__()
        self.w, self.base = nn.Parameter(1 + 0.1 * torch.randn(d)), base

    @property
    def scale(self):
        return self.base * 2

    def forward(self, x):
        return torch.sigmoid(x * self.w * self.scale) * x


# module-level values the forwards below read
GLOBAL_SCALE = 1.0
HELPER_ACT = "gelu"
CHILD_APPROX = "none"


class GlobalScaled(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return torch.sigmoid(x * self.w * GLOBAL_SCALE) * x


class HelperGlobal(nn.Module):
    """Its forward calls a method of its own, which reads a global."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def _act(self, h):
        return F.gelu(h) if HELPER_ACT == "gelu" else F.silu(h)

    def forward(self, x):
        return self._act(x * self.w) + 1.0


class GlobalApproxGELU(nn.Module):
    """A child whose forward reads a global."""

    def forward(self, x):
        return F.gelu(x, approximate=CHILD_APPROX)


class Block(nn.Module):
    """A module calling its children: a norm and an activation (classes and attributes chosen by the builder)."""

    def __init__(self, d, norm, act):
        super().__init__()
        self.norm, self.act = norm, act

    def forward(self, x):
        return self.act(self.norm(x)) + 1.0


class HoldsTensor(nn.Module):
    """Holds a tensor as a plain attribute (not registered), and a float computed from its weight at __init__."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.table = torch.randn(d)
        self.mean = float(self.w.mean())

    def forward(self, x):
        return torch.sigmoid(x * self.w * self.mean) * x


class IntScaled(nn.Module):
    """Multiplies an integer tensor by a scale (an int or a float: the result's dtype follows it)."""

    def __init__(self, scale=2):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return (x * self.scale) + 1


class IntModel(nn.Module):
    def __init__(self, scale=2):
        super().__init__()
        self.a, self.b = IntScaled(scale), IntScaled(scale)

    def forward(self, x):
        y = self.a(x)
        return y, self.b(y * 3)


def helper_act(h):
    """A module-level function a forward calls (what a library patching a model rebinds)."""
    return F.gelu(h)


def _silu_helper(h):
    return F.silu(h)


class CallsHelper(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return helper_act(x * self.w) + 1.0


class OptionalBias(nn.Module):
    """A norm whose bias is optional (`register_parameter("bias", None)`), read where it is there."""

    def __init__(self, d, bias=False):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.bias = nn.Parameter(0.1 * torch.randn(d)) if bias else None

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return h + self.bias if self.bias is not None else h


class RegisteredNoneBias(OptionalBias):
    """`register_parameter("bias", None)` where it has none (what nn.LayerNorm(bias=False) does)."""

    def __init__(self, d, bias=False):
        super().__init__(d, bias)
        if not bias:
            del self.bias
            self.register_parameter("bias", None)


class OptionalAttr(nn.Module):
    """Reads an attribute it may not have (`getattr(self, "scale", 1.0)`)."""

    def __init__(self, d, scale=None):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))
        if scale is not None:
            self.scale = scale

    def forward(self, x):
        return torch.sigmoid(x * self.w * getattr(self, "scale", 1.0)) * x


class DefaultDtype(nn.Module):
    """Casts to the default dtype (`torch.get_default_dtype()`, read at each call)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return ((torch.sigmoid(x * self.w) * x).to(torch.get_default_dtype()) * 1.1).to(x.dtype)


# a module of constants the forward reads as `consts.SCALE` (`from . import constants`)
consts = types.ModuleType("install_near_miss_consts")
consts.SCALE = 1.0
sys.modules[consts.__name__] = consts


# a module of helpers the forward calls as `helpers.act(h)`, one of which reads a global of its own module
helpers = types.ModuleType("install_near_miss_helpers")
exec("""
import torch.nn.functional as F
APPROX = "none"


def act(h):
    return F.gelu(h, approximate=APPROX)


def silu(h):
    return F.silu(h)
""", helpers.__dict__)
sys.modules[helpers.__name__] = helpers


class CallsImportedHelper(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return helpers.act(x * self.w) + 1.0


class ParentReadsGlobal(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return torch.sigmoid(x * self.w * PARENT_SCALE) * x


class ChildCallsSuper(ParentReadsGlobal):
    def forward(self, x):
        return super().forward(x) + 1.0


PARENT_SCALE = 1.0


class ModuleConstant(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        return torch.sigmoid(x * self.w * consts.SCALE) * x


class UnregisteredActs(nn.Module):
    """Holds its activation modules in a plain list (not registered: no submodules)."""

    def __init__(self, d, act):
        super().__init__()
        self.w, self.acts = nn.Parameter(1 + 0.1 * torch.randn(d)), [act]

    def forward(self, x):
        return self.acts[0](x * self.w) + 1.0


class ConfigGetattr(nn.Module):
    """Reads a flag its config may not have (`getattr(config, "double", False)`)."""

    def __init__(self, d, config):
        super().__init__()
        self.w, self.config = nn.Parameter(1 + 0.1 * torch.randn(d)), config

    def forward(self, x):
        h = torch.sigmoid(x * self.w) * x
        return h * 2.0 if getattr(self.config, "double", False) else h


class GradBranch(nn.Module):
    """Branches on torch's grad mode (what a module that checkpoints or caches under grad only does)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        h = torch.sigmoid(x * self.w) * x
        return h * 2.0 if torch.is_grad_enabled() else h


class DefaultArg(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x, approximate="none"):
        return F.gelu(x * self.w, approximate=approximate) + 1.0


def _default_arg_redefined():
    """DefaultArg under the same module and name, its forward's default argument another."""
    ns: dict[str, Any] = {"__name__": __name__, "torch": torch, "nn": nn, "F": F}
    exec("""
class DefaultArg(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x, approximate="tanh"):
        return F.gelu(x * self.w, approximate=approximate) + 1.0
""", ns)
    return ns["DefaultArg"]


def _frozen(model):
    model.requires_grad_(False)


SETTINGS = SimpleNamespace(act="gelu")      # a module-level settings object
GLOBAL_ACT = functools.partial(F.gelu, approximate="none")   # a module-level partial
TABLE = torch.linspace(0.5, 1.5, 32)         # a module-level tensor


class GlobalObjects(nn.Module):
    """Reads a module-level settings object, calls a module-level partial, multiplies by a module-level tensor."""

    def __init__(self, d, what):
        super().__init__()
        self.w, self.what = nn.Parameter(1 + 0.1 * torch.randn(d)), what

    def forward(self, x):
        h = x * self.w
        if self.what == "settings":
            return (F.gelu(h) if SETTINGS.act == "gelu" else F.silu(h)) + 1.0
        if self.what == "partial":
            return GLOBAL_ACT(h) + 1.0
        return h * TABLE[: h.shape[-1]] + 1.0


# one model file, imported by the capture under engine.config's name for it and by the user's code as itself
_FILE = """
import torch
import torch.nn as nn

SCALE = 1.0


def act(h):
    return torch.sigmoid(h) * h


class FileNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight, self.eps, self.act = nn.Parameter(1 + 0.1 * torch.randn(d)), 1e-6, act

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.act(self.weight * h * SCALE)
"""


def _file_module(name):
    if name not in sys.modules:
        m = types.ModuleType(name)
        exec(compile(_FILE, f"{name}.py", "exec"), m.__dict__)
        sys.modules[name] = m
    return sys.modules[name]


# ---------------------------------------------------------------------------------------------------- builders


def stack(make: Callable[[int, int], nn.Module], dtype=torch.float32, post: Callable[[nn.Module], Any] | None = None):
    """(seed, g) -> a Stack of `make(d, i)` modules and its input."""
    def build(seed, g):
        d = _shapes(seed)[-1]
        torch.manual_seed(seed)
        model = Stack(d, lambda i: make(d, i)).to(dtype).eval()
        if post is not None:
            post(model)
        return model, _x(seed, g, dtype)
    return build


def inners(model):
    return [layer.inner for layer in model.layers]


def each(f):
    """A `post`/`after` applying `f` to each module under test."""
    def apply(model):
        for m in inners(model):
            f(m)
    return apply


def int_model(scale):
    def build(seed, g):
        torch.manual_seed(seed)
        return IntModel(scale).eval(), (torch.randint(-50, 50, _shapes(seed), generator=g),)
    return build


@contextlib.contextmanager
def setting(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name = value` (a class attribute, a module's global) while B is built, run and installed into."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _globals():
    import sys

    return sys.modules[__name__]


@dataclass
class Case:
    a: Callable[[int, Any], tuple]
    b: Callable[[int, Any], tuple]
    env: Callable[[], Any] = contextlib.nullcontext
    after: Callable[[nn.Module], Any] | None = None
    served: bool = False     # B is A: the cast must serve it
    mode: Callable[[], Any] = contextlib.nullcontext   # entered around each run of B (autocast, inference_mode)


def case(a, b=None, **kw):
    return Case(a, b if b is not None else a, **kw)


def _slots_config(act, scale):
    class SlotsConfig:
        __slots__ = ("act", "scale")

        def __init__(self, act, scale):
            self.act, self.scale = act, scale
    return SlotsConfig(act, scale)


class ClassDefaults:
    """A config whose values are class attributes (`cfg = ClassDefaults()`, or the class itself held as the config)."""

    act = "gelu"
    scale = 1.0


@dataclass(frozen=True, slots=True)
class FrozenSlots:
    act: str = "gelu"
    scale: float = 1.0


@dataclass(frozen=True)
class Frozen:
    act: str = "gelu"
    scale: float = 1.0


ActTuple = namedtuple("ActTuple", "act scale")


class Scaled:
    """An activation object: callable, with plain attributes (`self.act = Scaled(2.0)`)."""

    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return F.silu(x * self.k)


class GELUActivation(nn.Module):
    """transformers' GELUActivation: holds `self.act`, a bound method or a function, chosen at __init__."""

    def __init__(self, use_gelu_python=False):
        super().__init__()
        self.act = self._gelu_python if use_gelu_python else F.gelu

    def _gelu_python(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.4142135623730951))

    def forward(self, x):
        return self.act(x)


def _cfg(**kw):
    return SimpleNamespace(**{"act": "gelu", "scale": 1.0, **kw})


def config_act(make_config, path=""):
    return stack(lambda d, i: ConfigAct(d, make_config(), path))


def _held(act):
    return stack(lambda d, i: HeldAct(d, act))


def _block(norm, act, post=None):
    return stack(lambda d, i: Block(d, norm(d), act()), post=post)


def _redefined_norm():
    """A class of Norm's module and qualname, with other code (a notebook cell run again, a reloaded module)."""
    ns: dict[str, Any] = {"__name__": __name__, "torch": torch, "nn": nn}
    exec("""
class Norm(nn.Module):
    def __init__(self, d, eps=1e-6, scale=1.0):
        super().__init__()
        self.weight, self.eps, self.scale = nn.Parameter(1 + 0.1 * torch.randn(d)), eps, scale

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h * self.scale + 1.0
""", ns)
    cls = ns["Norm"]
    cls.__qualname__ = Norm.__qualname__
    return cls


def _subclass_named_norm():
    class Norm_(Norm):
        def forward(self, x):
            return super().forward(x) * 2.0
    Norm_.__name__ = "Norm"
    return Norm_


def _parametrized(model):
    import torch.nn.utils.parametrize as P

    class Double(nn.Module):
        def forward(self, w):
            return w * 2

    for m in inners(model):
        P.register_parametrization(m, "weight", Double())


def _tied(model):
    a, b = inners(model)
    b.weight = a.weight


def _as_buffer(model):
    for m in inners(model):
        w = m.weight.detach().clone()
        del m.weight
        m.register_buffer("weight", w)


def _load_other(model):
    sd = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(sd)


def _child_train(name):
    def f(model):
        for m in inners(model):
            getattr(m, name).train()
    return f


def _deepcopy_run(model):
    import copy

    return copy.deepcopy(model)


NORM = stack(lambda d, i: Norm(d))
CFG = config_act(_cfg)
GELU_BLOCK = _block(Norm, nn.GELU)

CASES: dict[str, Case] = {
    # ---- controls: B is A
    "control: norm": case(NORM, served=True),
    "control: held function": case(_held(F.gelu), served=True),
    "control: config": case(CFG, served=True),
    "control: function in a list": case(stack(lambda d, i: UnregisteredActs(d, F.gelu)), served=True),
    "control: module in a list": case(stack(lambda d, i: UnregisteredActs(d, nn.GELU())), served=True),
    "control: object config in a list": case(config_act(lambda: [_cfg()], "0"), served=True),
    "control: block": case(GELU_BLOCK, served=True),
    "control: class attribute": case(stack(lambda d, i: ClassScaled(d)), served=True),
    "control: global": case(stack(lambda d, i: GlobalScaled(d)), served=True),
    "control: installed in train mode, eval after": case(NORM, stack(lambda d, i: Norm(d), post=lambda m: m.train()),
                                                         after=lambda m: m.eval(), served=True),
    "control: block installed in train mode, eval after": case(
        GELU_BLOCK, _block(Norm, nn.GELU, post=lambda m: m.train()), after=lambda m: m.eval(), served=True),
    "control: the model's file imported by the capture as kforge_user_model_<stem>": case(
        stack(lambda d, i: _file_module("kforge_user_model_near_miss_file").FileNorm(d)),
        stack(lambda d, i: _file_module("near_miss_file").FileNorm(d)), served=True),
    "control: loaded with other values": case(NORM, stack(lambda d, i: Norm(d), post=_load_other), served=True),
    # ---- the module's own attributes
    "eps differs": case(NORM, stack(lambda d, i: Norm(d, eps=1e-2))),
    "scale int vs float": case(NORM, stack(lambda d, i: Norm(d, scale=1))),
    "eps set after install": case(NORM, after=each(lambda m: setattr(m, "eps", 1e-2))),
    "int scale 2 vs 2.0 (int input)": case(int_model(2), int_model(2.0)),
    "int scale set to 2.0 after install": case(int_model(2), after=lambda m: (setattr(m.a, "scale", 2.0),
                                                                              setattr(m.b, "scale", 2.0))),
    "property from attribute": case(stack(lambda d, i: PropertyScaled(d)), stack(lambda d, i: PropertyScaled(d, 3.0))),
    "enum mode": case(stack(lambda d, i: ModeAct(d, Mode.GELU)), stack(lambda d, i: ModeAct(d, Mode.SILU))),
    "frozenset mode": case(stack(lambda d, i: ModeAct(d, frozenset({"gelu"}))),
                           stack(lambda d, i: ModeAct(d, frozenset({"silu"})))),
    "set mode changed after install": case(stack(lambda d, i: ModeAct(d, {"gelu"})),
                                           after=each(lambda m: (m.mode.clear(), m.mode.add("silu")))),
    # ---- callables held as attributes
    "held function gelu vs silu": case(_held(F.gelu), _held(F.silu)),
    "held partial approximate": case(_held(functools.partial(F.gelu, approximate="none")),
                                     _held(functools.partial(F.gelu, approximate="tanh"))),
    "held lambda": case(_held(lambda x: x * torch.sigmoid(x)), _held(lambda x: x * torch.sigmoid(1.702 * x))),
    "held callable object": case(_held(Scaled(1.0)), _held(Scaled(2.0))),
    "held method of an unregistered module": case(stack(lambda d, i: HeldAct(d, nn.GELU().forward)),
                                                  stack(lambda d, i: HeldAct(d, nn.GELU("tanh").forward))),
    "held function set after install": case(_held(F.gelu), after=each(lambda m: setattr(m, "act", F.silu))),
    "held partial changed after install": case(
        stack(lambda d, i: HeldAct(d, functools.partial(F.gelu, approximate="none"))),
        after=each(lambda m: m.act.keywords.__setitem__("approximate", "tanh"))),
    "child with a bound-method activation": case(_block(Norm, GELUActivation),
                                                 _block(Norm, lambda: GELUActivation(True))),
    # ---- a config the module holds
    "config act": case(CFG, config_act(lambda: _cfg(act="silu"))),
    "nested config act": case(config_act(lambda: SimpleNamespace(text_config=_cfg()), "text_config"),
                              config_act(lambda: SimpleNamespace(text_config=_cfg(act="silu")), "text_config")),
    "nested config changed after install": case(
        config_act(lambda: SimpleNamespace(text_config=_cfg()), "text_config"),
        after=each(lambda m: setattr(m.config.text_config, "act", "silu"))),
    "slots config": case(config_act(lambda: _slots_config("gelu", 1.0)), config_act(lambda: _slots_config("silu", 1.0))),
    "slots config changed after install": case(config_act(lambda: _slots_config("gelu", 1.0)),
                                               after=each(lambda m: setattr(m.config, "act", "silu"))),
    "frozen slots dataclass": case(config_act(FrozenSlots), config_act(lambda: FrozenSlots(act="silu"))),
    "frozen dataclass": case(config_act(Frozen), config_act(lambda: Frozen(scale=2.0))),
    "namedtuple config": case(config_act(lambda: ActTuple("gelu", 1.0)), config_act(lambda: ActTuple("silu", 1.0))),
    "config values as class attributes of its class": case(config_act(ClassDefaults),
                                                           env=lambda: setting(ClassDefaults, "act", "silu")),
    "config is a class": case(config_act(lambda: ClassDefaults), env=lambda: setting(ClassDefaults, "act", "silu")),
    "dict config": case(stack(lambda d, i: ItemConfigAct(d, {"act": "gelu", "scale": 1.0})),
                        stack(lambda d, i: ItemConfigAct(d, {"act": "silu", "scale": 1.0}))),
    "config in a list": case(stack(lambda d, i: ItemConfigAct(d, [{"act": "gelu", "scale": 1.0}], "0")),
                             stack(lambda d, i: ItemConfigAct(d, [{"act": "silu", "scale": 1.0}], "0"))),
    "object config in a list": case(config_act(lambda: [_cfg()], "0"),
                                    config_act(lambda: [_cfg(act="silu")], "0")),
    # ---- class attributes and globals
    "class attribute SCALE": case(stack(lambda d, i: ClassScaled(d)),
                                  env=lambda: setting(ClassScaled, "SCALE", 2.0)),
    "class attribute ACT": case(stack(lambda d, i: ClassScaled(d)), env=lambda: setting(ClassScaled, "ACT", "silu")),
    "class attribute set after install": case(stack(lambda d, i: ClassScaled(d)),
                                              after=lambda m: setattr(ClassScaled, "SCALE", 3.0),
                                              env=lambda: setting(ClassScaled, "SCALE", 1.0)),
    "global read by forward": case(stack(lambda d, i: GlobalScaled(d)),
                                   env=lambda: setting(_globals(), "GLOBAL_SCALE", 2.0)),
    "global read by forward, set after install": case(
        stack(lambda d, i: GlobalScaled(d)), after=lambda m: setattr(_globals(), "GLOBAL_SCALE", 2.0),
        env=lambda: setting(_globals(), "GLOBAL_SCALE", 1.0)),
    "global read by a helper method": case(stack(lambda d, i: HelperGlobal(d)),
                                           env=lambda: setting(_globals(), "HELPER_ACT", "silu")),
    "global read by a helper method, set after install": case(
        stack(lambda d, i: HelperGlobal(d)), after=lambda m: setattr(_globals(), "HELPER_ACT", "silu"),
        env=lambda: setting(_globals(), "HELPER_ACT", "gelu")),
    "global read by a child's forward": case(_block(Norm, GlobalApproxGELU),
                                             env=lambda: setting(_globals(), "CHILD_APPROX", "tanh")),
    "global read by a child's forward, set after install": case(
        _block(Norm, GlobalApproxGELU), after=lambda m: setattr(_globals(), "CHILD_APPROX", "tanh"),
        env=lambda: setting(_globals(), "CHILD_APPROX", "none")),
    "config replaced after install": case(CFG, after=each(lambda m: setattr(m, "config", _cfg(act="silu")))),
    "global helper function rebound": case(stack(lambda d, i: CallsHelper(d)),
                                           env=lambda: setting(_globals(), "helper_act", _silu_helper)),
    "global helper function rebound after install": case(
        stack(lambda d, i: CallsHelper(d)), after=lambda m: setattr(_globals(), "helper_act", _silu_helper),
        env=lambda: setting(_globals(), "helper_act", helper_act)),
    "module-level settings object": case(stack(lambda d, i: GlobalObjects(d, "settings")),
                                         env=lambda: setting(SETTINGS, "act", "silu")),
    "module-level settings object changed after install": case(
        stack(lambda d, i: GlobalObjects(d, "settings")), after=lambda m: setattr(SETTINGS, "act", "silu"),
        env=lambda: setting(SETTINGS, "act", "gelu")),
    "module-level partial rebound": case(stack(lambda d, i: GlobalObjects(d, "partial")),
                                         env=lambda: setting(_globals(), "GLOBAL_ACT",
                                                             functools.partial(F.gelu, approximate="tanh"))),
    "module-level tensor of other values": case(stack(lambda d, i: GlobalObjects(d, "tensor")),
                                                env=lambda: setting(_globals(), "TABLE", torch.linspace(1, 2, 32))),
    "default dtype": case(stack(lambda d, i: DefaultDtype(d)),
                          env=lambda: _default_dtype(torch.float64)),
    "constant of an imported module": case(stack(lambda d, i: ModuleConstant(d)),
                                           env=lambda: setting(consts, "SCALE", 2.0)),
    "constant of an imported module set after install": case(
        stack(lambda d, i: ModuleConstant(d)), after=lambda m: setattr(consts, "SCALE", 2.0),
        env=lambda: setting(consts, "SCALE", 1.0)),
    "global of a helper in an imported module": case(stack(lambda d, i: CallsImportedHelper(d)),
                                                     env=lambda: setting(helpers, "APPROX", "tanh")),
    "helper in an imported module rebound": case(stack(lambda d, i: CallsImportedHelper(d)),
                                                 env=lambda: setting(helpers, "act", helpers.silu)),
    "helper in an imported module rebound after install": case(
        stack(lambda d, i: CallsImportedHelper(d)), after=lambda m: setattr(helpers, "act", helpers.silu),
        env=lambda: setting(helpers, "act", helpers.act)),
    "global read by the parent class's forward (super().forward)": case(
        stack(lambda d, i: ChildCallsSuper(d)), env=lambda: setting(_globals(), "PARENT_SCALE", 2.0)),
    "global read by the parent class's forward, set after install": case(
        stack(lambda d, i: ChildCallsSuper(d)), after=lambda m: setattr(_globals(), "PARENT_SCALE", 2.0),
        env=lambda: setting(_globals(), "PARENT_SCALE", 1.0)),
    "unregistered module in a list": case(stack(lambda d, i: UnregisteredActs(d, nn.GELU())),
                                          stack(lambda d, i: UnregisteredActs(d, nn.GELU("tanh")))),
    # ---- what a held container holds, changed after install (each caught at install where B is built so)
    "function in a list replaced after install": case(stack(lambda d, i: UnregisteredActs(d, F.gelu)),
                                                      after=each(lambda m: m.acts.__setitem__(0, F.silu))),
    "module in a list replaced after install": case(stack(lambda d, i: UnregisteredActs(d, nn.GELU())),
                                                    after=each(lambda m: m.acts.__setitem__(0, nn.GELU("tanh")))),
    "module in a list changed after install": case(stack(lambda d, i: UnregisteredActs(d, nn.GELU())),
                                                   after=each(lambda m: setattr(m.acts[0], "approximate", "tanh"))),
    "dict config changed after install": case(stack(lambda d, i: ItemConfigAct(d, {"act": "gelu", "scale": 1.0})),
                                              after=each(lambda m: m.config.__setitem__("act", "silu"))),
    "dict config in a list changed after install": case(
        stack(lambda d, i: ItemConfigAct(d, [{"act": "gelu", "scale": 1.0}], "0")),
        after=each(lambda m: m.config[0].__setitem__("scale", 2.0))),
    "object config in a list changed after install": case(config_act(lambda: [_cfg()], "0"),
                                                          after=each(lambda m: setattr(m.config[0], "act", "silu"))),
    "object config in a list replaced after install": case(
        config_act(lambda: [_cfg()], "0"), after=each(lambda m: m.config.__setitem__(0, _cfg(act="silu")))),
    "config replaced by a copy after install, then changed": case(
        CFG, after=each(lambda m: (setattr(m, "config", copy.copy(m.config)), setattr(m.config, "act", "silu")))),
    "list replaced by a copy after install, then changed": case(
        stack(lambda d, i: UnregisteredActs(d, F.gelu)),
        after=each(lambda m: (setattr(m, "acts", list(m.acts)), m.acts.__setitem__(0, F.silu)))),
    "config flag read with getattr, present": case(stack(lambda d, i: ConfigGetattr(d, SimpleNamespace())),
                                                   stack(lambda d, i: ConfigGetattr(d, SimpleNamespace(double=True)))),
    "config flag read with getattr, set after install": case(
        stack(lambda d, i: ConfigGetattr(d, SimpleNamespace(other=1))),
        after=each(lambda m: setattr(m.config, "double", True))),
    # ---- optional parameters and attributes
    "optional bias present": case(stack(lambda d, i: OptionalBias(d)), stack(lambda d, i: OptionalBias(d, True))),
    "optional bias set after install": case(stack(lambda d, i: OptionalBias(d)),
                                            after=each(lambda m: setattr(m, "bias", nn.Parameter(torch.ones_like(
                                                m.weight))))),
    "registered None bias present": case(stack(lambda d, i: RegisteredNoneBias(d)),
                                         stack(lambda d, i: RegisteredNoneBias(d, True))),
    "registered None bias set after install": case(stack(lambda d, i: RegisteredNoneBias(d)),
                                                   after=each(lambda m: setattr(m, "bias", nn.Parameter(
                                                       torch.ones_like(m.weight))))),
    "optional attribute present": case(stack(lambda d, i: OptionalAttr(d)), stack(lambda d, i: OptionalAttr(d, 2.0))),
    "optional attribute set after install": case(stack(lambda d, i: OptionalAttr(d)),
                                                 after=each(lambda m: setattr(m, "scale", 2.0))),
    "attribute deleted after install": case(stack(lambda d, i: OptionalAttr(d, 2.0)),
                                            after=each(lambda m: delattr(m, "scale"))),
    # ---- children
    "child class swapped": case(GELU_BLOCK, _block(Norm, nn.SiLU)),
    "child attribute": case(GELU_BLOCK, _block(Norm, lambda: nn.GELU("tanh"))),
    "child eps": case(GELU_BLOCK, _block(lambda d: Norm(d, eps=1e-2), nn.GELU)),
    "child eps set after install": case(GELU_BLOCK, after=each(lambda m: setattr(m.norm, "eps", 1e-2))),
    "child dropout in train mode": case(_block(Norm, lambda: nn.Dropout(0.5)),
                                        _block(Norm, lambda: nn.Dropout(0.5), post=_child_train("act"))),
    "child dropout set to train after install": case(_block(Norm, lambda: nn.Dropout(0.5)),
                                                     after=_child_train("act")),
    "child removed (Identity)": case(GELU_BLOCK, _block(Norm, nn.Identity)),
    "child swapped after install": case(GELU_BLOCK, after=each(lambda m: setattr(m, "act", nn.SiLU()))),
    # ---- the class
    "subclass of the proven class, same name": case(NORM, stack(lambda d, i: _subclass_named_norm()(d))),
    "class redefined, same module and qualname": case(NORM, stack(lambda d, i: _redefined_norm()(d))),
    "forward default argument of a redefined class": case(stack(lambda d, i: DefaultArg(d)),
                                                          stack(lambda d, i: _default_arg_redefined()(d))),
    "forward default argument changed on the class": case(
        stack(lambda d, i: DefaultArg(d)), env=lambda: setting(DefaultArg.forward, "__defaults__", ("tanh",))),
    "grad enabled, every parameter frozen, control": case(stack(lambda d, i: Norm(d), post=_frozen),
                                                          mode=torch.enable_grad, served=True),
    # ---- torch's modes
    "grad enabled, every parameter frozen": case(stack(lambda d, i: GradBranch(d)),
                                                 stack(lambda d, i: GradBranch(d), post=_frozen),
                                                 mode=torch.enable_grad),
    # ---- parameters
    "load_state_dict after install": case(NORM, after=_load_other),
    "parametrized weight": case(NORM, stack(lambda d, i: Norm(d), post=_parametrized)),
    "parametrized after install": case(NORM, after=_parametrized),
    "tied weight": case(NORM, stack(lambda d, i: Norm(d), post=_tied)),
    "weight as buffer": case(NORM, stack(lambda d, i: Norm(d), post=_as_buffer)),
    "weight norm after install": case(NORM, after=each(lambda m: torch.nn.utils.weight_norm(m, "weight", dim=0))),
    "unregistered tensor attribute and float of weight": case(
        stack(lambda d, i: HoldsTensor(d)), stack(lambda d, i: HoldsTensor(d), post=_load_other)),
    # ---- dtype, mode, layout
    "built in bf16": case(NORM, stack(lambda d, i: Norm(d), torch.bfloat16)),
    "module under test half after install": case(NORM, after=each(lambda m: m.half())),
    "train mode": case(NORM, stack(lambda d, i: Norm(d), post=lambda m: m.train())),
    "train after install": case(NORM, after=lambda m: m.train()),
    "weights requiring grad after install": case(NORM, after=lambda m: m.requires_grad_(True),
                                                 mode=torch.enable_grad),
    "deepcopy after install": case(NORM, after=_deepcopy_run),
    "autocast bf16": case(NORM, mode=lambda: torch.autocast("cpu", torch.bfloat16)),
    "inference_mode": case(NORM, mode=torch.inference_mode, served=True),
}
