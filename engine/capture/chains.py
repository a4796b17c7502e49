"""Chains of memory-bound ops between compute-bound ones: where real models spend their small-op time.

A card is one ATen call; a model's time also sits in chains of small ones (a decomposed RMSNorm is
`_to_copy, pow, mean, add, rsqrt, mul, mul, _to_copy`; SwiGLU is `silu, mul`; a VAE block is
GroupNorm then SiLU), each paying its own launch and its own round trip through memory. This module
finds them in the data flow of one forward:

- `ChainTrace` is a TorchDispatchMode that records, per call, the values it read and wrote. A value
  is a tensor object at a generation of its storage: an in-place op writes a new value of the tensor
  it writes. A read of a tensor whose storage was written through another tensor since (a view's
  in-place write changes its base) reads a value of unknown origin, which no chain may absorb.
  (Tensor version counters cannot serve: they move after the dispatch mode returns.)
- `find_chains` joins a value's producer with its consumers when every consumer is a memory-bound call
  and the calls share a real module: their module paths' lowest common ancestor is neither the root nor
  a container (ModuleList, ModuleDict, Sequential). That keeps a layer's residual add with the norm
  that follows it in the same layer, and keeps one layer's residual stream from joining the next
  layer's chains, so one transformer layer yields the same chains as every other.
- A chain's intermediates have no consumer outside it by construction; its outputs are the values it
  makes that something outside reads (or nothing reads: the forward's results); its inputs, the values
  it reads that it did not make (activations and parameters).
- `ChainPattern.key` is the chain's structure: each member's op and exact signature, and where each of
  its tensor arguments comes from (an external input, by first-use order, or a member's output), so
  every layer's instance of the same chain has the same key and they are counted together.
- Where the members are exactly one module invocation's calls, the chain is that module's forward: a
  module card (its forward can be replaced behind a guard); otherwise it is a pattern (replaced inside
  compiled graphs).
"""

from __future__ import annotations

import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.bench.floor import is_compute_op
from engine.capture.dispatch_mode import DynamoLazyMode
from engine.capture.filters import data_dependent, own_dispatch, packed, unreadable
from engine.capture.higher_order import is_higher_order, run_higher_order
from engine.capture.recorder import TOP_LEVEL, ModulePaths
from engine.capture.signature import _tensor_text, bind_arguments, card_id, signature_of

ROOT = TOP_LEVEL  # the module path of calls made outside any submodule
MAX_CHAIN_CALLS = 48  # a group larger than this is not one fusable chain (and would not make one kernel)
VIEW_LIKE = {"aten::_unsafe_view", "aten::_reshape_alias"}  # views whose schema does not say so
CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)


@dataclass
class TraceCall:
    index: int
    op: str                       # 'aten::mul.Tensor'
    path: str                     # module path when the call ran (ROOT outside any submodule)
    invocation: int               # which invocation of that module (per path), to tell repeats apart
    reads: list[tuple[str, int]]  # (argument name, value id) of every tensor argument, in schema order
    writes: list[int]             # value ids made: outputs, then in-place written arguments
    signature: dict[str, Any]
    compute: bool                 # matmul-like (attention, convolution), random, data-dependent: a chain stops here
    view: bool                    # returns an alias of an input (no memory traffic of its own)
    us: float = 0.0               # time of the call as traced (wall clock on the CPU; 0 when not timed)

    @property
    def card_id(self) -> str:
        return card_id(self.signature)


@dataclass
class Chain:
    calls: list[TraceCall]
    inputs: list[int]             # values read and not made here, in first-use order
    outputs: list[int]            # values made here and read outside (or never read), in order made
    scope: str                    # the lowest common module path of the members
    module: str | None            # the module whose whole invocation this chain is, if it is one

    @property
    def heavy(self) -> int:
        """Members that move memory (views excluded)."""
        return sum(not c.view for c in self.calls)

    def key(self) -> tuple:
        ext = {v: i for i, v in enumerate(self.inputs)}
        made: dict[int, tuple[int, int]] = {}
        parts = []
        for j, c in enumerate(self.calls):
            src = tuple((name, ("in", ext[v]) if v in ext else ("call", *made[v])) for name, v in c.reads)
            parts.append((c.op, c.card_id, src))
            for k, v in enumerate(c.writes):
                made[v] = (j, k)
        outs = tuple(made[v] for v in self.outputs)
        return tuple(parts), outs


@dataclass
class ChainPattern:
    """Every instance of one chain structure in the forward."""

    key: tuple
    instances: list[Chain] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        return [c.op for c in self.instances[0].calls]

    @property
    def calls(self) -> int:
        return len(self.instances)

    @property
    def us(self) -> float:
        return sum(c.us for ch in self.instances for c in ch.calls)

    @property
    def kind(self) -> str:
        return "module" if all(ch.module is not None for ch in self.instances) else "pattern"

    @property
    def id(self) -> str:
        return "chain-" + card_id({"chain": repr(self.key)})[:12]


def _lca(a: str, b: str) -> str:
    if a == b:
        return a
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    return ".".join(pa[:n])


class ChainTrace(DynamoLazyMode):
    """Record the data flow of every ATen call made under it (see the module docstring).

    `path_of()` names the module running now (engine.capture.recorder.ModulePaths.current) and `entered(path)`
    how many times that module was called so far (ModulePaths.entered): a call starts another invocation of its
    module where either changed since the last call. `time_calls` times each call on the host (for CPU traces;
    leave it off on a GPU, where the capture's events count).
    """

    def __init__(self, path_of: Callable[[], str] = lambda: ROOT, *, time_calls: bool = False,
                 entered: Callable[[str], int] = lambda path: 0):
        super().__init__()
        self.path_of = path_of
        self.entered_count = entered
        self.time_calls = time_calls
        self.calls: list[TraceCall] = []
        # id(tensor) -> (value id, storage generation, weak reference): the reference tells a reused id
        # from the tensor; the generation, whether its storage was written since through another tensor
        self._values: dict[int, tuple[int, int, weakref.ref]] = {}
        self._gen: dict[int, int] = defaultdict(int)
        self._next = 0
        self.unknown: set[int] = set()      # values whose maker is not a recorded call
        self._last_path = None
        self._invocations: dict[str, int] = defaultdict(int)

    @staticmethod
    def _storage(t: torch.Tensor) -> int:
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # no storage (a sparse or meta tensor)
            return id(t)

    def _new(self, t: torch.Tensor) -> int:
        self._next += 1
        self._values[id(t)] = (self._next, self._gen[self._storage(t)], weakref.ref(t))
        return self._next

    def _current(self, t: torch.Tensor) -> int | None:
        got = self._values.get(id(t))
        if got is None or got[2]() is not t or got[1] != self._gen[self._storage(t)]:
            return None
        return got[0]

    def _read(self, t: torch.Tensor) -> int:
        got = self._current(t)
        if got is None:
            v = self._new(t)
            self.unknown.add(v)
            return v
        return got

    supports_higher_order_operators = True  # torch.cond & co. run with their calls traced (higher_order.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_higher_order(func):
            return run_higher_order(self, func, args, kwargs)
        if own_dispatch(types):   # a wrapper subclass: its own calls on plain tensors are traced
            return NotImplemented
        kwargs = kwargs or {}
        path = self.path_of()
        # Without the count, a module called twice in a row was one invocation, and its two calls one module chain
        # that a cast served at each call: `act(act(x))` computed act four times.
        entered = (path, self.entered_count(path))
        if entered != self._last_path:
            self._invocations[path] += 1
            self._last_path = entered
        bound = bind_arguments(func, args, kwargs)
        reads = []
        for name, v in bound:
            for t in _tensors(v):
                reads.append((name, self._read(t)))
        t0 = time.perf_counter() if self.time_calls else 0.0
        out = func(*args, **kwargs)
        us = (time.perf_counter() - t0) * 1e6 if self.time_calls else 0.0
        mutated = {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        written = [t for name, v in bound if name in mutated for t in _tensors(v)]
        for t in written:
            self._gen[self._storage(t)] += 1
        writes = [self._new(t) for t in _tensors(out)]
        for t in written:
            if self._current(t) is None:
                writes.append(self._new(t))
        name = func.name()
        view = name in VIEW_LIKE or any(r.alias_info is not None and not r.alias_info.is_write
                                        for r in func._schema.returns)
        # A copy to another device (`.cpu()`, `.to("cuda")`) ends a chain like a matmul: one kernel on one
        # device cannot do it, and eager for the chain replays members on the chain's own device.
        devices = {t.device for name_, v in bound for t in _tensors(v)} | {t.device for t in _tensors(out)}
        # A sparse or quantized tensor in or out, or a packed weight, ends a chain too: no card takes it
        # (engine.capture.filters).
        opaque = (unreadable([t for _, v in bound for t in _tensors(v)] + list(_tensors(out))) is not None
                  or packed(args, kwargs))
        # A random call (randn, bernoulli_, dropout: tagged nondeterministic_seeded) ends a chain too: eager for a
        # chain holding one draws other numbers on every run, so no kernel, eager's own chain included, could match
        # it, and its samples would not replay. What it drew is an input of the chain after it.
        # And so does a call whose output's shape depends on its input values (`x[mask]`, nonzero, unique: not op
        # cards either, engine.capture.filters.data_dependent): a kernel writes outputs of the card's shape, and
        # eager's answer to every fresh input set verification draws has another.
        ends = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()) or data_dependent(func, args, kwargs)
        self.calls.append(TraceCall(len(self.calls), name, path, self._invocations[path], reads, writes,
                                    signature_of(func, bound),
                                    is_compute_op(name) or not memory_bound(func) or len(devices) > 1 or opaque
                                    or ends, view, us))
        return out


# ATen ops that are not the memory-bound kind a chain kernel fuses: transforms and factorizations with their own
# algorithms (FNet's `_fft_c2c` sat in "memory-bound" chains with a layer norm, 28 % of the model's time).
_NOT_MEMORY_BOUND_PREFIXES = ("_fft_", "fft_", "linalg_", "_linalg_", "_cudnn_", "miopen_", "mkldnn_", "cudnn_")
_NOT_MEMORY_BOUND = frozenset({
    "cholesky", "cholesky_solve", "cholesky_inverse", "triangular_solve", "lu_solve", "lu_unpack", "ormqr",
    "geqrf", "orgqr", "_lu_with_info", "_linalg_det", "stft", "istft", "_cufft_clear_plan_cache",
})
# The linalg ops that are a reduction or an elementwise op, not a factorization: members like `sum` and `mul`
# (ConvNeXt V2's GRN, `torch.norm(x, p=2, dim=(1, 2))`, lost its fusion to the prefix rule).
_MEMORY_BOUND_LINALG = frozenset({"linalg_vector_norm", "linalg_cross"})


def memory_bound(func: Any) -> bool:
    """Whether a call can be a member of a chain: an ATen op of the memory-bound kind. Not one of another
    library (torchvision's `roi_align`, `nms`, a user's custom op: a chain kernel would have to reimplement code
    we cannot read, and its cost is unknown), and not an FFT or a factorization (compute with its own algorithms).
    A call that hands a value to the host (`item`, `equal`) stays a member: a module whose forward makes one is
    told apart by it (engine.capture.chain_cards.HOST_READS)."""
    if getattr(func, "namespace", "aten") != "aten":
        return False
    base = func._schema.name.split("::", 1)[-1]
    if base in _MEMORY_BOUND_LINALG:
        return True
    return not base.startswith(_NOT_MEMORY_BOUND_PREFIXES) and base not in _NOT_MEMORY_BOUND


def _tensors(v: Any) -> Iterable[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            if isinstance(x, torch.Tensor):
                yield x


def container_paths(model: torch.nn.Module) -> set[str]:
    """Module paths that only hold other modules (and the root): a chain never spans two of their children."""
    return {ROOT, ""} | {name for name, m in model.named_modules() if name and isinstance(m, CONTAINERS)}


def find_chains(calls: list[TraceCall], containers: set[str] = frozenset({ROOT, ""}), *, min_heavy: int = 2,
                unknown: set[int] = frozenset()) -> list[Chain]:
    """Group memory-bound calls into chains (see the module docstring), in forward order."""
    maker: dict[int, int] = {}
    readers: dict[int, list[int]] = defaultdict(list)
    for c in calls:
        for _, v in c.reads:
            readers[v].append(c.index)
        for v in c.writes:
            maker[v] = c.index
    parent = list(range(len(calls)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # Per group (by its root): for each container its members lie under, the one child they lie under.
    # Two groups join only where no container would then hold members under two of its children: a
    # chain never spans two layers, also not through calls made by their parent (Gemma's per-layer
    # inputs are computed at the model level and read by every layer).
    def children(path: str) -> dict[str, str]:
        parts = path.split(".")
        out = {}
        for i in range(len(parts)):
            c = ".".join(parts[:i])
            if c in containers:
                out[c] = parts[i]
        return out

    under: list[dict[str, str]] = [children(c.path) for c in calls]

    def join(a: int, b: int) -> bool:
        ra, rb = find(a), find(b)
        if ra == rb:
            return True
        ua, ub = under[ra], under[rb]
        if any(ub.get(c, x) != x for c, x in ua.items()):
            return False
        parent[rb] = ra
        under[ra] = {**ub, **ua}
        return True

    # A view of a value made outside every chain (a model input, a parameter, a matmul's output) is as much an
    # input as that value: two calls that both read it are not joined through it. CLIP's chain card held the
    # token embedding and layer norm at the model's start beside the end-of-text argmax at its end, joined only by
    # a view of the token ids.
    outside: dict[int, bool] = {}

    def made_outside(v: int) -> bool:
        if v not in outside:
            p = maker.get(v)
            outside[v] = p is None or calls[p].compute or calls[p].path == ROOT or \
                (calls[p].view and all(made_outside(u) for _, u in calls[p].reads))
        return outside[v]

    for v, p in maker.items():
        if v in unknown or calls[p].compute or calls[p].path == ROOT:
            continue
        rs = readers.get(v, [])
        if len(rs) > 1 and made_outside(v):
            continue
        if not rs or any(calls[r].compute or calls[r].path == ROOT for r in rs):
            continue
        # All of a value's readers join its maker, or none: an intermediate must have no reader outside.
        trial_parent, trial_under = list(parent), list(under)
        if not all(join(p, r) for r in rs):
            parent[:], under[:] = trial_parent, trial_under
    groups: dict[int, list[int]] = defaultdict(list)
    for c in calls:
        if not c.compute:
            groups[find(c.index)].append(c.index)
    chains = []
    for members in (part for group in groups.values() for part in _kernels(calls, group, readers)):
        ms = [calls[i] for i in members]
        if sum(not c.view for c in ms) < min_heavy or len(ms) > MAX_CHAIN_CALLS:
            continue
        inputs, outputs = _boundary(ms, readers)
        if not outputs:
            # what it makes only a host read takes (`x.abs().amax().item()`): a kernel for it would write
            # nothing, and an empty one would pass verification and time faster than eager (module chains
            # without outputs are dropped alike, module_subchains)
            continue
        scope = _scope(ms)
        chains.append(Chain(ms, inputs, outputs, scope, _module_of(calls, members, scope)))
    chains += module_subchains(calls, chains, readers, min_heavy)
    chains.sort(key=lambda ch: (ch.calls[0].index, -len(ch.calls)))
    return chains


def module_subchains(calls: list[TraceCall], chains: list[Chain], readers: dict[int, list[int]],
                     min_heavy: int = 2) -> list[Chain]:
    """Module chains that data flow alone does not make: every invocation of a module whose own calls are
    all memory-bound (an RMSNorm, an activation module) is a chain of its own, a module card, also where
    its calls joined a larger pattern (an add and the norm after it, a norm and the rotary embedding after
    it) or were split between neighbours by the pattern rules. In eager only module cards can run (a
    module's forward is what can be replaced), and in real models most norms sit in such places (Gemma 4:
    5 of 30 RMSNorm invocations were module chains before). Patterns stay as they are, for torch.compile."""
    have = {(ch.module, ch.calls[0].index) for ch in chains if ch.module is not None}
    by_inv: dict[tuple[str, int], list[int]] = defaultdict(list)
    for c in calls:
        if c.path not in (ROOT, ""):
            by_inv[(c.path, c.invocation)].append(c.index)
    out: list[Chain] = []
    for (path, _), members in by_inv.items():
        ms = [calls[i] for i in members]
        if (path, members[0]) in have or any(c.compute for c in ms) or len(ms) > MAX_CHAIN_CALLS:
            continue
        if sum(not c.view and not _allocation(c.op) for c in ms) < min_heavy or \
                _module_of(calls, members, path) != path:
            continue  # too small, or the module has children or calls around it (not one invocation's run)
        if any(_in_place(c.op) for c in ms):
            continue  # it writes in place (maybe through a view): its values cannot all be followed
        inputs, outputs = _boundary(ms, readers)
        if not outputs:
            continue
        out.append(Chain(ms, inputs, outputs, path, path))
    return out


def _boundary(ms: list[TraceCall], readers: dict[int, list[int]]) -> tuple[list[int], list[int]]:
    """A chain's inputs (values its members read and did not make, in first-use order) and outputs
    (values they made that something outside reads, or nothing does)."""
    inside = {c.index for c in ms}
    made = {v for c in ms for v in c.writes}
    inputs: list[int] = []
    for c in ms:
        for _, v in c.reads:
            if v not in made and v not in inputs:
                inputs.append(v)
    outputs = [v for c in ms for v in c.writes
               if not readers.get(v) or any(r not in inside for r in readers[v])]
    return inputs, outputs


def _allocation(op: str) -> bool:
    """`aten::empty`, `empty_like`, …: memory handed out, no traffic (a BatchNorm module's reserve buffer
    beside its one op is no chain)."""
    return op.split("::", 1)[-1].split(".")[0] in ("empty", "empty_like", "empty_strided", "new_empty")


def _in_place(op: str) -> bool:
    """`aten::add_.Tensor`, `aten::relu_`: an op that writes its first argument."""
    base = op.split("::", 1)[-1].split(".")[0]
    return base.endswith("_") and not base.endswith("__")


def _scope(ms: list[TraceCall]) -> str:
    scope = ms[0].path
    for c in ms[1:]:
        scope = _lca(scope, c.path)
    return scope


def _trim_views(calls: list[TraceCall], members: list[int]) -> list[int]:
    """Drop view members outside the heavy members' module (a neighbour's reshape of its input or
    output joins by data flow but belongs to that neighbour)."""
    heavy = [calls[i] for i in members if not calls[i].view]
    if not heavy:
        return members
    scope = _scope(heavy)
    return [i for i in members if not calls[i].view or calls[i].path == scope
            or calls[i].path.startswith(scope + ".")]


def _drop_trailing_views(calls: list[TraceCall], members: list[int], readers: dict[int, list[int]]) -> list[int]:
    """Drop views whose results only non-members read: a reshape on the way out is the reader's business."""
    keep = list(members)
    changed = True
    while changed:
        changed = False
        inside = set(keep)
        for i in reversed(keep):
            c = calls[i]
            if c.view and all(r not in inside for v in c.writes for r in readers.get(v, [])):
                keep.remove(i)
                changed = True
                break
    return keep


def _components(calls: list[TraceCall], members: list[int]) -> list[list[int]]:
    """The members split into parts that values connect (one member makes what another reads), in order."""
    parent = {i: i for i in members}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    made = {v: i for i in members for v in calls[i].writes}
    for i in members:
        for _, v in calls[i].reads:
            j = made.get(v)
            if j is not None:
                parent[find(i)] = find(j)
    parts: dict[int, list[int]] = defaultdict(list)
    for i in sorted(members):
        parts[find(i)].append(i)
    return sorted(parts.values())


def _kernels(calls: list[TraceCall], group: list[int], readers: dict[int, list[int]]) -> list[list[int]]:
    """A data-flow group as the chains it holds: each connected part made convex (`_convex`), and what that
    leaves out split and made convex in turn. Two add -> norm pairs of a post-norm block (or an embedding's
    add and layer 0's pre-norm) join by data flow with a matmul between them: the second pair is a chain of
    its own, not lost; and a member nothing connects to the rest any more (an `arange` whose reader was left
    out) is not kept in a chain it has no part in."""
    out: list[list[int]] = []
    todo = [sorted(group)]
    while todo:
        for part in _components(calls, todo.pop()):
            kept = _drop_trailing_views(calls, _convex(calls, _trim_views(calls, part)), readers)
            if len(kept) == len(part):
                out.append(part)
                continue
            if not kept:   # nothing of it can run as one kernel (views left by a neighbour)
                continue
            inside = set(kept)
            rest = [i for i in part if i not in inside]
            todo += [x for x in (kept, rest) if x]
    return sorted(out)


def _convex(calls: list[TraceCall], members: list[int]) -> list[int]:
    """The members that can run as one kernel: drop any member that reads a value made, after the
    chain started, by a non-member depending on the chain (`x + mlp(norm(x))`: the add waits for the
    MLP, which waits for the norm, so the add cannot join the norm's kernel)."""
    if not members:
        return members
    keep = set(members)
    member_vals: set[int] = set()
    tainted: set[int] = set()  # values made outside the chain that depend on it
    for i in range(members[0], members[-1] + 1):
        c = calls[i]
        reads = {v for _, v in c.reads}
        if i in keep and reads & tainted:
            keep.discard(i)
        if i in keep:
            member_vals.update(c.writes)
        elif reads & (member_vals | tainted):
            tainted.update(c.writes)
    return [i for i in members if i in keep]


def _module_of(calls: list[TraceCall], members: list[int], scope: str) -> str | None:
    """`scope` when the members are every call of one invocation of that module, else None."""
    if scope in (ROOT, ""):
        return None

    def under(c: TraceCall) -> bool:
        return c.path == scope or c.path.startswith(scope + ".")

    first, last = members[0], members[-1]
    inv = {c.invocation for c in (calls[i] for i in members) if c.path == scope}
    if len(inv) > 1:
        return None

    def beside(c: TraceCall) -> bool:
        """A call next to the members that may be the same invocation's: under the module, and not one of its
        own calls of another invocation (`act(act(x))`: the first call's last member and the second's first)."""
        return under(c) and not (c.path == scope and inv and c.invocation not in inv)

    if first > 0 and beside(calls[first - 1]) and calls[first - 1].index not in members:
        return None
    if last + 1 < len(calls) and beside(calls[last + 1]):
        return None
    span = range(first, last + 1)
    return scope if all(i in members for i in span if under(calls[i])) and \
        all(under(calls[i]) for i in members) else None


def patterns(chains: list[Chain]) -> list[ChainPattern]:
    """Chains grouped by structure, most time first (then most instances)."""
    by: dict[tuple, ChainPattern] = {}
    for ch in chains:
        k = ch.key()
        by.setdefault(k, ChainPattern(k)).instances.append(ch)
    return sorted(by.values(), key=lambda p: (-p.us, -p.calls, p.instances[0].calls[0].index))


def trace_forward(model: torch.nn.Module, forward: Callable[[], Any], *, time_calls: bool = True) -> ChainTrace:
    """Run `forward()` once under a ChainTrace with module paths tracked; returns the trace."""
    paths = ModulePaths(model, {})
    mode = ChainTrace(paths.current, time_calls=time_calls, entered=paths.entered)
    with paths, torch.no_grad(), mode:
        forward()
    return mode


# ---- a chain as a card: its signature, and eager for it ---------------------------------------------

CHAIN_OP = "kforge::chain"


def _read_descs(call: TraceCall) -> list[dict[str, Any]]:
    """The tensor descriptions of a call's reads, in the order `reads` lists them."""
    out = []
    for a in call.signature["args"]:
        if a.get("kind") == "tensor" and not a.get("absent"):
            out.append(a)
        elif a.get("kind") == "tensor_list":
            out.extend(x for x in a["items"] if x is not None)
    return out


def chain_signature(chain: Chain) -> dict[str, Any]:
    """The chain as a card signature: its external inputs described like any card's arguments
    (`in0`, `in1`, … in first-use order) and its graph: per member, the op and each argument (a
    plain value as captured, or where the tensor comes from), and which members' results it returns.
    Module paths are not part of it: every layer's instance has the same signature."""
    ext = {v: i for i, v in enumerate(chain.inputs)}
    descs: dict[int, dict[str, Any]] = {}
    made: dict[int, tuple[int, int]] = {}
    nodes = []
    for j, c in enumerate(chain.calls):
        reads = iter(zip(c.reads, _read_descs(c)))

        def ref(v: int) -> list:
            return ["in", ext[v]] if v in ext else ["node", *made[v]]

        args = []
        for a in c.signature["args"]:
            if a.get("kind") == "tensor" and not a.get("absent"):
                (_, v), d = next(reads)
                descs.setdefault(v, d)
                args.append({"name": a["name"], "tensor": ref(v)})
            elif a.get("kind") == "tensor_list":
                items = []
                for x in a["items"]:
                    if x is None:
                        items.append(None)
                    else:
                        (_, v), d = next(reads)
                        descs.setdefault(v, d)
                        items.append(ref(v))
                args.append({"name": a["name"], "tensors": items})
            elif a.get("kind") == "tensor":  # an absent optional tensor
                args.append({"name": a["name"], "value": None})
            else:
                args.append({"name": a["name"], "value": a.get("value")})
        nodes.append({"op": c.op, "args": args, "results": len(c.writes)})
        for k, v in enumerate(c.writes):
            made[v] = (j, k)
    inputs = [{"name": f"in{i}", **{k: x for k, x in descs[v].items() if k != "name"}}
              for i, v in enumerate(chain.inputs)]
    return {"op": CHAIN_OP, "args": inputs, "aliases": [],
            "chain": {"nodes": nodes, "outputs": [list(made[v]) for v in chain.outputs]}}


def chain_card_id(signature: dict[str, Any]) -> str:
    return card_id(signature)


def chain_text(ops: list[str], signature: dict[str, Any]) -> str:
    """`chain[_to_copy pow mean …] in0 bf16[2,8,1536] in1 bf16[1536]`: the members, then the inputs."""
    return f"chain[{' '.join(ops)}] " + " ".join(f"{a['name']} {_tensor_text(a)}" for a in signature["args"])


def run_chain(signature: dict[str, Any], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Eager for a chain card: its members called in order on `inputs` (the card's `in0`, `in1`, …);
    returns its outputs. In-place members write what they wrote when captured.

    A channels-last twin's (`signature["twin_of"]`, engine.capture.twins) is what compiled code that hands the
    chain its first input as held gets from PyTorch, as for an op twin (`engine.ops.eager_call`): that input
    copied to contiguous (CUDA native_group_norm rejects channels-last input), the members, and the outputs
    copied into the strides the members' meta kernels give for the input as it came, which compiled code
    asserts. On fake tensors it is the members' meta kernels themselves."""
    first = inputs[0] if inputs else None
    if (signature.get("twin_of") and isinstance(first, torch.Tensor) and not first.is_contiguous()
            and first.device.type != "meta" and not torch._subclasses.fake_tensor.is_fake(first)):
        from engine.ops import restrided

        key = (signature["twin_of"], tuple((tuple(t.shape), t.stride(), t.dtype, t.device.type)
                                           for t in inputs if isinstance(t, torch.Tensor)))
        want = _TWIN_STRIDES.get(key)
        if want is None:   # a fake run of the chain: once per twin and layout, not on every call eager times
            want = _TWIN_STRIDES[key] = chain_output_strides(signature, inputs)
            if len(_TWIN_STRIDES) > 256:
                _TWIN_STRIDES.pop(next(iter(_TWIN_STRIDES)))
        outs = _run_members(signature, [first.contiguous(), *inputs[1:]])
        return list(restrided(outs, want))
    return _run_members(signature, inputs)


_TWIN_STRIDES: dict[tuple, list[tuple[int, ...]]] = {}   # (twin_of, input layouts) -> its outputs' strides


def chain_written_inputs(signature: dict[str, Any]) -> list[str]:
    """The chain's inputs (`in0`, …) that its members write in place, directly or through a view of them (a
    residual stream's `h.add_(x)`, a `x.relu_()` on an activation the chain reads): `run_chain` writes them as the
    model's forward did, so a kernel for the chain must leave them as eager does. In schema order of the members'
    aliasing (`Tensor(a!)` written, `Tensor(a)` a view), `VIEW_LIKE` ops as views of `self`."""
    from engine.ops import resolve_op

    names = [a["name"] for a in signature["args"]]
    views: dict[tuple, set[int]] = {}   # a member's result -> the inputs whose storage it is (a view of)
    written: set[int] = set()

    def of(ref: Any) -> set[int]:
        if ref is None:
            return set()
        ref = tuple(ref)
        return {ref[1]} if ref[0] == "in" else views.get(ref, set())

    for j, node in enumerate(signature["chain"]["nodes"]):
        schema = resolve_op(node["op"])._schema
        info = {a.name: a.alias_info for a in schema.arguments}
        by_set: dict[frozenset, set[int]] = {}
        mutated: set[int] = set()
        for a in node["args"]:
            refs = [a["tensor"]] if "tensor" in a else a.get("tensors", [])
            roots = set().union(*(of(r) for r in refs)) if refs else set()
            alias = info.get(a["name"])
            if node["op"] in VIEW_LIKE and a["name"] == "self":
                by_set.setdefault(frozenset({"self"}), set()).update(roots)
            if alias is None:
                continue
            by_set.setdefault(frozenset(alias.before_set), set()).update(roots)
            if alias.is_write:
                written |= roots
                mutated |= roots
        returns = [frozenset(r.alias_info.before_set) if r.alias_info is not None else None for r in schema.returns]
        if node["op"] in VIEW_LIKE:
            returns = [frozenset({"self"})]
        for k in range(node.get("results", 1)):
            # a `Tensor(a)[]` return (split, unbind) is every result; results past the returns are the arguments
            # the member wrote (run_chain appends them)
            key = returns[0] if len(returns) == 1 else (returns[k] if k < len(returns) else None)
            roots = by_set.get(key, set()) if key is not None else (mutated if k >= len(returns) else set())
            if roots:
                views[("node", j, k)] = roots
    return [names[i] for i in sorted(written)]


def chain_output_strides(signature: dict[str, Any], inputs: list[torch.Tensor]) -> list[tuple[int, ...]]:
    """The strides of the chain's outputs for inputs laid out as `inputs`, by its members' meta kernels (fake
    tensors, nothing run)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs]
    with mode:
        return [tuple(t.stride()) for t in _run_members(signature, fakes)]


def _run_members(signature: dict[str, Any], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from engine.capture.signature import decode_value
    from engine.ops import call_op, resolve_op

    vals: dict[tuple, torch.Tensor] = {("in", i): t for i, t in enumerate(inputs)}
    for j, node in enumerate(signature["chain"]["nodes"]):
        op = resolve_op(node["op"])
        bound = []
        for a in node["args"]:
            if "tensor" in a:
                bound.append((a["name"], vals[tuple(a["tensor"])]))
            elif "tensors" in a:
                bound.append((a["name"], [None if r is None else vals[tuple(r)] for r in a["tensors"]]))
            else:
                bound.append((a["name"], decode_value(a["value"])))
        if node["op"] == "aten::_to_copy":
            # A chain never changes device (the trace ends chains there): a copy's recorded device is the
            # device the chain ran on when captured, which is not where it runs now (a CPU capture's card
            # says 'cuda' for the GPU; the lane replays it on that GPU). It runs on its input's device.
            src = dict(bound)["self"]
            bound = [(k, src.device if k == "device" and v is not None else v) for k, v in bound]
        out = call_op(op, bound)
        results = list(_tensors(out))
        mutated = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        for name, v in bound:
            if name in mutated:
                results += [t for t in _tensors(v) if not any(t is r for r in results)]
        for k, t in enumerate(results):
            vals[("node", j, k)] = t
    return [vals[("node", j, k)] for j, k in signature["chain"]["outputs"]]
