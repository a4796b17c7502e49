"""Graph routes: a module instance's forward replayed from a CUDA graph, behind a module card's kind of guard.

Why. In eager a model pays the host for every op: Gemma 4 E2B makes 3,068 ATen calls per forward and is
host-bound; Qwen3.5's Gated DeltaNet loop makes 960 calls each of `bmm`, `copy_`, `sub`, `add`, `mul`
(docs/chains.md, "Where module cards stop"). A module card fuses a chain that is exactly one module's forward;
most of those calls sit in forwards that are not. A graph route takes a whole module's forward (a decoder
layer, an attention block) at one input signature and replays the kernels it launched, the cast's own
kernels among them where its module and op cards served during the capture, with one graph launch.

This is the mechanism and its guard, for measuring the lever (`scripts/bench_graph_routes.py`); the export
does not yet prove or ship graph routes as cards.

The guard, per call (anything else runs the original forward, and a decline costs only speed):
- not while Dynamo or the JIT traces, a dispatch mode is active, or the current stream is being captured
  (an enclosing capture records the forward's own kernels);
- no grad needed (grad enabled and an argument or parameter requiring grad); no hooks on the module, its
  submodules, or global module hooks;
- the exact signature of every argument, positional and keyword: per tensor (CUDA only) dtype, shape,
  strides, alignment, device, neg/conj bits and requires_grad; per plain value its value; any other
  object (a cache, a dataclass) declines;
- every parameter and buffer in the module's tree the same object, with the same `_version` and data
  pointer as at capture (a graph reads them at fixed addresses), and every submodule's plain attributes
  (eps, training, ...) as at capture;
- what picks kernels as at capture: autocast, TF32 and reduced-precision switches, float32 matmul
  precision, deterministic algorithms, cuDNN and SDPA backends; and the current device and stream.

A signature's first call runs the forward eagerly and returns that output; then the forward is captured
(warm-up on a side stream, then `torch.cuda.graph`) on static copies of the arguments, and replayed once on
the same arguments: the replay must equal the eager call bit for bit. A forward that writes an argument,
returns a tensor sharing storage with an argument, a parameter or another output, returns a tensor that is
not dense, or cannot be captured (a host sync, a CPU tensor) is declined for that signature, with the reason
(`stats()`). A replay copies the tensor arguments into the static inputs, replays, and returns fresh copies
of the static outputs in the forward's output structure. Replays of one route are serialized; every graph of
a set shares one memory pool, which is safe because a graph's outputs are copied out before the next runs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.modules.module as _mm
from torch.utils._pytree import tree_flatten, tree_unflatten

from engine.capture.module_binding import autocast_state
from engine.cast.guard import tensor_key, value_key

_MM_GLOBALS = _mm.__dict__
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called")
_PLAIN = (int, float, bool, str, type(None))
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_in_dispatch_mode = torch._C._len_torch_dispatch_stack
_jit_tracing = torch._C._get_tracing_state


def kernel_switches() -> tuple:
    """The global settings that choose which kernels an op launches (a graph keeps the ones captured)."""
    b = torch.backends
    sdp = tuple(f() for f in (getattr(b.cuda, n, None) for n in ("flash_sdp_enabled", "mem_efficient_sdp_enabled",
                                                                  "math_sdp_enabled", "cudnn_sdp_enabled")) if f)
    return (autocast_state(), b.cuda.matmul.allow_tf32, b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            b.cuda.matmul.allow_bf16_reduced_precision_reduction, torch.get_float32_matmul_precision(),
            torch.are_deterministic_algorithms_enabled(), b.cudnn.enabled, b.cudnn.allow_tf32,
            b.cudnn.deterministic, b.cudnn.benchmark, sdp)


def _plain(v: Any) -> bool:
    return isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(_plain(x) for x in v))


def _arg_key(x: Any, device_type: str) -> Any:
    if isinstance(x, torch.Tensor):
        if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.device.type != device_type:
            raise TypeError("a tensor subclass or a tensor off the GPU")
        return ("t", tensor_key(x), x.requires_grad)
    if _plain(x) or isinstance(x, (list, torch.device, torch.dtype)):
        return ("v", value_key(x))
    raise TypeError(f"a {type(x).__name__} argument")


class CudaGraphs:
    """Capture and replay with torch.cuda.graph (the real backend; tests of the guard pass a stand-in)."""

    device_type = "cuda"

    def __init__(self) -> None:
        self.pool = None

    def stream(self) -> Any:
        return torch.cuda.current_stream().cuda_stream

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def capture(self, fn: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        """(replay, static output) of `fn`, which reads and writes only static buffers."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: lazy inits, cuBLAS workspaces, autotuners
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
            out = fn()
        return g.replay, out


@dataclass
class _Graph:
    replay: Callable[[], None]
    static: list[Any]                 # the flattened arguments: static tensors where the call had tensors
    tensor_at: list[int]              # positions in `static` holding tensors
    out: list[Any]                    # the flattened static output
    out_spec: Any
    stream: Any
    replays: int = 0


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


class GraphRoute:
    """The instance `forward` of one module: the guard, then a replay of the graph for the call's signature."""

    def __init__(self, module: torch.nn.Module, path: str, backend: Any, max_graphs: int = 4):
        self.path = path
        self.module = weakref.ref(module)
        self._forward = type(module).forward
        self.backend = backend
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.refused: set[tuple] = set()
        self.stats = RouteStats()
        self.active = True
        self._lock = threading.RLock()
        mods = list(module.modules())
        self.hooked = [weakref.ref(m) for m in mods]
        self.tensors = [(holder.__dict__[where], name, t, t._version, t.data_ptr())
                        for holder in mods for where in ("_parameters", "_buffers")
                        for name, t in holder.__dict__[where].items() if t is not None]
        self.attrs = [(m.__dict__, k, v) for m in mods for k, v in m.__dict__.items()
                      if not k.startswith("_") and k != "forward" and _plain(v)]
        self.switches = kernel_switches()
        self.device = next((t.device for _, _, t, _, _ in self.tensors if t.is_cuda), None)

    def original(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(self.module(), *args, **kwargs)

    def _why_not(self, flat: list[Any]) -> str | None:
        """Why this call may not replay a graph (None: it may), the signature aside."""
        if not self.active or _dynamo_compiling() or _in_dispatch_mode() or _jit_tracing():
            return "tracing or inactive"
        if self.backend.capturing():
            return "inside another capture"
        g = _MM_GLOBALS
        if any(g.get(n) for n in _GLOBAL_HOOKS):
            return "hooks"
        for ref in self.hooked:
            m = ref()
            if m is None or m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
                return "hooks"
        if torch.is_grad_enabled() and (any(isinstance(x, torch.Tensor) and x.requires_grad for x in flat)
                                        or any(t.requires_grad for _, _, t, _, _ in self.tensors)):
            return "grad"
        for d, name, t, version, ptr in self.tensors:
            if d.get(name) is not t or t._version != version or t.data_ptr() != ptr:
                return "parameters changed"
        for d, k, v in self.attrs:
            if d.get(k, _MISSING) != v:
                return "attributes changed"
        if kernel_switches() != self.switches:
            return "kernel switches changed"
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat, spec = tree_flatten((args, kwargs))
        why = self._why_not(flat)
        if why is not None:
            self.stats.decline(why)
            return self.original(*args, **kwargs)
        try:
            key = (spec, tuple(_arg_key(x, self.backend.device_type) for x in flat), self.backend.stream())
        except TypeError as e:
            self.stats.decline(str(e).split(" (")[0])
            return self.original(*args, **kwargs)
        with self._lock:
            g = self.graphs.get(key)
            if g is None:
                if key in self.refused:
                    self.stats.decline("signature refused")
                    return self.original(*args, **kwargs)
                if len(self.graphs) >= self.max_graphs:
                    self.stats.decline("graphs per module used up")
                    return self.original(*args, **kwargs)
                return self._capture(key, flat, spec, args, kwargs)
            for i in g.tensor_at:
                g.static[i].copy_(flat[i])
            g.replay()
            g.replays += 1
            self.stats.replays += 1
            out = [_fresh(x) if isinstance(x, torch.Tensor) else x for x in g.out]
            return tree_unflatten(out, g.out_spec)

    def _refuse(self, key: tuple, why: str) -> None:
        self.refused.add(key)
        self.stats.refused[f"#{len(self.stats.refused) + 1}"] = why
        self.stats.eager_calls += 1

    def _capture(self, key: tuple, flat: list[Any], spec: Any, args: tuple, kwargs: dict) -> Any:
        """The first call of a signature: eager, then capture and check; returns the eager output."""
        at = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        versions = [flat[i]._version for i in at]
        ref = self.original(*args, **kwargs)
        if any(flat[i]._version != v for i, v in zip(at, versions)):
            self._refuse(key, "the forward writes an argument")
            return ref
        if self._why_not(flat) is not None:  # the state the guard holds, as it was before this call
            self._refuse(key, "the forward changes its module's parameters, buffers or attributes")
            return ref
        ref_flat, ref_spec = tree_flatten(ref)
        why = _outputs_problem(ref_flat, [flat[i] for i in at], [t for _, _, t, _, _ in self.tensors],
                               self.backend.device_type)
        if why is not None:
            self._refuse(key, why)
            return ref
        static = list(flat)
        for i in at:
            x = flat[i]
            static[i] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)
        sargs, skw = tree_unflatten(static, spec)
        try:
            replay, sout = self.backend.capture(lambda: self.original(*sargs, **skw))
            for i in at:
                static[i].copy_(flat[i])
            replay()
        except Exception as e:  # a host sync, a CPU tensor, an op capture does not allow
            self._refuse(key, f"not capturable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return ref
        out_flat, out_spec = tree_flatten(sout)
        if out_spec != ref_spec or not all(_same(a, b) for a, b in zip(out_flat, ref_flat)):
            self._refuse(key, "the replay differs from the eager call")
            return ref
        self.graphs[key] = _Graph(replay, static, at, out_flat, out_spec, key[-1])
        self.stats.captured += 1
        self.stats.eager_calls += 1
        return ref


_MISSING = object()


def _fresh(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    if not isinstance(a, torch.Tensor):
        return a == b if _plain(a) else a is b
    return (a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
            and bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                           and torch.equal(a.nan_to_num(), b.nan_to_num()))))


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
        if not _dense(t):
            return "an output that is not dense"
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


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last) or (
        t.numel() == torch.empty_strided(t.shape, t.stride(), device="meta").untyped_storage().nbytes() // t.element_size())


class GraphSet:
    """Graph routes installed on a model's modules (the outermost of those `select` picks), sharing one pool."""

    def __init__(self, model: torch.nn.Module, select: Callable[[str, torch.nn.Module], bool],
                 backend: Any = None, max_graphs: int = 4):
        self.backend = backend if backend is not None else CudaGraphs()
        self.routes: dict[str, GraphRoute] = {}
        self.skipped: dict[str, str] = {}
        taken: list[str] = []
        for path, m in model.named_modules():
            if not select(path, m):
                continue
            if any(p == "" or path.startswith(p + ".") for p in taken):
                continue  # inside a module already routed: its kernels are in that graph
            if "forward" in m.__dict__:
                self.skipped[path] = "the instance has its own forward (a module card, or other code's)"
                continue
            taken.append(path)
            self.routes[path] = GraphRoute(m, path, self.backend, max_graphs)
        self._model = weakref.ref(model)

    def install(self) -> GraphSet:
        for r in self.routes.values():
            m = r.module()
            if m is not None and "forward" not in m.__dict__:
                m.__dict__["forward"] = r
                r.active = True
        return self

    def remove(self) -> None:
        for r in self.routes.values():
            r.active = False
            m = r.module()
            if m is not None and m.__dict__.get("forward") is r:
                del m.__dict__["forward"]

    def __enter__(self) -> GraphSet:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def stats(self) -> dict[str, Any]:
        out = {}
        for path, r in self.routes.items():
            s = r.stats
            out[path] = {"replays": s.replays, "eager_calls": s.eager_calls, "captured": s.captured,
                         "declines": dict(s.declines), "refused": dict(s.refused)}
        return out

    def paths(self) -> Iterator[str]:
        return iter(self.routes)
