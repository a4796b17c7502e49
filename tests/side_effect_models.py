"""Small models whose module forwards compute a memory-bound chain (a sigmoid gate, a norm) and do something else
besides returning it: write a global, a class attribute, a closure cell, a container or an object they hold, a tensor
in place, a buffer; draw random numbers or seed the generator; read values on the host and branch on them; print, warn
or log; register hooks or buffers, initialise lazily, or count their calls. The side-effect sweep
(tests/test_side_effect_sweep.py, scripts/side_effect_sweep.py) captures each, installs every module card it binds
with eager as the plan, runs the model for several calls with and without the cast, and compares the outputs and the
effect's state afterwards (`Case.probe`, the generators' states, what was printed, warned and logged).

`CASES[name](seed)` is a `Case`: the model (a `Stack` of two `Layer`s from tests/module_return_models.py, each a
Linear, the module under test and another Linear, unless said otherwise), the arguments of each call, and the probe.
A builder resets the module-level state its case writes, so every build starts alike. `LEGIT` names the controls:
forwards without side effects (or whose effect the cast keeps) whose module card must bind and be served."""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import os
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import side_effect_helpers
import torch
import torch.nn as nn
import torch.nn.functional as F
from module_return_models import RMS, Stack, _shapes

LOG = logging.getLogger("kforge.side_effect_models")


@dataclass
class Case:
    model: nn.Module
    calls: list[tuple]                                   # the arguments of each call, in order
    probe: Callable[[nn.Module], Any] = lambda m: None   # the effect's state after the calls
    before: Callable[[nn.Module, int], None] = lambda m, k: None  # what the caller does before call k (both runs)
    notes: dict[str, Any] = field(default_factory=dict)


def gate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * w) * x


class Gated(nn.Module):
    """The plain gate every case's module computes (the control): `sigmoid(x * w) * x`."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return gate(x, self.w)


Dims = collections.namedtuple("Dims", "d half")


class HoldsValues(Gated):
    """Holds a named tuple, a large list and a frozen set it never writes (a control: nothing changes)."""

    def __init__(self, d):
        super().__init__(d)
        self.dims, self.table, self.kinds = Dims(d, d // 2), list(range(1000)), frozenset({"a", "b"})

    def forward(self, x):
        return gate(x, self.w)


def _passes(fn):
    """A decorator of the model's own that changes nothing (`functools.wraps`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class Decorated(Gated):
    """A forward under decorators: torch.no_grad() and one of its module's own (controls)."""

    @torch.no_grad()
    @_passes
    def forward(self, x):
        return gate(x, self.w)


# ------------------------------------------------------------------------------ globals, class attributes, closures

CALLS = 0
CACHE: dict = {}
SEEN: list = []
FLAGS = SimpleNamespace(calls=0, record=False)


def _record(y):
    SEEN.append(tuple(y.shape))


def reset_globals() -> None:
    global CALLS
    CALLS = 0
    CACHE.clear()
    SEEN.clear()
    FLAGS.calls = 0
    ClassCounter.calls = 0
    NamedClassCounter.calls = 0
    SharedCache.cache = {}
    LazyClassTable.table = None
    ClassList.log = []
    RecordsWhenAsked.record, RecordsWhenAsked.log, FLAGS.record = False, [], False
    global RECORD
    RECORD = False
    side_effect_helpers.TICKS = 0
    side_effect_helpers.FAST = False
    SIZES.clear()
    side_effect_helpers.SCALE = 1.0
    global SCALE
    SCALE = 1.0
    os.environ.pop("KFORGE_SIDE_EFFECT_SCALE", None)
    torch.set_default_dtype(torch.float32)
    side_effect_helpers.COUNTS.clear()


class GlobalCounter(Gated):
    def forward(self, x):
        global CALLS
        CALLS += 1
        return gate(x, self.w)


class GlobalCache(Gated):
    def forward(self, x):
        y = gate(x, self.w)
        CACHE[len(CACHE)] = y
        return y


class GlobalList(Gated):
    def forward(self, x):
        SEEN.append(x.shape[-1])
        return gate(x, self.w)


class GlobalHelper(Gated):
    """Writes a global through a function it calls."""

    def forward(self, x):
        y = gate(x, self.w)
        _record(y)
        return y


class GlobalObject(Gated):
    """Counts in a module-level object (`FLAGS.calls += 1`)."""

    def forward(self, x):
        FLAGS.calls += 1
        return gate(x, self.w)


class ClassCounter(Gated):
    calls = 0

    def forward(self, x):
        type(self).calls += 1
        return gate(x, self.w)


class NamedClassCounter(Gated):
    calls = 0

    def forward(self, x):
        NamedClassCounter.calls += 1
        return gate(x, self.w)


class SharedCache(Gated):
    """A cache shared by every instance, on the class: what one instance's forward leaves, another reads."""

    cache: dict = {}

    def forward(self, x):
        y = gate(x, self.w)
        type(self).cache[len(type(self).cache)] = y.sum().detach()
        return y


class LazyClassTable(Gated):
    """Builds a table on the class at the first call of any instance (a lazily made cache)."""

    table = None

    def forward(self, x):
        if LazyClassTable.table is None:
            LazyClassTable.table = [x.shape[-1]] * 3
        return gate(x, self.w)


class ClassList(Gated):
    """Appends to a list on its class (no attribute set: the list is written in place)."""

    log: list = []

    def forward(self, x):
        type(self).log.append(x.shape[-1])
        return gate(x, self.w)


class GlobalByMethod(Gated):
    """Counts in a global through a method of its own."""

    def count(self):
        global CALLS
        CALLS += 1

    def forward(self, x):
        self.count()
        return gate(x, self.w)


class SeedsByMethod(Gated):
    """Seeds torch's generator through a method of a helper object it holds, with another seed at each call."""

    def __init__(self, d):
        super().__init__(d)
        self.seeder = SimpleNamespace(step=lambda: torch.manual_seed(torch.initial_seed() + 1))

    def forward(self, x):
        self.seeder.step()
        return gate(x, self.w)


class EveryFifth(Gated):
    """Doubles its output at every fifth call (after the capture's four), counted in another module's namespace
    (`side_effect_helpers.tick()`)."""

    def forward(self, x):
        y = gate(x, self.w)
        return y * 2.0 if side_effect_helpers.tick() % 5 == 0 else y * 1.0


class CountsElsewhere(Gated):
    """Counts its calls in a dict of another module, through a function of that module."""

    def forward(self, x):
        side_effect_helpers.count("gate")
        return gate(x, self.w)


class PrintingChild(Gated):
    def forward(self, x):
        print("child", tuple(x.shape))
        return gate(x, self.w)


class Block(nn.Module):
    """Only calls its child (whose forward does something else): the block's chain is the child's."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(x) * 1.0


class SetsDefaultDtype(Gated):
    """Sets torch's default dtype in its forward (and computes in float32 as before)."""

    def forward(self, x):
        torch.set_default_dtype(torch.float64)
        return gate(x, self.w)


class SetsModuleFlag(Gated):
    """Sets a flag of a module it imports (`side_effect_helpers.FAST = True`, as `torch.backends.x.y = True` does)."""

    def forward(self, x):
        side_effect_helpers.FAST = True
        return gate(x, self.w)


class CallsHeld(Gated):
    """Calls a function it holds on its output: `print`, a partial of a logger's method, a lambda that warns."""

    def __init__(self, d, how):
        super().__init__(d)
        self.report = {"print": print, "partial": functools.partial(LOG.warning, "gate %s"),
                       "lambda": lambda y: warnings.warn("gate", stacklevel=1)}[how]

    def forward(self, x):
        y = gate(x, self.w)
        self.report(tuple(y.shape))
        return y


class OutArgument(Gated):
    """Computes into a buffer it holds (`out=self.buf`), then from it."""

    def __init__(self, d):
        super().__init__(d)
        self.register_buffer("buf", torch.zeros(*_shapes_for(d)))

    def forward(self, x):
        torch.sigmoid(x * self.w, out=self.buf)
        return self.buf * x


class RecordsWhenAsked(Gated):
    """Appends to a log when a flag says so: on its class (`RecordsWhenAsked.record`), on a module-level object
    (`FLAGS.record`) or a module-level name (`RECORD`). The flag is off while the capture runs; the caller sets it
    before the third call."""

    record = False
    log: list = []

    def __init__(self, d, where):
        super().__init__(d)
        self.where = where

    def forward(self, x):
        on = {"class": lambda: type(self).record, "object": lambda: FLAGS.record, "global": lambda: RECORD}[self.where]
        if on():
            type(self).log.append(x.shape[-1])
        return gate(x, self.w)


def _flag_on(where):
    def before(m, k):
        global RECORD
        if k == 2:
            if where == "class":
                RecordsWhenAsked.record = True
            elif where == "object":
                FLAGS.record = True
            else:
                RECORD = True
    return before


RECORD = False


class InList(Gated):
    """Counts in an object (or a module) it keeps in a list (`self.trackers[0].calls += 1`)."""

    def __init__(self, d, what):
        super().__init__(d)
        t = nn.Identity() if what == "module" else SimpleNamespace()
        t.calls = 0
        self.trackers = [t]

    def forward(self, x):
        self.trackers[0].calls += 1
        return gate(x, self.w)


class TagsWeight(Gated):
    """Counts its calls on its parameter's Python attributes (`self.w.calls += 1`)."""

    def __init__(self, d):
        super().__init__(d)
        self.w.calls = 0

    def forward(self, x):
        self.w.calls += 1
        return gate(x, self.w)


class CountingProperty(Gated):
    """Reads a property whose getter counts in a global."""

    @property
    def scale(self):
        global CALLS
        CALLS += 1
        return 1.0

    def forward(self, x):
        return gate(x, self.w) * self.scale


class WritesFile(Gated):
    """Appends a line to a file at each call."""

    def __init__(self, d, path):
        super().__init__(d)
        self.path = path

    def forward(self, x):
        with open(self.path, "a") as f:
            f.write(f"{tuple(x.shape)}\n")
        return gate(x, self.w)


SCALE = 1.0


class ReadsEnvironment(Gated):
    """Scales its output by a value read at each call from the environment (the caller changes it before the third
    call); ReadsHelper from another module's function (`side_effect_helpers.scale()`), ReadsByMethod from a
    module-level value a method of its own reads."""

    def forward(self, x):
        return gate(x, self.w) * (2.0 if os.environ.get("KFORGE_SIDE_EFFECT_SCALE") == "2" else 1.0)


class ReadsHelper(Gated):
    def forward(self, x):
        return gate(x, self.w) * side_effect_helpers.scale()


class ReadsByMethod(Gated):
    def _scale(self):
        return SCALE

    def forward(self, x):
        return gate(x, self.w) * self._scale()


def _scale_later(where):
    def before(m, k):
        global SCALE
        if k == 2:
            if where == "environment":
                os.environ["KFORGE_SIDE_EFFECT_SCALE"] = "2"
            elif where == "helper":
                side_effect_helpers.SCALE = 2.0
            else:
                SCALE = 2.0
    return before


HANDLERS = {"record": _record}


class ByTable(Gated):
    """Calls a function from a module-level table of functions (`HANDLERS["record"](y)`, which appends to SEEN)."""

    def forward(self, x):
        y = gate(x, self.w)
        HANDLERS["record"](y)
        return y


class ByStatic(Gated):
    """Counts in a global through a static method of its own."""

    @staticmethod
    def count():
        global CALLS
        CALLS += 1

    def forward(self, x):
        type(self).count()
        return gate(x, self.w)


class ByHeldTable(Gated):
    """Calls a function it keeps in a dict (`self.fns["say"](...)`, `print`)."""

    def __init__(self, d):
        super().__init__(d)
        self.fns = {"say": print}

    def forward(self, x):
        self.fns["say"]("gate", tuple(x.shape))
        return gate(x, self.w)


class CountsOnOwner(Gated):
    """Counts its calls on a module it keeps outside its submodules (`object.__setattr__(self, "owner", parent)`)."""

    def forward(self, x):
        self.owner.calls += 1
        return gate(x, self.w)


def _owner_case(seed):
    case = stack(lambda d, i: CountsOnOwner(d))(seed)
    for layer in case.model.layers:
        layer.calls = 0
        object.__setattr__(layer.inner, "owner", layer)
    case.probe = lambda m: [layer.calls for layer in m.layers]
    return case


class NumpyCounts(Gated):
    """Counts its calls in a numpy array it holds, in place."""

    def __init__(self, d):
        import numpy as np

        super().__init__(d)
        self.hist = np.zeros(4, dtype=np.int64)

    def forward(self, x):
        self.hist[x.dim()] += 1
        return gate(x, self.w)


SIZES: dict = {}


class LazyGlobalCache(Gated):
    """Fills a module-level cache at the first call with each size (`if n not in SIZES: SIZES[n] = ...`)."""

    def forward(self, x):
        n = x.shape[-1]
        if n not in SIZES:
            SIZES[n] = n // 2
        return gate(x, self.w)


class LazyOwnCache(Gated):
    """Fills a dict it holds at the first call with each size (`self.sizes[n] = ...`, int keys)."""

    def __init__(self, d):
        super().__init__(d)
        self.sizes = {}

    def forward(self, x):
        n = x.shape[-1]
        if n not in self.sizes:
            self.sizes[n] = n // 2
        return gate(x, self.w)


class Sampler:
    """A helper object with methods that draw from Python's random or count in a global."""

    def draw(self):
        return random.random() < 2.0

    def count(self):
        global CALLS
        CALLS += 1


class UsesHelper(Gated):
    """Calls a method of a helper object it holds (`self.helper.draw()`)."""

    def __init__(self, d):
        super().__init__(d)
        self.helper = Sampler()

    def forward(self, x):
        self.helper.draw()
        return gate(x, self.w)


class CountsWithHelper(UsesHelper):
    def forward(self, x):
        self.helper.count()
        return gate(x, self.w)


def _file_case(seed):
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"kforge-side-effect-{os.getpid()}-{seed}.log")
    open(path, "w").close()  # each build starts with an empty file (the same path: a plain attribute the install holds)
    case = stack(lambda d, i: WritesFile(d, path))(seed)
    case.probe = lambda m: open(path).read().count("\n")
    return case


class ParamThroughView(Gated):
    """Writes one element of its weight through a view, then computes with it."""

    def forward(self, x):
        self.w[0] = 1.0
        return gate(x, self.w)


class ClampsWeight(Gated):
    """A max-norm constraint: clamps its weight in place at each call."""

    def forward(self, x):
        self.w.data.clamp_(-0.5, 0.5)
        return gate(x, self.w)


class TagsInput(Gated):
    """Sets a Python attribute on its input tensor (the caller reads it)."""

    def forward(self, x):
        x.seen_by_gate = True
        return gate(x, self.w)


class ReadsTag(nn.Module):
    """A Linear, then a TagsInput; doubles the result where the tensor it passed came back tagged."""

    def __init__(self, d):
        super().__init__()
        self.lin, self.inner = nn.Linear(d, d), TagsInput(d)

    def forward(self, x):
        h = self.lin(x)
        y = self.inner(h)
        return y * (2.0 if getattr(h, "seen_by_gate", False) else 1.0)


def closure_counter_class() -> tuple[type, Callable[[], int]]:
    """A module class whose forward counts its calls in a closure cell (`nonlocal`), and a reader of the count."""
    count = 0

    class ClosureCounter(Gated):
        def forward(self, x):
            nonlocal count
            count += 1
            return gate(x, self.w)

    return ClosureCounter, lambda: count


def make_ticker() -> Callable[[], int]:
    n = [0]

    def tick():
        n[0] += 1
        return n[0]
    tick.n = n
    return tick


class HeldFunction(Gated):
    """Calls a function it holds, which counts in its closure."""

    def __init__(self, d):
        super().__init__(d)
        self.tick = make_ticker()

    def forward(self, x):
        self.tick()
        return gate(x, self.w)


# ----------------------------------------------------------------------------------- objects and containers it holds


class NestedHeld(Gated):
    """`self.state.inner.calls += 1`: a counter two objects down."""

    def __init__(self, d):
        super().__init__(d)
        self.state = SimpleNamespace(inner=SimpleNamespace(calls=0))

    def forward(self, x):
        self.state.inner.calls += 1
        return gate(x, self.w)


class HeldDict(Gated):
    def __init__(self, d):
        super().__init__(d)
        self.stats = SimpleNamespace(counts={"calls": 0})

    def forward(self, x):
        self.stats.counts["calls"] += 1
        return gate(x, self.w)


class HeldList(Gated):
    def __init__(self, d):
        super().__init__(d)
        self.stats = SimpleNamespace(seen=[])

    def forward(self, x):
        self.stats.seen.append(x.shape[-1])
        return gate(x, self.w)


class Container(Gated):
    """Writes a container it holds: `kind` is defaultdict, set, deque, Counter, OrderedDict, or dict-in-list."""

    def __init__(self, d, kind):
        super().__init__(d)
        self.kind = kind
        self.box = {"defaultdict": lambda: collections.defaultdict(int), "set": set,
                    "deque": lambda: collections.deque(maxlen=8), "Counter": collections.Counter,
                    "OrderedDict": collections.OrderedDict, "dict in list": lambda: [{"n": 0}],
                    "bytearray": bytearray}[kind]()

    def forward(self, x):
        n = x.shape[-1]
        if self.kind in ("defaultdict", "Counter"):
            self.box["calls"] += 1
        elif self.kind == "set":
            self.box.add(len(self.box))
        elif self.kind == "deque":
            self.box.append(n)
        elif self.kind == "OrderedDict":
            self.box[len(self.box)] = n
        elif self.kind == "dict in list":
            self.box[0]["n"] += 1
        else:
            self.box.append(n % 256)
        return gate(x, self.w)


class Iterates(Gated):
    """Advances an iterator it holds at each call (`next(self.steps)`)."""

    def __init__(self, d):
        super().__init__(d)
        self.steps = itertools.count()

    def forward(self, x):
        next(self.steps)
        return gate(x, self.w)


class ChildCounter(nn.Module):
    """Counts its calls on a child module (`self.inner.calls += 1`): the child's attribute, not its own."""

    def __init__(self, d):
        super().__init__()
        self.inner = Gated(d)
        self.inner.calls = 0

    def forward(self, x):
        self.inner.calls += 1
        return gate(x, self.inner.w)


class ChildSwapped(nn.Module):
    """Replaces its activation child after the first call (`self.act = nn.Identity()`)."""

    def __init__(self, d):
        super().__init__()
        self.w, self.act = nn.Parameter(torch.randn(d)), nn.Sigmoid()

    def forward(self, x):
        y = self.act(x * self.w) * x
        self.act = nn.Tanh()
        return y


# ------------------------------------------------------------------------------------------ tensors written in place


class TensorAttrInPlace(nn.Module):
    """An exponential average in an unregistered tensor, updated in place, then read by the output."""

    def __init__(self, d):
        super().__init__()
        self.w, self.avg = nn.Parameter(torch.randn(d)), torch.zeros(d)

    def forward(self, x):
        self.avg.mul_(0.9).add_(x.mean(dim=(0, 1)), alpha=0.1)
        return gate(x, self.w) * self.avg


class BufferInPlace(nn.Module):
    """The same in a registered buffer (a running statistic)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.register_buffer("avg", torch.zeros(d))

    def forward(self, x):
        self.avg.mul_(0.9).add_(x.mean(dim=(0, 1)), alpha=0.1)
        return gate(x, self.w) * self.avg


class BufferStatOnly(nn.Module):
    """Updates a running statistic it does not read (what the caller reads afterwards)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.register_buffer("total", torch.zeros(()))

    def forward(self, x):
        y = gate(x, self.w)
        self.total.add_(y.sum())
        return y


class BufferCopy(nn.Module):
    """Keeps its input in a buffer (`self.buf.copy_(x)`) and computes from the buffer."""

    def __init__(self, d, how):
        super().__init__()
        self.w, self.how = nn.Parameter(torch.randn(d)), how
        self.register_buffer("buf", torch.zeros(*_shapes_for(d)))

    def forward(self, x):
        if self.how == "copy_":
            self.buf.copy_(x)
        elif self.how == "slice":
            self.buf[:] = x
        else:  # .data
            self.buf.data = x.clone()
        return gate(self.buf, self.w)


def _shapes_for(d):
    return next(s for s in ((2, 5, 32), (1, 3, 16), (3, 4, 24)) if s[-1] == d)


class BufferReassigned(nn.Module):
    """Keeps its output in a registered buffer, reassigned (`self.last = y` where `last` is a buffer)."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))
        self.register_buffer("last", torch.zeros(0), persistent=False)

    def forward(self, x):
        y = gate(x, self.w)
        self.last = y
        return y


class WritesInput(nn.Module):
    """Adds to its input in place and returns a gate of it."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        x.add_(1.0)
        return gate(x, self.w)


class TrainBatchNorm(nn.Module):
    """A BatchNorm over the features, then a gate: in train mode its running statistics move at each call."""

    def __init__(self, d):
        super().__init__()
        self.bn, self.w = nn.BatchNorm1d(d), nn.Parameter(torch.randn(d))

    def forward(self, x):
        h = self.bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)
        return gate(h, self.w)


# ------------------------------------------------------------------------------------------------------ randomness


class Dropout(Gated):
    def forward(self, x):
        return F.dropout(gate(x, self.w), 0.2, self.training)


class Noise(Gated):
    def forward(self, x):
        return gate(x + 0.1 * torch.randn_like(x), self.w)


class SeedsTorch(Gated):
    """Seeds torch's generators in its forward (and draws nothing)."""

    def forward(self, x):
        torch.manual_seed(1234)
        return gate(x, self.w)


class SeedsGenerator(Gated):
    def forward(self, x):
        torch.default_generator.manual_seed(99)
        return gate(x, self.w)


class HeldGenerator(Gated):
    """Draws noise from a generator it holds."""

    def __init__(self, d):
        super().__init__(d)
        self.g = torch.Generator().manual_seed(7)

    def forward(self, x):
        return gate(x + 0.1 * torch.randn(x.shape, generator=self.g), self.w)


class LayerDrop(Gated):
    """Skips the gate now and then in train mode, drawing from Python's random."""

    def forward(self, x):
        if self.training and random.random() < 0.3:
            return x * 1.0
        return gate(x, self.w)


class DrawsPython(Gated):
    """Draws from Python's random and discards the number."""

    def forward(self, x):
        random.random()
        return gate(x, self.w)


class HeldPythonGenerator(Gated):
    """Draws from a `random.Random` it holds."""

    def __init__(self, d):
        super().__init__(d)
        self.rng = random.Random(3)

    def forward(self, x):
        self.rng.uniform(0.0, 1.0)
        return gate(x, self.w)


# ------------------------------------------------------------------------------------ host reads and control flow


class HostBranch(Gated):
    """Branches on a value read on the host: the input's sign (the calls alternate it)."""

    def __init__(self, d, how):
        super().__init__(d)
        self.how = how

    def forward(self, x):
        s = x.sum()
        positive = {
            ".item()": lambda: s.item() > 0,
            ".tolist()": lambda: s.tolist() > 0,
            ".numpy()": lambda: s.detach().numpy() > 0,
            "bool(t)": lambda: bool(s > 0),
            "if t > 0": lambda: s > 0,
            "float(t)": lambda: float(s) > 0,
            "int(t)": lambda: int(s > 0) == 1,
            "torch.equal": lambda: not torch.equal(torch.sign(s), -torch.ones(())),
            "torch.all": lambda: torch.all(x.sum(-1) > -1e9),
        }[self.how]()
        return gate(x, self.w) if positive else gate(x, -self.w)


class Nonzero(Gated):
    def forward(self, x):
        idx = torch.nonzero(x[..., 0] > 0)
        return gate(x, self.w) + idx.shape[0]


class Asserts(Gated):
    def forward(self, x):
        torch._assert(torch.isfinite(x).all(), "non-finite input")
        return gate(x, self.w)


class Prints(Gated):
    def forward(self, x):
        print("gate", tuple(x.shape))
        return gate(x, self.w)


class Warns(Gated):
    def forward(self, x):
        warnings.warn(f"gate called on {tuple(x.shape)}", stacklevel=2)
        return gate(x, self.w)


class Logs(Gated):
    def forward(self, x):
        LOG.warning("gate called on %s", tuple(x.shape))
        return gate(x, self.w)


# ---------------------------------------------------------------------------------- hooks, lazy state, call counts


class HooksItself(Gated):
    """Registers a forward hook on itself at its first call (the hook doubles the output)."""

    def forward(self, x):
        if not self._forward_hooks:
            self.register_forward_hook(lambda m, a, out: out * 2)
        return gate(x, self.w)


class HooksItselfFlag(Gated):
    """The same, remembering it in a flag."""

    def __init__(self, d):
        super().__init__(d)
        self.hooked = False

    def forward(self, x):
        if not self.hooked:
            self.register_forward_hook(lambda m, a, out: out * 2)
            self.hooked = True
        return gate(x, self.w)


class LazyBuffer(nn.Module):
    """Registers a buffer at its first call (a lazily made scale) and multiplies by it."""

    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d))

    def forward(self, x):
        if not hasattr(self, "scale"):
            self.register_buffer("scale", torch.full((x.shape[-1],), 0.5))
        return gate(x, self.w) * self.scale


class LazyAttr(Gated):
    """Sets a plain attribute at its first call (`if self.size is None: self.size = ...`)."""

    def __init__(self, d):
        super().__init__(d)
        self.size = None

    def forward(self, x):
        if self.size is None:
            self.size = x.shape[-1]
        return gate(x, self.w)


class EveryOther(Gated):
    """Counts its calls and scales the output on every other one."""

    def __init__(self, d):
        super().__init__(d)
        self.step = 0

    def forward(self, x):
        self.step += 1
        y = gate(x, self.w)
        return y * 2.0 if self.step % 2 == 0 else y * 1.0


class KeepsPrevious(Gated):
    """Adds the previous call's output (a tensor it keeps): the effect shows at the next call."""

    def __init__(self, d):
        super().__init__(d)
        self.prev = None

    def forward(self, x):
        y = gate(x, self.w)
        if self.prev is not None and self.prev.shape == y.shape:
            y = y + self.prev
        self.prev = y.detach()
        return y


class ChildTraining(nn.Module):
    """Reads a child's training flag (dropout p=0 child, so the values agree in both modes)."""

    def __init__(self, d):
        super().__init__()
        self.w, self.drop = nn.Parameter(torch.randn(d)), nn.Dropout(0.0)

    def forward(self, x):
        return gate(x, self.w) * (2.0 if self.drop.training else 1.0)


# ----------------------------------------------------------------------------------------------------- the builders


def _calls(seed: int, n: int, *, alternate: bool = False) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*_shapes(seed), generator=g) for _ in range(n)]
    if alternate:  # the sign flips at each call (a host branch takes the other path)
        xs = [x.abs() * (1 if k % 2 == 0 else -1) for k, x in enumerate(xs)]
    return [(x,) for x in xs]


def stack(make: Callable[[int, int], nn.Module], probe: Callable[[nn.Module], Any] = lambda m: None, *,
          train: bool = False, alternate: bool = False, n: int = 4,
          before: Callable[[nn.Module, int], None] = lambda m, k: None) -> Callable[[int], Case]:
    def build(seed: int) -> Case:
        reset_globals()
        d = _shapes(seed)[-1]
        torch.manual_seed(seed)
        model = Stack(d, lambda i: make(d, i))
        model.train(train)
        return Case(model, _calls(seed, n, alternate=alternate), probe, before)
    return build


def inner(attr: str, how: Callable[[Any], Any] = lambda v: v) -> Callable[[nn.Module], Any]:
    """A probe: `how(attribute)` of each layer's module under test."""
    return lambda m: [how(getattr(layer.inner, attr, None)) for layer in m.layers]


def _closure_case(seed: int) -> Case:
    cls, count = closure_counter_class()
    case = stack(lambda d, i: cls(d))(seed)
    case.probe = lambda m: count()
    return case


def _tensors(v: Any) -> Any:
    return [t.clone() for t in v.values()] if isinstance(v, dict) else v


LEGIT: dict[str, Callable[[int], Case]] = {
    "gate": stack(lambda d, i: Gated(d)),
    "rms": stack(lambda d, i: RMS(d)),
    "reads a child's training flag": stack(lambda d, i: ChildTraining(d)),
    "a child's training flag set between calls": stack(
        lambda d, i: ChildTraining(d), before=lambda m, k: m.layers[0].inner.drop.train(k >= 2)),
    "eval dropout (no randomness)": stack(lambda d, i: Dropout(d)),
    "holds a named tuple, a large list, a frozen set": stack(lambda d, i: HoldsValues(d)),
    "decorated forward (no_grad, wraps)": stack(lambda d, i: Decorated(d)),
    "nn.RMSNorm": stack(lambda d, i: nn.RMSNorm(d, eps=1e-6)),
}

EFFECTS: dict[str, Callable[[int], Case]] = {
    # globals, classes, closures
    "global counter": stack(lambda d, i: GlobalCounter(d), lambda m: CALLS),
    "global dict cache": stack(lambda d, i: GlobalCache(d), lambda m: dict(CACHE)),
    "global list": stack(lambda d, i: GlobalList(d), lambda m: list(SEEN)),
    "global list through a helper": stack(lambda d, i: GlobalHelper(d), lambda m: list(SEEN)),
    "module-level object's attribute": stack(lambda d, i: GlobalObject(d), lambda m: FLAGS.calls),
    "class attribute (type(self).calls)": stack(lambda d, i: ClassCounter(d), lambda m: ClassCounter.calls),
    "class attribute by name": stack(lambda d, i: NamedClassCounter(d), lambda m: NamedClassCounter.calls),
    "cache shared by the class's instances": stack(lambda d, i: SharedCache(d), lambda m: dict(SharedCache.cache)),
    "list on the class, appended to": stack(lambda d, i: ClassList(d), lambda m: list(ClassList.log)),
    "global set through a method": stack(lambda d, i: GlobalByMethod(d), lambda m: CALLS),
    "torch seeded through a held helper": stack(lambda d, i: SeedsByMethod(d)),
    "every fifth call differs (a counter in another module)": stack(lambda d, i: EveryFifth(d), n=6),
    "counts in another module's dict": stack(lambda d, i: CountsElsewhere(d),
                                             lambda m: dict(side_effect_helpers.COUNTS)),
    "sets torch's default dtype": stack(lambda d, i: SetsDefaultDtype(d), lambda m: str(torch.get_default_dtype())),
    "sets a flag of a module it imports": stack(lambda d, i: SetsModuleFlag(d), lambda m: side_effect_helpers.FAST),
    **{f"calls a {how} it holds that talks": stack(lambda d, i, how=how: CallsHeld(d, how))
       for how in ["print", "partial", "lambda"]},
    **{f"a flag on its {where} set after install": stack(lambda d, i, where=where: RecordsWhenAsked(d, where),
                                                          lambda m: list(RecordsWhenAsked.log), before=_flag_on(where))
       for where in ["class", "object", "global"]},
    "an object in a list it holds": stack(lambda d, i: InList(d, "object"), inner("trackers", lambda t: t[0].calls)),
    "a module in a list it holds": stack(lambda d, i: InList(d, "module"), inner("trackers", lambda t: t[0].calls)),
    "its parameter's Python attribute": stack(lambda d, i: TagsWeight(d), inner("w", lambda w: w.calls)),
    "a property counting in a global": stack(lambda d, i: CountingProperty(d), lambda m: CALLS),
    "appends to a file": _file_case,
    "a dict it holds filled at the first call": stack(lambda d, i: LazyOwnCache(d), inner("sizes", dict)),
    "a module-level cache filled at the first call": stack(lambda d, i: LazyGlobalCache(d), lambda m: dict(SIZES)),
    "a numpy array it holds, written in place": stack(lambda d, i: NumpyCounts(d), inner("hist", lambda h: h.tolist())),
    "counts on its owner (a back-reference)": _owner_case,
    "a function from a module-level table": stack(lambda d, i: ByTable(d), lambda m: list(SEEN)),
    "counts through a static method": stack(lambda d, i: ByStatic(d), lambda m: CALLS),
    "calls print kept in a dict it holds": stack(lambda d, i: ByHeldTable(d)),
    **{f"reads a value ({where}) changed after install": stack(lambda d, i, cls=cls: cls(d), before=_scale_later(where))
       for where, cls in [("environment", ReadsEnvironment), ("helper", ReadsHelper), ("method", ReadsByMethod)]},
    "draws through a held object's method": stack(lambda d, i: UsesHelper(d)),
    "counts in a global through a held object's method": stack(lambda d, i: CountsWithHelper(d), lambda m: CALLS),
    "a child that prints": stack(lambda d, i: Block(PrintingChild(d))),
    "a child that counts in a global": stack(lambda d, i: Block(GlobalCounter(d)), lambda m: CALLS),
    "a child with a class counter": stack(lambda d, i: Block(ClassCounter(d)), lambda m: ClassCounter.calls),
    "class table made lazily": stack(lambda d, i: LazyClassTable(d), lambda m: LazyClassTable.table),
    "closure cell (nonlocal)": _closure_case,
    "held function counting in its closure": stack(lambda d, i: HeldFunction(d), inner("tick", lambda f: f.n[0])),
    # objects and containers
    "held object two levels down": stack(lambda d, i: NestedHeld(d), inner("state", lambda s: s.inner.calls)),
    "dict in a held object": stack(lambda d, i: HeldDict(d), inner("stats", lambda s: dict(s.counts))),
    "list in a held object": stack(lambda d, i: HeldList(d), inner("stats", lambda s: list(s.seen))),
    **{f"{kind} it holds": stack(lambda d, i, kind=kind: Container(d, kind),
                                 inner("box", lambda b: repr(b)))
       for kind in ["defaultdict", "set", "deque", "Counter", "OrderedDict", "dict in list", "bytearray"]},
    "iterator it holds": stack(lambda d, i: Iterates(d), inner("steps", repr)),
    "a child's attribute": stack(lambda d, i: ChildCounter(d), inner("inner", lambda c: c.calls)),
    "a child replaced": stack(lambda d, i: ChildSwapped(d), inner("act", lambda a: type(a).__name__)),
    # tensors in place
    "unregistered tensor in place": stack(lambda d, i: TensorAttrInPlace(d), inner("avg", torch.clone)),
    "buffer in place (running average)": stack(lambda d, i: BufferInPlace(d), inner("avg", torch.clone)),
    "buffer statistic it does not read": stack(lambda d, i: BufferStatOnly(d), inner("total", torch.clone)),
    "buffer copy_ of the input": stack(lambda d, i: BufferCopy(d, "copy_"), inner("buf", torch.clone)),
    "buffer written through a slice": stack(lambda d, i: BufferCopy(d, "slice"), inner("buf", torch.clone)),
    "buffer's .data set": stack(lambda d, i: BufferCopy(d, ".data"), inner("buf", torch.clone)),
    "buffer reassigned (self.last = y)": stack(lambda d, i: BufferReassigned(d), inner("last", torch.clone)),
    "writes its input in place": stack(lambda d, i: WritesInput(d)),
    "computes into a buffer (out=)": stack(lambda d, i: OutArgument(d), inner("buf", torch.clone)),
    "writes its weight through a view": stack(lambda d, i: ParamThroughView(d), inner("w", torch.clone)),
    "clamps its weight in place (max-norm)": stack(lambda d, i: ClampsWeight(d), inner("w", torch.clone)),
    "sets an attribute on its input tensor": stack(lambda d, i: ReadsTag(d)),
    "spectral norm, train": stack(lambda d, i: nn.utils.parametrizations.spectral_norm(Gated(d), "w"), train=True),
    "eval batchnorm (a compute op: no module card)": stack(lambda d, i: TrainBatchNorm(d)),
    "train batchnorm": stack(lambda d, i: TrainBatchNorm(d), inner("bn", lambda b: b.running_mean.clone()),
                             train=True),
    # randomness (the generators' states are compared too)
    "train dropout": stack(lambda d, i: Dropout(d), train=True),
    "noise (randn_like)": stack(lambda d, i: Noise(d)),
    "torch.manual_seed in forward": stack(lambda d, i: SeedsTorch(d)),
    "default_generator.manual_seed in forward": stack(lambda d, i: SeedsGenerator(d)),
    "a generator it holds": stack(lambda d, i: HeldGenerator(d), inner("g", lambda g: g.get_state())),
    "python random layer drop, train": stack(lambda d, i: LayerDrop(d), train=True, n=8),
    "python random layer drop, eval": stack(lambda d, i: LayerDrop(d), n=8),
    "python random consumed": stack(lambda d, i: DrawsPython(d)),
    "a random.Random it holds": stack(lambda d, i: HeldPythonGenerator(d), inner("rng", lambda r: hash(r.getstate()))),
    # host reads
    **{f"branch on {how}": stack(lambda d, i, how=how: HostBranch(d, how), alternate=True)
       for how in [".item()", ".tolist()", ".numpy()", "bool(t)", "if t > 0", "float(t)", "int(t)", "torch.equal",
                   "torch.all"]},
    "nonzero": stack(lambda d, i: Nonzero(d)),
    "torch._assert": stack(lambda d, i: Asserts(d)),
    "print": stack(lambda d, i: Prints(d)),
    "warnings.warn": stack(lambda d, i: Warns(d)),
    "logging": stack(lambda d, i: Logs(d)),
    # hooks, lazy state, call counts
    "registers a hook on itself": stack(lambda d, i: HooksItself(d)),
    "registers a hook on itself, with a flag": stack(lambda d, i: HooksItselfFlag(d)),
    "registers a buffer lazily": stack(lambda d, i: LazyBuffer(d), inner("scale", torch.clone)),
    "plain attribute set lazily": stack(lambda d, i: LazyAttr(d), inner("size")),
    "every other call differs": stack(lambda d, i: EveryOther(d), inner("step")),
    "keeps the previous output": stack(lambda d, i: KeepsPrevious(d)),
}

CASES: dict[str, Callable[[int], Case]] = {**LEGIT, **EFFECTS}
