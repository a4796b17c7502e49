"""Graph routes: a module instance's forward replayed from a CUDA graph, behind a module card's kind of guard.

Why. In eager a model pays the host for every op: Gemma 4 E2B makes 3,068 ATen calls per forward and is
host-bound; Qwen3.5's Gated DeltaNet loop makes 960 calls each of `bmm`, `copy_`, `sub`, `add`, `mul`
(docs/chains.md, "Where module cards stop"). A module card fuses a chain that is exactly one module's forward;
most of those calls sit in forwards that are not. A graph route takes a whole module's forward (a decoder
layer, an attention block) at one input signature and replays the kernels it launched, the cast's own
kernels among them where its module and op cards served during the capture, with one graph launch.

The export proves them per model class (engine/export/graph_check.py) and ships the chosen class in the cast;
`scripts/bench_graph_routes.py` measures them on their own.

The guard, per call (anything else runs the original forward, and a decline costs only speed):
- not while Dynamo or the JIT traces, a dispatch mode is active, or the current stream is being captured
  (an enclosing capture records the forward's own kernels);
- no grad needed (grad enabled and an argument or parameter requiring grad), not inside a forward-mode AD
  level; no hooks on the module, its submodules, or global module hooks;
- the exact signature of every argument, positional and keyword, through tuples, lists, dicts and
  UserDicts: per tensor (CUDA only) dtype, shape, strides and device; per plain value its type and value
  (a float zero with its sign);
  per mapping its type and keys; any other object (a cache, a dataclass) declines;
- every parameter and buffer in the module's tree the same object, with the same `_version` and data
  pointer as at capture (a graph reads them at fixed addresses), and so every tensor a module holds as a
  plain attribute (directly or in a small list or tuple: a rotary cache reassigned for a longer sequence),
  and every module-level tensor the subtree's forwards read (by the names forward_reads finds), and every
  submodule's plain attributes
  (eps, training, ...; small lists and dicts of plain values too, compared by value, so a change in place
  counts) and those of the objects they hold, one level down (a transformers config), and the plain
  module-level values the subtree's forwards read, and the functions they call, two calls deep
  (modules.forward_globals: a flag a forward branches on), as at capture. Not guarded: closure variables,
  objects two levels down, values reached only deeper in the call tree, and lists or dicts of more than 32
  items: a forward that branches on those replays what it did at capture;
- the tree as at capture (each submodule the same object, no module, parameter or buffer added);
- what picks kernels as at capture: autocast, TF32 and reduced-precision switches, float32 matmul
  precision, deterministic algorithms, cuDNN and SDPA backends, the default dtype; the current device and stream; inference
  mode; the casts installed and the target calls are made under.

A signature's first call runs the forward eagerly and returns that output; then the forward is captured
(warm-up on a side stream, then `torch.cuda.graph`) on static copies of the arguments, and replayed once on
the same arguments: the replay must equal the eager call bit for bit. A forward that writes an argument or
its module's state, changes a list or dict inside its arguments, removes a mapping argument's entry, returns
a tensor sharing storage with an argument, a parameter or another output, returns a tensor whose elements
overlap in memory (an expanded view; a slice with gaps is fine), takes an argument that is an expanded view
(a static copy of it cannot be written), or cannot be captured (a host sync, a CPU tensor) is refused for that
signature, with the reason (`stats()`). A replay copies the tensor arguments into
the static inputs, replays, and returns fresh copies of the static outputs in the forward's output structure.
Entries the forward puts into a mapping argument (Gemma 4's layers put their keys and values into a
`KVSharingDict` for later layers) are outputs too: a replay puts fresh copies of the captured ones there.
Replays of one route are serialized; every graph of a set shares one memory pool, which is safe because a
graph's outputs are copied out before the next runs.

Opt-in (`GraphSet(..., states=True)`; the export does not use it yet): an argument that is a plain object holding
tensors and plain values (a transformers static KV cache) is a *state object*. It is keyed by identity, by each
tensor's address and layout and by each plain value, and its tensors are read and written in place by the graph,
not copied in. Argument tensors on its storage are passed by reference; a mapping write of one of its tensors is
handed on as itself. A capture keeps its tensors as they were before the eager call and runs its warm-ups from
there. It puts them back before the checking replay, after which output and state must both equal the eager
call's. A forward that changes the object other than in place is refused, and one whose key changes at every call
is tried STATE_TRIES times at most. Graphs of state objects that are gone make room for new ones.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import UserDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from engine.capture.module_binding import autocast_state
from engine.cast import modules, runtime
from engine.cast.modules import _dynamo_compiling, _in_dispatch_mode, _jit_tracing

_PLAIN = (int, float, bool, str, type(None))
_grad_enabled = torch.is_grad_enabled


_C = torch._C
_SWITCHES = tuple(getattr(_C, n) for n in (
    "_get_cublas_allow_tf32", "_get_cudnn_allow_tf32", "_get_cublas_allow_fp16_reduced_precision_reduction",
    "_get_cublas_allow_bf16_reduced_precision_reduction", "_get_float32_matmul_precision",
    "_get_deterministic_algorithms", "_get_cudnn_enabled", "_get_cudnn_deterministic", "_get_cudnn_benchmark",
    "_get_flash_sdp_enabled", "_get_mem_efficient_sdp_enabled", "_get_math_sdp_enabled", "_get_cudnn_sdp_enabled")
    if hasattr(_C, n)) + (
    torch.get_default_dtype,)  # the dtype of tensors a forward makes without one (`torch.full(shape, 0.1)`)
_any_autocast = _C._is_any_autocast_enabled


def kernel_switches() -> tuple:
    """The global settings that choose which kernels an op launches (a graph keeps the ones captured)."""
    return tuple(f() for f in _SWITCHES) + ((autocast_state(),) if _any_autocast() else ())


def _plain(v: Any) -> bool:
    return isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(_plain(x) for x in v))


_VALUE_TYPES = frozenset({int, float, bool, str, type(None), torch.device, torch.dtype})
_STATE_BYTES = 2 * 2**30  # state objects a capture copies (twice) to check its replay, at most
STATE_TRIES = 3  # captures tried per state object and route


class _Signature:
    """One call's arguments in one pass: the key (structure, per tensor dtype/shape/strides/device and the
    first argument tensor on its storage, per plain value its type and value, per mapping its type and keys),
    the tensors in order, the mappings in order (dicts and UserDicts, which a forward may put entries into),
    and whether any tensor requires grad. Aliasing is in the key because the capture runs on separate static
    copies: a forward that branches on it (`x is y`) is refused for an aliased call, where the replay cannot
    equal the eager call, and a call that aliases otherwise is another signature."""

    __slots__ = ("key", "tensors", "maps", "grad", "_storages", "states", "state_keys", "state_tensors",
                 "by_ref", "_allow_states")

    def __init__(self, args: tuple, kwargs: dict, device_type: str, states: bool = False):
        key: list[Any] = []
        self.tensors: list[torch.Tensor] = []
        self.maps: list[Any] = []
        self.grad = False
        self._storages: dict[int, int] = {}  # storage address -> the first tensor on it (aliasing is keyed)
        self.states: list[Any] = []           # state objects (with `states`): a static KV cache
        self.state_keys: list[tuple] = []
        self.state_tensors: list[torch.Tensor] = []
        self._allow_states = states
        walk = self._walk
        for a in args:
            walk(a, key, device_type)
        if kwargs:
            key.append(tuple(kwargs))
            for v in kwargs.values():
                walk(v, key, device_type)
        # Argument tensors on a state object's storage (a KV cache's tensors handed on in a mapping, as Gemma 4's
        # KV-sharing layers get them) are read where they are, like the state: by reference, keyed by address.
        self.by_ref: frozenset[int] = frozenset()
        if self.state_tensors:
            held = {t.untyped_storage().data_ptr() for t in self.state_tensors}
            self.by_ref = frozenset(i for i, t in enumerate(self.tensors) if t.untyped_storage().data_ptr() in held)
            key.append(tuple((i, self.tensors[i].data_ptr()) for i in sorted(self.by_ref)))
        self.key = tuple(key)

    def _walk(self, x: Any, key: list[Any], device_type: str) -> None:
        t = type(x)
        if t is torch.Tensor or t is torch.nn.Parameter:
            d = x.get_device()  # -1 on the CPU
            if (d < 0) != (device_type == "cpu"):
                raise TypeError("a tensor off the GPU")
            p = x.untyped_storage().data_ptr()
            key.append((x.dtype, x.shape, x.stride(), d, self._storages.setdefault(p, len(self.tensors))))
            self.tensors.append(x)
            if x.requires_grad:
                self.grad = True
        elif t in _VALUE_TYPES:
            key.append((t, x) if t is not float else _float_key(x))
        elif t is tuple or t is list:
            key.append((t, len(x)))
            for y in x:
                self._walk(y, key, device_type)
        elif isinstance(x, (dict, UserDict)):
            self.maps.append(x)
            key.append((t, tuple(x)))
            for y in x.values():
                self._walk(y, key, device_type)
        elif isinstance(x, torch.Tensor):
            raise TypeError("a tensor subclass argument")
        elif self._allow_states and _stateful(x):
            # A state object (a static KV cache): the same object each call, its tensors read and written in
            # place at their addresses by the graph; keyed by identity and by what it holds now.
            self.states.append(x)
            self.state_keys.append(state_key(x, device_type, self.state_tensors))
            key.append((t, id(x), self.state_keys[-1]))
        else:
            raise TypeError(f"a {t.__name__} argument")


def _float_key(x: float) -> tuple:
    """A float argument as a key: a zero with its sign (0.0 == -0.0, but `h * alpha` gives zeros of alpha's sign),
    and NaN as one key (NaN != NaN: every call with a NaN was a new signature, captured again until the module's
    graphs were used up)."""
    if x != x:
        return (float, "nan")
    return (float, x, math.copysign(1.0, x)) if x == 0 else (float, x)


def _stateful(x: Any) -> bool:
    return (isinstance(getattr(x, "__dict__", None), dict) and not isinstance(x, (torch.nn.Module, type))
            and not callable(x))


_STATE_DEPTH, _STATE_ITEMS = 4, 256


def state_key(obj: Any, device_type: str, tensors: list[torch.Tensor] | None = None, depth: int = 0) -> tuple:
    """What a state object holds, as a key: per tensor its address, dtype, shape, strides and device, per plain
    value the value, through lists, tuples, dicts and the objects they hold (at most 4 levels and 256 items
    each); `tensors` gets its tensors in that order. Anything else (a function, a module) is a TypeError."""
    out = [] if tensors is None else tensors

    def walk(x: Any, d: int) -> Any:
        t = type(x)
        if t is torch.Tensor or t is torch.nn.Parameter:
            dev = x.get_device()
            if (dev < 0) != (device_type == "cpu"):
                raise TypeError("a tensor off the GPU in a state object")
            out.append(x)
            return ("T", x.data_ptr(), x.dtype, x.shape, x.stride(), dev)
        if t in _VALUE_TYPES:
            return x if t is not float or (x == x and x != 0) else _float_key(x)
        if d >= _STATE_DEPTH:
            raise TypeError("a state object nested too deep")
        if t in (list, tuple):
            if len(x) > _STATE_ITEMS:
                raise TypeError("a state object with too many items")
            return (t, tuple(walk(y, d + 1) for y in x))
        if t is dict:
            if len(x) > _STATE_ITEMS:
                raise TypeError("a state object with too many items")
            return (t, tuple((k, walk(v, d + 1)) for k, v in x.items()))
        if _stateful(x):
            return (t, tuple((k, walk(v, d + 1)) for k, v in sorted(vars(x).items())))
        raise TypeError(f"a {t.__name__} inside a state object")

    return walk(obj, depth)


def _rebuild(x: Any, tensors: Iterator[torch.Tensor], maps: list[Any], states: frozenset = frozenset()) -> Any:
    """`x` (an argument) over other tensors, in the order _Signature walked them; its mappings are new
    objects of the same types, appended to `maps` in walk order; state objects (ids in `states`) as they are."""
    t = type(x)
    if t is torch.Tensor or t is torch.nn.Parameter:
        return next(tensors)
    if t in _VALUE_TYPES or id(x) in states:
        return x
    if t is tuple or t is list:
        return t(_rebuild(y, tensors, maps, states) for y in x)
    m = t()  # a dict or UserDict (others never reach here): a type that needs arguments raises TypeError
    maps.append(m)
    for k, v in list(x.items()):
        m[k] = _rebuild(v, tensors, maps, states)
    return m


class CudaGraphs:
    """Capture and replay with torch.cuda.graph (the real backend; tests of the guard pass a stand-in)."""

    device_type = "cuda"

    def __init__(self) -> None:
        self.pools: dict[int, Any] = {}  # per device: one pool for every graph of the set

    def stream(self) -> Any:
        return _C._cuda_getCurrentRawStream(torch.cuda.current_device())

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        """(replay, static output) of `fn`, which reads and writes only static buffers."""
        dev = torch.cuda.current_device()
        if dev not in self.pools:
            self.pools[dev] = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits, cuBLAS workspaces, autotuners
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pools[dev], capture_error_mode="thread_local"):
            out = fn()
        return g.replay, out


@dataclass
class _Graph:
    replay: Callable[[], None]
    static: list[torch.Tensor]        # the static copies of the call's tensors, in _Signature's order
    out: list[Any]                    # the flattened static output
    out_spec: Any
    writes: list[tuple[int, Any, Any]] = field(default_factory=list)  # (mapping argument, key, its static mapping)
    single: bool = False              # the output is one tensor
    replays: int = 0
    states: tuple = ()                # weak references to the state objects it reads and writes in place
    copied: tuple | None = None       # with state objects: the inputs copied in (the others are read in place)
    kept: frozenset = frozenset()     # ids of state tensors a mapping write hands on as they are


@dataclass
class RouteStats:
    replays: int = 0
    eager_calls: int = 0                                   # calls the guard sent to the original forward
    captured: int = 0
    declines: dict[str, int] = field(default_factory=dict)  # why a call ran the original forward
    refused: dict[str, str] = field(default_factory=dict)   # signature (short) -> why it is not captured

    def decline(self, why: str) -> None:
        self.declines[why] = self.declines.get(why, 0) + 1
        self.eager_calls += 1


class GraphRoute(modules.NotCopied):
    """The route of one module (engine.cast.modules.attach): the guard, then a replay of the graph for the
    call's signature."""

    def __init__(self, module: torch.nn.Module, path: str, backend: Any, max_graphs: int = 4,
                 states: bool = False):
        self.path = path
        self.states = states  # state objects among the arguments (a static KV cache): see _capture
        # captures tried per state object: one whose plain values change at every call (a Python step counter,
        # as transformers' static sliding-window layers keep) would otherwise be captured anew at every call
        self._state_tries: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.module = weakref.ref(module)
        self.cls = type(module)
        self._forward = modules.class_forward(self.cls)
        self.backend = backend
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.refused: set[tuple] = set()
        self.stats = RouteStats()
        self.active = True
        self._lock = threading.RLock()
        mods = list(module.modules())
        self.hooks = modules.HookWatch(mods)
        self.tensors = [(holder.__dict__[where], name, t, _version_of(t), t.data_ptr())
                        for holder in mods for where in ("_parameters", "_buffers")
                        for name, t in holder.__dict__[where].items() if t is not None]
        # tensors a module holds as plain attributes (a rotary cache some models reassign when a longer
        # sequence comes): a graph reads them at the address they had at capture
        self.tensor_attrs = [(d, name, t, _version_of(t), t.data_ptr()) for d, name, t in _tensor_attrs(mods)]
        # and module-level tensors the subtree's forwards read (a global mask table), likewise
        self.global_tensors = [(g, k, g[k], _version_of(g[k]), g[k].data_ptr())
                               for cls in {type(m) for m in mods} for g, k in modules.forward_tensors(cls)]
        # the tree itself: each module's submodules by identity, and how many submodules, parameters and
        # buffers each holds (a module swapped or added after the capture is not in its graph)
        # the module-level values the subtree's forwards read (a flag a forward branches on), as at capture
        reads = [(g, k, g[k]) for cls in {type(m) for m in mods} for g, k in modules.forward_reads(cls)]
        self.attrs = modules.grouped(_plain_state(mods) + reads
                                     + [(m._modules, k, v) for m in mods for k, v in m._modules.items()])
        self.counts = [(m.__dict__[t], len(m.__dict__[t])) for m in mods for t in _MODULE_TABLES_COUNTED]
        self.switches = kernel_switches()

    def original(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(self.module(), *args, **kwargs)

    def _why_not(self, grad: bool) -> str | None:
        """Why this call may not replay a graph (None: it may), its arguments' signature and tracing (checked
        first, in __call__) aside; `grad`: an argument requires grad."""
        if self.backend.capturing():
            return "inside another capture"
        if self.hooks():
            return "hooks"
        if _grad_enabled() and (grad or any(t.requires_grad for _, _, t, _, _ in self.tensors)):
            return "grad"
        if modules._forward_ad._current_level >= 0:  # a replay's outputs carry no tangent
            return "forward AD"
        for d, name, t, version, ptr in self.tensors:
            if d.get(name) is not t or (version >= 0 and t._version != version) or t.data_ptr() != ptr:
                return "parameters changed"
        for d, name, t, version, ptr in self.tensor_attrs:
            if _held(d, name) is not t or (version >= 0 and t._version != version) or t.data_ptr() != ptr:
                return "tensor attributes changed"
        for g, name, t, version, ptr in self.global_tensors:
            if g.get(name) is not t or (version >= 0 and t._version != version) or t.data_ptr() != ptr:
                return "globals changed"
        for d, n in self.counts:
            if len(d) != n:
                return "modules changed"
        try:
            for d, get, values, _ in self.attrs:
                if get(d) != values:
                    return "attributes changed"
        except (KeyError, AttributeError):  # deleted (an attribute of an object with slots: AttributeError)
            return "attributes changed"
        if kernel_switches() != self.switches:
            return "kernel switches changed"
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # First, before anything reads the arguments: Dynamo tracing this call sees only the original forward
        # (reading a tensor's storage address here would break its graph).
        if _dynamo_compiling():
            return self.original(*args, **kwargs)
        if not self.active or _in_dispatch_mode() or _jit_tracing():
            self.stats.decline("tracing or inactive")
            return self.original(*args, **kwargs)
        try:
            sig = _Signature(args, kwargs, self.backend.device_type, self.states)
        except TypeError as e:
            self.stats.decline(str(e))
            return self.original(*args, **kwargs)
        why = self._why_not(sig.grad)
        if why is not None:
            self.stats.decline(why)
            return self.original(*args, **kwargs)
        key = (sig.key, self.backend.stream(), runtime.serving(), _inference_mode(), runtime.current_target())
        with self._lock:
            g = self.graphs.get(key)
            if g is None:
                if key in self.refused:
                    self.stats.decline("signature refused")
                    return self.original(*args, **kwargs)
                if sig.states and not self._try_state(sig.states[0]):
                    self.stats.decline("a state object that changes between calls")
                    return self.original(*args, **kwargs)
                if len(self.graphs) >= self.max_graphs:  # first let go of graphs of state objects now gone
                    for k in [k for k, g in self.graphs.items() if any(r() is None for r in g.states)]:
                        del self.graphs[k]
                if len(self.graphs) >= self.max_graphs:
                    self.stats.decline("graphs per module used up")
                    return self.original(*args, **kwargs)
                return self._capture(key, sig, args, kwargs)
            if g.copied is not None:
                if g.copied:
                    torch._foreach_copy_([g.static[i] for i in g.copied], [sig.tensors[i] for i in g.copied])
            elif sig.tensors:
                torch._foreach_copy_(g.static, sig.tensors)
            g.replay()
            g.replays += 1
            self.stats.replays += 1
            for m, name, smap in g.writes:  # what the forward put into a mapping argument: the capture's tensors
                written, spec = tree_flatten(smap[name])
                sig.maps[m][name] = tree_unflatten(_fresh_all(written, g.kept), spec)
            if g.single:
                return _fresh_all(g.out)[0]
            return tree_unflatten(_fresh_all(g.out), g.out_spec)

    def _try_state(self, obj: Any) -> bool:
        """Whether another capture may be tried for this state object (at most STATE_TRIES: a prefill, the first
        decode step, one more shape)."""
        try:
            n = self._state_tries.get(obj, 0)
            self._state_tries[obj] = n + 1
        except TypeError:  # not weakly referable or not hashable: no count kept
            return True
        return n < STATE_TRIES

    def _restore_tensor_attrs(self, held: list[tuple[dict, Any, torch.Tensor]]) -> bool:
        """Put back the tensor attributes the eager call left (`held`) where the captured call replaced one;
        whether it had (or added another)."""
        changed = False
        for d, key, t in held:
            if _held(d, key) is not t:
                changed = True
                if not isinstance(key, tuple):
                    d[key] = t
                elif isinstance(d.get(key[0]), (list, dict)):
                    d[key[0]][key[1]] = t
        now = _tensor_attrs(list(self.module().modules()))
        return changed or len(now) != len(held)

    def _refuse(self, key: tuple, why: str) -> None:
        self.refused.add(key)
        self.stats.refused[f"#{len(self.stats.refused) + 1}"] = why
        self.stats.eager_calls += 1

    def _capture(self, key: tuple, sig: _Signature, args: tuple, kwargs: dict) -> Any:
        """The first call of a signature: eager, then capture and check; returns the eager output."""
        inputs = sig.tensors
        versions = [_written_mark(x) for x in inputs]
        before = [dict(m.items()) for m in sig.maps]
        containers = _containers((args, kwargs), skip={id(m) for m in sig.maps})
        if any(_expanded(x) for i, x in enumerate(inputs) if i not in sig.by_ref):
            # A static copy with those strides cannot be written (copy_ refuses a destination whose elements
            # share memory): the call raised where eager runs. Its signature (strides in the key) stays eager.
            ref = self.original(*args, **kwargs)
            self._refuse(key, "an argument whose elements share memory (an expanded view)")
            return ref
        # the static arguments, rebuilt before the call (which may put entries into a mapping argument)
        static = [x if i in sig.by_ref else torch.empty_strided(x.shape, x.stride(), dtype=x.dtype,
                                                                  device=x.device).copy_(x)
                  for i, x in enumerate(inputs)]
        smaps: list[Any] = []
        try:
            it = iter(static)
            ids = frozenset(id(o) for o in sig.states)
            sargs = tuple(_rebuild(a, it, smaps, ids) for a in args)
            skw = {k: _rebuild(v, it, smaps, ids) for k, v in kwargs.items()}
            problem = None
        except TypeError as e:
            problem = f"a mapping argument that cannot be rebuilt: {e}"
        entries = [dict(m.items()) for m in smaps]
        # State objects (a static KV cache): the eager call, the capture's own runs and the checking replay each
        # write them in place. Their tensors as before the call are kept, put back before the checking replay,
        # and after it they must hold what the eager call left, as the output must equal its output.
        before_states = None
        if sig.states:
            size = sum(t.numel() * t.element_size() for t in sig.state_tensors)
            if size > _STATE_BYTES:
                ref = self.original(*args, **kwargs)
                self._refuse(key, f"state objects of {size / 2**30:.1f} GiB, more than a capture may copy")
                return ref
            before_states = [t.clone() for t in sig.state_tensors]
        ref = self.original(*args, **kwargs)
        after_states = None
        if before_states is not None:
            try:
                now = [state_key(o, self.backend.device_type) for o in sig.states]
            except TypeError as e:
                now = [str(e)]
            if now != sig.state_keys:  # a value, or which tensors it holds: a replay would not redo that
                self._refuse(key, "the forward changes a state object other than in place")
                return ref
            after_states = [t.clone() for t in sig.state_tensors]
        if problem is not None:
            self._refuse(key, problem)
            return ref
        if any(_written(x, v) for i, (x, v) in enumerate(zip(inputs, versions)) if i not in sig.by_ref):
            self._refuse(key, "the forward writes an argument")
            return ref
        if self._why_not(False) is not None:  # the state the guard holds, as it was before this call
            self._refuse(key, "the forward changes its module's parameters, buffers or attributes")
            return ref
        # Tensors the call put into attributes for the first time (a cache built on first use) are guarded
        # from now on; if the captured call puts others there again, the forward keeps what it computed.
        held = _tensor_attrs(list(self.module().modules()))
        self.tensor_attrs = [(d, name, t, _version_of(t), t.data_ptr()) for d, name, t in held]
        if any(_snapshot(c) != snap for c, snap in containers):
            self._refuse(key, "the forward changes a list or dict inside its arguments")
            return ref
        written: list[tuple[int, Any]] = []
        for n, (m, old) in enumerate(zip(sig.maps, before)):
            if any(k not in m for k in old):
                self._refuse(key, "the forward removes an entry of a mapping argument")
                return ref
            written += [(n, k) for k, v in m.items() if k not in old or old[k] is not v]
        ref_flat, ref_spec = tree_flatten(ref)
        ref_written = [tree_flatten(sig.maps[n][k]) for n, k in written]
        # A mapping write that is one of the state's own tensors (a cache handing its keys on) is handed on as it
        # is at each replay; anything else sharing the state's storage is a problem like any shared output.
        kept = frozenset(id(t) for t in sig.state_tensors)
        handed = [x for w, _ in ref_written for x in w if not (isinstance(x, torch.Tensor) and id(x) in kept)]
        why = _outputs_problem(ref_flat + handed, [x for i, x in enumerate(inputs) if i not in sig.by_ref]
                               + sig.state_tensors,
                               [t for _, _, t, _, _ in self.tensors], self.backend.device_type)
        if why is not None:
            self._refuse(key, why)
            return ref

        warming = [before_states is not None]

        def forward() -> Any:
            for m, e in zip(smaps, entries):  # each call starts from the mappings' entries as passed
                m.clear()
                m.update(e)
            if warming[0] and not self.backend.capturing():
                # the capture's warm-up runs start from the state the eager call started from (a cache near its
                # end would otherwise be written past it); the captured run itself is recorded, not run
                torch._foreach_copy_(sig.state_tensors, before_states)
            return self.original(*sargs, **skw)

        try:
            # Captured under the target the eager call ran under (where no scope is open, eager's, not
            # "cuda-graphs"), so that the cast's kernels which served that call are the ones captured. Their
            # guards are evaluated once, here; this route's guard holds what they depend on at every replay
            # (the signature, the subtree's parameters and attributes, hooks, grad, autocast) and the key holds
            # which casts are installed.
            try:
                with runtime.target_scope(key[-1]):
                    replay, sout = self.backend.capture(forward)
            finally:
                warming[0] = False
            if before_states is not None:
                torch._foreach_copy_(sig.state_tensors, before_states)
            for x, y in zip(static, inputs):
                x.copy_(y)
            replay()
            swritten = [tree_flatten(smaps[n][k]) for n, k in written]  # the capture's own output tensors
        except Exception as e:  # a host sync, a CPU tensor, an op capture does not allow
            self._restore_tensor_attrs(held)
            if after_states is not None:
                torch._foreach_copy_(sig.state_tensors, after_states)
            self._refuse(key, f"not capturable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return ref
        if after_states is not None and not all(_values_equal(t, a) for t, a in zip(sig.state_tensors, after_states)):
            torch._foreach_copy_(sig.state_tensors, after_states)
            self._refuse(key, "the replay leaves a state object otherwise than the eager call")
            return ref
        if self._restore_tensor_attrs(held):  # a replay would not assign them: readers would see stale ones
            self._refuse(key, "the forward changes its module's parameters, buffers or attributes")
            return ref
        out_flat, out_spec = tree_flatten(sout)
        same = out_spec == ref_spec and all(_same(a, b) for a, b in zip(out_flat, ref_flat)) and all(
            s == r and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
            for (a, s), (b, r) in zip(swritten, ref_written))
        if not same:
            if after_states is not None:
                torch._foreach_copy_(sig.state_tensors, after_states)
            self._refuse(key, "the replay differs from the eager call")
            return ref
        writes = [(n, k, smaps[n]) for n, k in written]
        single = len(out_flat) == 1 and isinstance(out_flat[0], torch.Tensor) and out_spec.is_leaf()
        self.graphs[key] = _Graph(replay, static, out_flat, out_spec, writes, single,
                                  states=tuple(weakref.ref(o) for o in sig.states),
                                  copied=tuple(i for i in range(len(static)) if i not in sig.by_ref)
                                  if sig.states else None, kept=kept if sig.states else frozenset())
        self.stats.captured += 1
        self.stats.eager_calls += 1
        return ref


_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def _tensor_attrs(mods: list[torch.nn.Module]) -> list[tuple[dict, Any, torch.Tensor]]:
    """(where, key, tensor) for each tensor the modules hold as a plain attribute, directly or in a list, tuple
    or dict of up to modules._SMALL items (key (name, index or dict key) then); parameters and buffers are not
    here."""
    out: list[tuple[dict, Any, torch.Tensor]] = []
    for m in mods:
        for k, v in m.__dict__.items():
            if k in _MODULE_TABLES:
                continue   # the module's own tables (its parameters and buffers are `GraphRoute.tensors`)
            if isinstance(v, torch.Tensor):
                out.append((m.__dict__, k, v))
            elif isinstance(v, (list, tuple)) and len(v) <= modules._SMALL:
                out += [(m.__dict__, (k, i), x) for i, x in enumerate(v) if isinstance(x, torch.Tensor)]
            elif type(v) is dict and len(v) <= modules._SMALL:
                out += [(m.__dict__, (k, i), x) for i, x in v.items() if isinstance(x, torch.Tensor)]
    return out


def _held(d: dict, key: Any) -> Any:
    """What `_tensor_attrs` found at `key` in `d` now (None where it is gone)."""
    if not isinstance(key, tuple):
        return d.get(key)
    seq = d.get(key[0])
    if type(seq) is dict:
        return seq.get(key[1])
    return seq[key[1]] if isinstance(seq, (list, tuple)) and isinstance(key[1], int) and len(seq) > key[1] else None


def _version_of(t: torch.Tensor) -> int:
    """The version counter, or -1 for an inference tensor (a model built under inference_mode), which keeps
    none: a graph reads its values at replay, so an in-place change is still what the replay computes with."""
    return -1 if t.is_inference() else t._version


def _written_mark(x: torch.Tensor) -> Any:
    """What tells whether a call wrote `x`: its version counter, or for an inference tensor (which keeps
    none) a copy of its values."""
    return x.clone() if x.is_inference() else x._version


def _written(x: torch.Tensor, mark: Any) -> bool:
    return not _values_equal(x, mark) if isinstance(mark, torch.Tensor) else x._version != mark


def _snapshot(c: Any) -> tuple:
    return tuple((k, id(v)) for k, v in c.items()) if isinstance(c, (dict, UserDict)) else tuple(map(id, c))


def _containers(tree: Any, skip: set[int], out: list | None = None) -> list[tuple[Any, tuple]]:
    """Every list and dict reachable through the arguments' lists, tuples and dicts, with its items' identities."""
    out = [] if out is None else out
    if isinstance(tree, (list, tuple, dict, UserDict)):
        if not isinstance(tree, tuple) and id(tree) not in skip:
            out.append((tree, _snapshot(tree)))
        for v in (tree.values() if isinstance(tree, (dict, UserDict)) else tree):
            _containers(v, skip, out)
    return out


def _fresh_all(xs: list[Any], keep: frozenset = frozenset()) -> list[Any]:
    """Copies of the tensors among `xs` (one foreach copy for all), the other items (and tensors whose id is in
    `keep`: a state object's own) as they are."""
    at = [i for i, x in enumerate(xs) if isinstance(x, torch.Tensor) and id(x) not in keep]
    if not at:
        return list(xs)
    new = [torch.empty_strided(xs[i].shape, xs[i].stride(), dtype=xs[i].dtype, device=xs[i].device) for i in at]
    torch._foreach_copy_(new, [xs[i] for i in at])
    out = list(xs)
    for i, t in zip(at, new):
        out[i] = t
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if not isinstance(a, torch.Tensor):
        return a == b if _plain(a) else a is b
    return a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype and _values_equal(a, b)


def _values_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (bit for bit up to NaN payloads)."""
    return bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                      and torch.equal(a.nan_to_num(), b.nan_to_num())))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _outputs_problem(outs: list[Any], inputs: list[torch.Tensor], params: list[torch.Tensor],
                     device_type: str = "cuda") -> str | None:
    tensors = [t for t in outs if isinstance(t, torch.Tensor)]
    if not tensors:
        return "the forward returns no tensor"
    held = {_storage(t) for t in inputs} | {_storage(t) for t in params}
    seen: set[int] = set()
    for t in tensors:
        if t.device.type != device_type:
            return "an output off the GPU"
        if _overlaps(t):
            return "an output whose elements overlap in memory (an expanded view)"
        s = _storage(t)
        if s in held:
            return "an output shares storage with an argument or a parameter"
        if s in seen:
            return "two outputs share storage"
        seen.add(s)
    for x in outs:
        if not isinstance(x, torch.Tensor) and not _plain(x):
            return f"a {type(x).__name__} in the output"
    return None


def _expanded(t: torch.Tensor) -> bool:
    """Whether `t` has a dim of stride 0 and size above 1 (an `expand`): what copy_ refuses to write into."""
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of `t` may share memory (a stride 0, an expand): a replay's fresh copy of such an
    output (empty_strided with its strides) could not be written. Views with gaps (a slice, a chunk of a
    wider projection) are fine: the copy keeps their strides, as eager's output has them."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1)
    extent = 1
    for st, n in dims:
        if st < extent:
            return True
        extent = st * (n - 1) + extent
    return False


def _plain_state(mods: list[torch.nn.Module]) -> list[tuple[dict, str, Any]]:
    """(namespace, name, value) of every plain attribute a forward may read: the modules' own (eps, training,
    ...), and those of the other objects they hold, one level down (`modules.held_object_state`: a transformers
    config, whose `_attn_implementation` and flags a forward reads at every call)."""
    own = [(m.__dict__, k, v) for m in mods for k, v in m.__dict__.items()
           if k != "forward" and k != modules.ROUTE_ATTR and k not in _MODULE_TABLES and modules.plain_value(v)]
    return own + modules.held_object_state(mods)


_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
_MODULE_TABLES_COUNTED = ("_modules", "_parameters", "_buffers")
_inference_mode = torch.is_inference_mode_enabled
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def repeated_classes(model: torch.nn.Module, least: int = 2) -> list[str]:
    """Classes of the model's modules worth routing, the largest first: a class with at least `least` instances
    that have submodules of their own (decoder layers, blocks, attention modules), the root and containers
    (ModuleList, Sequential, ModuleDict) left out; ordered by the most modules one instance holds."""
    size: dict[str, int] = {}
    count: dict[str, int] = {}
    for path, m in model.named_modules():
        if not path or isinstance(m, _CONTAINERS) or not any(True for _ in m.children()):
            continue
        name = type(m).__name__
        count[name] = count.get(name, 0) + 1
        size[name] = max(size.get(name, 0), sum(1 for _ in m.modules()))
    return sorted((n for n, c in count.items() if c >= least), key=lambda n: (-size[n], n))


def route_candidates(model: torch.nn.Module) -> list[str]:
    """Classes to try routing, in order: the model's own class (its whole forward as one graph, where the host's
    cost of every op goes at once), then its repeated classes (repeated_classes), for a forward the whole
    model's route cannot take (a host sync or a capture-dependent path outside the layers). A forward with a
    KV cache object (use_cache=True) declines at every level: the model passes it to each layer."""
    root = type(model).__name__
    return [root] + [c for c in repeated_classes(model) if c != root]


class GraphSet(modules.RouteSet):
    """Graph routes installed on a model's modules (the outermost of those `select` picks: a module inside one
    routed is in that graph), sharing one pool."""

    def __init__(self, model: torch.nn.Module, select: Callable[[str, torch.nn.Module], bool],
                 backend: Any = None, max_graphs: int = 4, states: bool = False):
        self.backend = backend if backend is not None else CudaGraphs()
        self._max_graphs = max_graphs
        self._states = states
        super().__init__(model, select)

    def make_route(self, path: str, module: torch.nn.Module) -> GraphRoute:
        return GraphRoute(module, path, self.backend, self._max_graphs, self._states)

    def reset_counters(self) -> None:
        """Replays, eager calls and declines from now on; the graphs held and why a signature was refused stay
        (they are state, not counts)."""
        for r in self.routes.values():
            r.stats.replays = r.stats.eager_calls = 0
            r.stats.declines = {}

    def summary(self) -> dict[str, Any]:
        """The routes' counters summed over the modules: modules routed, those that replayed, replays, eager
        calls, declines by reason, and the distinct reasons a signature was refused."""
        st = self.stats().values()
        declines: dict[str, int] = {}
        for s in st:
            for why, n in s["declines"].items():
                declines[why] = declines.get(why, 0) + n
        return {"modules": len(self.routes), "replaying": sum(1 for s in st if s["replays"]),
                "replays": sum(s["replays"] for s in st), "eager_calls": sum(s["eager_calls"] for s in st),
                "declines": declines, "refused": sorted({w for s in st for w in s["refused"].values()})}

    def stats(self) -> dict[str, Any]:
        out = {}
        for path, r in self.routes.items():
            s = r.stats
            out[path] = {"replays": s.replays, "eager_calls": s.eager_calls, "captured": s.captured,
                         "declines": dict(s.declines), "refused": dict(s.refused)}
        return out

    def paths(self) -> Iterator[str]:
        return iter(self.routes)
