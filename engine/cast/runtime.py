"""Guarded dispatch: one torch.library override per ATen overload, at one backend dispatch key.

The router for an op reads the first argument's shape (a set lookup stops most misses there), then
builds the call's guard key and looks it up. A hit runs the variant's plan; a miss calls the kernel
that was registered before ours (`torch.library.get_kernel(...).call_boxed`) with Python scalars
re-wrapped as tensors. While Dynamo traces, every call falls through. A hit that needs autograd (grad
enabled and a tensor argument that requires grad) is declined: a variant ships no backward, and the
autograd node would save its outputs as if they were PyTorch's. Routes are process-wide and
shared by every installed cast; the last variant to leave an op removes its override, which restores
the original kernel exactly.

Targets: a plan may carry the targets its variant was proven for (`Plan.targets`, from `export --target`;
None: no targets recorded and no whole-model check, runs wherever it is installed). A hit runs such a plan
only where the call is made under one of them (`current_target()`): inside compiled code of
`cast.compile(mode=M)` the target is `compile` / `compile:M` (set by the backend around its compiled
graphs, `target_scope`); elsewhere it is `cuda-graphs` while the current CUDA stream is being captured and
`eager` otherwise. Otherwise the hit is declined (`target_declines`) and PyTorch's kernel runs.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from engine.cast.guard import OpLayout, bind, formats_differ, key_function, key_strides, layout_of
from engine.ops import resolve_op, restrided, tensors_of

_LOCK = threading.RLock()
_ROUTES: dict[tuple[str, str], Route] = {}
NEAR_MISS_KEYS = 8  # distinct near-miss keys kept per op, to explain unexpected misses


EAGER, GRAPHS = "eager", "cuda-graphs"


def compile_target(mode: str | None) -> str:
    """The target name of `torch.compile(mode=mode)`: 'compile' for the default mode, else 'compile:MODE'."""
    return "compile" if mode in (None, "default") else f"compile:{mode}"


_SCOPE = threading.local()


@contextlib.contextmanager
def target_scope(target: str) -> Iterator[None]:
    """Calls made inside the block are made under `target` (compiled code of a cast backend)."""
    from engine.cast import cpp_router

    stack = getattr(_SCOPE, "stack", None)
    if stack is None:
        stack = _SCOPE.stack = []
    stack.append(target)
    cpp_router.set_target(target)
    try:
        yield
    finally:
        stack.pop()
        cpp_router.set_target(stack[-1] if stack else None)


@contextlib.contextmanager
def static_graph(static: bool) -> Iterator[None]:
    """Calls made inside the block come from a compiled graph, of static shapes or not: where static, a route
    gives each result the output strides of the op's meta kernel (`Route._as_promised`)."""
    stack = getattr(_SCOPE, "static", None)
    if stack is None:
        stack = _SCOPE.static = []
    stack.append(static)
    try:
        yield
    finally:
        stack.pop()


def current_target() -> str:
    """The target a call is made under now: the innermost target_scope, else 'cuda-graphs' while the current
    CUDA stream is being captured, else 'eager'."""
    stack = getattr(_SCOPE, "stack", None)
    if stack:
        return stack[-1]
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return GRAPHS
    return EAGER


def allowed(targets: frozenset[str]) -> bool:
    """Whether a plan proven for `targets` may run on a call made now (current_target() in targets, without
    asking CUDA about capture when both eager and cuda-graphs are among them)."""
    stack = getattr(_SCOPE, "stack", None)
    if stack:
        return stack[-1] in targets
    if EAGER in targets and GRAPHS in targets:
        return True
    return current_target() in targets


class Plan:
    """Something a hit runs: `plan(bound) -> result`, with a hit counter. Subclassed by KernelPlan.
    `targets`: where it may run (see the module doc); None: anywhere."""

    def __init__(self, vid: str, fn: Callable[[list[Any]], Any] | None = None,
                 targets: frozenset[str] | None = None):
        self.vid = vid
        self.hits = 0
        self.targets = targets
        # Its kernels may round otherwise from run to run (a reduction's atomics: verification held a second run
        # to its tolerance, not bit for bit): declined while torch.use_deterministic_algorithms(True) is on.
        self.reorders = False
        self._fn = fn
        # The strides of the tensor outputs it was proven to return (None: not known, e.g. a test's plan)
        self.output_strides: tuple[tuple[int, ...], ...] | None = None
        # (slot, channels-last by strides) of proven tensors whose size-1 dims' strides the key leaves out
        # (engine.cast.guard.proven_formats): in eager, a call that differs there is a miss
        self.formats: tuple[tuple[int, bool], ...] = ()

    def __call__(self, bound: list[Any]) -> Any:
        assert self._fn is not None
        return self._fn(bound)


class Route:
    """The override of one ATen overload at one dispatch key, and its guard table."""

    def __init__(self, op_name: str, dispatch_key: str):
        self.op = resolve_op(op_name)
        self.op_name = op_name
        self.dispatch_key = dispatch_key
        self.layout: OpLayout = layout_of(self.op)
        self.key_of = key_function(self.layout)
        self.nargs = len(self.layout.names)
        self.table: dict[tuple, Plan] = {}
        self.owners: dict[tuple, object] = {}
        # Other plans for a key, each proven where PyTorch takes the tensors for another memory format than the
        # table's plan's (engine.cast.guard.proven_formats: a size-1 dim's stride, which keys leave out), with
        # their owners: in eager the call's format picks among them (a GroupNorm proven on an input that is
        # channels-last in name only and its true channels-last twin)
        self.alts: dict[tuple, list[tuple[Plan, object]]] = {}
        self.shapes: set[tuple] = set()
        self.open_prefilter = False   # some key has no first-tensor shape: always build the key
        self.active = True
        self.misses = 0
        self.near_misses = 0
        self.near_keys: list[tuple] = []
        self.fallthrough = 0          # calls passed on while Dynamo traced or dispatch was suspended
        self.grad_declines = 0        # hits declined because the call needs autograd
        self.target_declines = 0      # hits declined because the variant was not proven for the call's target
        self.determinism_declines = 0  # hits declined: deterministic algorithms on, the variant may reorder sums
        self.format_declines = 0      # calls with a proven key that PyTorch takes for another memory format (eager)
        self.promised: dict[tuple, Any] = {}  # inputs' layouts -> the meta kernel's output strides (compiled code)
        self.tensor_slots = tuple(i for i, k in enumerate(self.layout.kinds) if k != "value")
        self.lib: torch.library.Library | None = None
        self._register()

    def _register(self) -> None:
        """Take the kernel registered now as the original and put the override over it."""
        self.original = torch.library.get_kernel(self.op, self.dispatch_key)
        ns, name = self.op_name.split("::", 1)
        self.lib = torch.library.Library(ns, "IMPL", self.dispatch_key)
        with warnings.catch_warnings():
            # Registering over the backend kernel is the point; torch warns about it on every install.
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            self.lib.impl(name, self._dispatch, self.dispatch_key, with_keyset=True)
        self._mine = repr(torch.library.get_kernel(self.op, self.dispatch_key))  # names where ours was registered

    def _rebind(self, failed: Any) -> bool:
        """After the original kernel was deregistered (another library's override, registered before ours and
        removed while ours is installed): take the kernel now below ours as the original. Only while ours is the
        one dispatched (re-registering puts it on top, which would reorder an override registered after ours).
        Whether the original may be called again."""
        with _LOCK:
            if self.original is not failed:   # another thread rebound it
                return True
            if self.lib is None or repr(torch.library.get_kernel(self.op, self.dispatch_key)) != self._mine:
                return False
            self.lib._destroy()
            self.lib = None
            self._register()
            return True

    def _dispatch(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._route(keyset, args, kwargs)
        static = getattr(_SCOPE, "static", None)
        if static and static[-1] and not self.layout.writes:
            return self._as_promised(args, kwargs, result)
        return result

    def _as_promised(self, args: tuple, kwargs: dict, result: Any) -> Any:
        """`result` with the output strides the op's meta kernel gives for these inputs: what a graph compiled with
        static shapes was promised (compiled code reads a fallback's outputs with them, and asserts them). PyTorch's
        CPU GroupNorm returns a channels-last output for a channels-last input where its meta kernel says
        contiguous: a kept op, hit or miss, raised in the compiled graph. (With symbolic sizes the fake kernel
        need not agree with the meta kernel on concrete ones: a graph with dynamic shapes is left as it is.)"""
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and self.op in _HELD and \
                (tuple(first.shape), key_strides(tuple(first.shape), first.stride())) in _HELD[self.op]:
            return result   # held inputs: `_original` already gives the strides the graph asserts
        key = _layout_key(args, kwargs)
        want = self.promised.get(key, _NOT_KNOWN)
        if want is _NOT_KNOWN:
            want = _meta_strides(self.op, args, kwargs)
            if len(self.promised) < 256:
                self.promised[key] = want
        return result if want is None else restrided(result, want)

    def _route(self, keyset: Any, args: tuple, kwargs: dict) -> Any:
        if not self.active or torch.compiler.is_dynamo_compiling():
            self.fallthrough += 1
            return self._original(keyset, args, kwargs)
        layout = self.layout
        if layout.first_tensor and not self.open_prefilter:
            try:
                shape = args[0].shape
            except (AttributeError, IndexError):
                shape = None
            if shape not in self.shapes:
                self.misses += 1
                return self._original(keyset, args, kwargs)
        bound = args if not kwargs and len(args) == self.nargs else bind(layout, args, kwargs)
        key = self.key_of(bound)
        plan = self.table.get(key)
        if plan is not None and plan.formats and formats_differ(plan.formats, bound) and not _in_compiled_code():
            # eager may lay its outputs out otherwise for this call than for the proof's: a plan proven on its
            # format, or PyTorch's kernel (compiled code holds its own layouts and gets the strides it asserts,
            # see _as_promised and _HELD)
            plan = next((p for p, _ in self.alts.get(key, ()) if not formats_differ(p.formats, bound)), None)
            if plan is None:
                self.format_declines += 1
                return self._original(keyset, args, kwargs)
        if plan is None:
            self.misses += 1
            self.near_misses += 1
            if len(self.near_keys) < NEAR_MISS_KEYS and key not in self.near_keys:
                self.near_keys.append(key)
            return self._original(keyset, args, kwargs)
        if _grad_enabled() and _needs_grad(bound, self.tensor_slots):
            self.grad_declines += 1
            return self._original(keyset, args, kwargs)
        if plan.targets is not None and not allowed(plan.targets):
            self.target_declines += 1
            return self._original(keyset, args, kwargs)
        if plan.reorders and _deterministic():
            self.determinism_declines += 1
            return self._original(keyset, args, kwargs)
        plan.hits += 1
        try:
            return plan(bound)
        except Exception as e:  # a kernel that cannot launch here: this variant stays on PyTorch from now on
            plan.hits -= 1
            self.disable(key, e, plan)
            return self._original(keyset, args, kwargs)

    def disable(self, key: tuple, error: BaseException, plan: Plan | None = None) -> None:
        """Take a failing variant (`plan`; None: the key's plan in the table) out of the guard table, with one
        warning; its calls go to PyTorch."""
        with _LOCK:
            plan = plan if plan is not None else self.table.get(key)
            found = plan is not None and self._keep(key, lambda p, o: p is not plan)
        if found and plan is not None:
            from engine.cast.format import CastWarning

            warnings.warn(CastWarning(f"kforge cast: variant {plan.vid} of {self.op_name} failed on a call and "
                                      f"stays on PyTorch from now on: {type(error).__name__}: {error}"),
                          stacklevel=3)

    def _original(self, keyset: Any, args: tuple, kwargs: dict) -> Any:
        outs = None
        if _HELD and args and self.op in _HELD and _in_compiled_code():
            args, outs = _as_traced(self.op, args)
        slots = self.layout.scalar_slots
        if slots:
            for i in slots:
                if i < len(args) and isinstance(args[i], (bool, int, float, complex)):
                    args = rewrap_scalars(args, slots)
                    break
        original = self.original
        try:
            result = original.call_boxed(keyset, *args, **kwargs)
        except RuntimeError as e:
            # The kernel we took as the original was deregistered: every miss raised where eager runs
            if not str(e).startswith("SafeKernelFunction has been invalidated") or not self._rebind(original):
                raise
            result = self.original.call_boxed(keyset, *args, **kwargs)
        return result if outs is None else restrided(result, outs)

    def add(self, key: tuple, plan: Plan, owner: object, first_shape: tuple | None) -> bool:
        """Add a guard entry; False when a plan proven for the same calls already covers the key (first one
        wins). A plan whose proven tensors PyTorch takes for another memory format than those of the key's
        plans (`Plan.formats`) is added beside them."""
        head = self.table.get(key)
        if head is not None:
            have = [head, *(p for p, _ in self.alts.get(key, ()))]
            if not plan.formats or any(p.formats == plan.formats or not p.formats for p in have):
                return False
            self.alts.setdefault(key, []).append((plan, owner))
            return True
        self.table[key] = plan
        self.owners[key] = owner
        if first_shape is None:
            self.open_prefilter = True
        else:
            self.shapes.add(first_shape)
        return True

    def _keep(self, key: tuple, keep: Callable[[Plan, object], bool]) -> bool:
        """Keep only the key's plans (the table's and its alternatives) for which keep(plan, owner); True when
        one was taken out. The first left takes the table's place."""
        if key not in self.table:
            return False
        have = [(self.table[key], self.owners[key]), *self.alts.pop(key, [])]
        left = [(p, o) for p, o in have if keep(p, o)]
        if left:
            self.table[key], self.owners[key] = left[0]
            if left[1:]:
                self.alts[key] = left[1:]
        else:
            del self.table[key], self.owners[key]
        return len(left) < len(have)

    def drop_owner(self, owner: object) -> None:
        for key in list(self.table):
            self._keep(key, lambda p, o: o is not owner)
        self.shapes = set()
        self.open_prefilter = False
        for key in self.table:
            self._note_shape(key)

    def _note_shape(self, key: tuple) -> None:
        first = key[0] if key else None
        if self.layout.first_tensor and isinstance(first, tuple) and len(first) == 7:
            self.shapes.add(tuple(first[1]))
        else:
            self.open_prefilter = True

    def destroy(self) -> None:
        if self.lib is not None:
            self.lib._destroy()
            self.lib = None


_grad_enabled = torch.is_grad_enabled
_deterministic = torch.are_deterministic_algorithms_enabled

# Inputs compiled code passes as Inductor holds them (engine.cast.compose, `inputs_as_held`): op -> (shape,
# strides) of first tensors a variant was proven for where the graph was traced with a contiguous one -> the
# strides compiled code asserts of the call's tensor outputs for that input (the op's meta kernel's; None:
# not known). Inside compiled code, such a call that goes to PyTorch's kernel (a miss, a declined hit, routes
# suspended) gets its first tensor made contiguous first, what PyTorch's kernel may require (CUDA
# native_group_norm rejects a channels-last input), and its outputs copied into the asserted strides (torch
# 2.11's meta kernel gives a channels-last GroupNorm output there, its CUDA kernel a contiguous one).
# Process-wide and kept: a graph compiled once may run again after its cast was removed and installed again.
# The C++ router keeps the same table.
_HELD: dict[torch._ops.OpOverload, dict[tuple[tuple[int, ...], tuple[int, ...]], tuple | None]] = {}


def mark_held(op: torch._ops.OpOverload, shape: tuple[int, ...], stride: tuple[int, ...],
              outputs: Sequence[Sequence[int] | None] | None = None) -> None:
    """Compiled code passes `op` a first tensor of this shape and strides as Inductor holds it, and asserts
    `outputs` (strides per tensor output, in return order) of what the call returns."""
    from engine.cast import cpp_router

    shape = tuple(int(s) for s in shape)
    key = (shape, key_strides(shape, tuple(int(s) for s in stride)))   # a size-1 dim's stride as guards keep it
    outs = None if outputs is None else tuple(None if o is None else tuple(int(s) for s in o) for o in outputs)
    with _LOCK:
        _HELD.setdefault(op, {})[key] = outs
    cpp_router.note_held(op, *key, outs)


def held_keys(op: torch._ops.OpOverload) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(shape, strides) of each first-tensor layout compiled code passes `op` as held."""
    return [h[:2] for h in held(op)]


def held(op: torch._ops.OpOverload) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple | None]]:
    """(shape, strides, output strides) of each first-tensor layout compiled code passes `op` as held; the
    strides as guard keys hold them (`engine.cast.guard.key_strides`: a size-1 dim's as 0)."""
    with _LOCK:
        return sorted(((shape, stride, outs) for (shape, stride), outs in _HELD.get(op, {}).items()),
                      key=lambda h: h[:2])


_NOT_KNOWN = object()


def _layout_key(args: tuple, kwargs: dict) -> tuple:
    """What an op's output strides can depend on: each tensor's dtype, shape and strides, every other value."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return (v.dtype, tuple(v.shape), v.stride())
        if isinstance(v, (list, tuple)):
            return tuple(one(x) for x in v)
        return (type(v), v) if isinstance(v, (bool, int, float, str, type(None), torch.dtype)) else repr(v)
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _meta_strides(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple | None:
    """Strides of the tensor outputs of `op`'s meta kernel on inputs laid out as these (None: no meta kernel)."""
    from torch.utils._pytree import tree_map

    def meta(v: Any) -> Any:
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") \
            if isinstance(v, torch.Tensor) else v
    try:
        out = op(*tree_map(meta, args), **tree_map(meta, kwargs))
    except Exception:  # noqa: BLE001 - no meta kernel: the outputs are left as the kernel returns them
        return None
    return tuple(tuple(t.stride()) for t in tensors_of(out))


def _in_compiled_code() -> bool:
    stack = getattr(_SCOPE, "stack", None)
    return bool(stack) and stack[-1].startswith("compile")


def _as_traced(op: torch._ops.OpOverload, args: tuple) -> tuple[tuple, tuple | None]:
    """(args with a held first tensor made contiguous, the output strides to give the result) or (args, None)."""
    first = args[0]
    if isinstance(first, torch.Tensor) and not first.is_contiguous():
        per_op = _HELD.get(op, {})
        shape = tuple(first.shape)
        key = (shape, key_strides(shape, first.stride()))
        if key in per_op:
            return (first.contiguous(), *args[1:]), per_op[key]
    return args, None


def _needs_grad(bound: Any, slots: tuple[int, ...]) -> bool:
    for i in slots:
        v = bound[i] if i < len(bound) else None
        if isinstance(v, torch.Tensor):
            if v.requires_grad:
                return True
        elif isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in v):
            return True
    return False


def rewrap_scalars(args: tuple, slots: tuple[int, ...]) -> tuple:
    """Python numbers in `Tensor` slots as 0-dim CPU tensors that promote like wrapped numbers.

    A float next to floating tensors stays float64 (0-dim tensors do not promote within a category,
    and the value keeps full precision); next to only integer tensors it takes the default dtype,
    as a wrapped number would. Tensors are cached per (value, dtype): misses repeat the same constants.
    """
    out = list(args)
    for i in slots:
        if i >= len(out):
            continue
        v = out[i]
        if isinstance(v, bool):
            dt = torch.bool
        elif isinstance(v, int):
            dt = torch.int64
        elif isinstance(v, float):
            floating = any(isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()) for a in args)
            dt = torch.float64 if floating else torch.get_default_dtype()
        elif isinstance(v, complex):
            cplx = any(isinstance(a, torch.Tensor) and a.is_complex() for a in args)
            dt = torch.complex128 if cplx or torch.get_default_dtype() == torch.float64 else torch.complex64
        else:
            continue
        key = (type(v), v, dt)
        t = _SCALARS.get(key)
        if t is None:
            t = torch.scalar_tensor(v, dtype=dt)
            if len(_SCALARS) < 256 and v == v:  # NaN never equals its key: do not cache it
                _SCALARS[key] = t
        out[i] = t
    return tuple(out)


_SCALARS: dict[tuple, torch.Tensor] = {}


# ------------------------------------------------------------------------------------- registry


def add_entries(owner: object, entries: list[tuple[str, tuple, Plan, tuple | None]],
                dispatch_key: str = "CUDA", refused: dict[str, str] | None = None) -> list[str]:
    """Route (op, key) -> plan for `owner`; returns the variant ids that another owner already covered.
    With `refused`: where torch refuses the override itself (torch 2.11 refuses one over a kernel registered
    from Python, a model's own `torch.library` op), the variant id -> why, and its calls stay PyTorch's;
    without it, that error is raised."""
    global _ENTRIES_VERSION
    shadowed = []
    with _LOCK:
        _ENTRIES_VERSION += 1
        for op_name, key, plan, shape in entries:
            route = _ROUTES.get((op_name, dispatch_key))
            if route is None:
                try:
                    route = Route(op_name, dispatch_key)
                except RuntimeError as e:
                    if refused is None:
                        raise
                    refused[plan.vid] = f"torch refused the override of {op_name}: {e}"[:300]
                    continue
                _ROUTES[(op_name, dispatch_key)] = route
            if not route.add(key, plan, owner, shape):
                shadowed.append(plan.vid)
    return shadowed


# Changes whenever entries are added or taken out: what a decision that depends on which signatures are routed
# is remembered by (engine.cast.layouts: a channels-last GroupNorm eager refused may have a variant now).
_ENTRIES_VERSION = 0


def entries_version() -> int:
    """A number that changes whenever routed entries are added or removed (by any owner)."""
    return _ENTRIES_VERSION


# Casts installed now, each by a serial number of its own: what graph routes key their graphs by, since a graph
# holds the kernels whichever casts served while it was captured (engine.cast.graphs). Not by id(): a cast
# collected and a new one at the same address would have found the old one's graphs.
_SERIALS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_NEXT_SERIAL = itertools.count(1)
_SERVING: set[int] = set()
_SERVING_TOKEN: frozenset[int] = frozenset()


def note_serving(owner: object, installed: bool) -> None:
    """Record that `owner` (a cast) was installed or removed."""
    global _SERVING_TOKEN
    with _LOCK:
        serial = _SERIALS.get(owner)
        if serial is None:
            serial = _SERIALS[owner] = next(_NEXT_SERIAL)
        (_SERVING.add if installed else _SERVING.discard)(serial)
        _SERVING_TOKEN = frozenset(_SERVING)


def serving() -> frozenset[int]:
    """The serial numbers of the casts installed now (one object, rebuilt only when one is installed or
    removed)."""
    return _SERVING_TOKEN


def remove_owner(owner: object) -> None:
    """Take `owner`'s entries out; an op left with none gets its original kernel back."""
    global _ENTRIES_VERSION
    with _LOCK:
        _ENTRIES_VERSION += 1
        for k, route in list(_ROUTES.items()):
            route.drop_owner(owner)
            if not route.table:
                route.destroy()
                del _ROUTES[k]


def routes() -> dict[tuple[str, str], Route]:
    """The installed routes by (op, dispatch key) (a copy)."""
    with _LOCK:
        return dict(_ROUTES)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Every installed override passes calls straight to the original kernel inside the block
    (eager's arm when timing the public op with and without a cast, in one process)."""
    from engine.cast import cpp_router

    with _LOCK:
        previous = {k: r.active for k, r in _ROUTES.items()}
        for r in _ROUTES.values():
            r.active = False
        cpp_before = cpp_router.set_active(False)  # ops the C++ router dispatches, too
    try:
        yield
    finally:
        with _LOCK:
            for k, r in _ROUTES.items():
                r.active = previous.get(k, True)
            cpp_router.set_active(cpp_before)
