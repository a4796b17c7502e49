"""Casts under `torch.compile`: Inductor calls the cast's ops for what it covers, and its own code elsewhere.

    cast = engine.cast.load("sd35.cast")
    with cast.enabled():
        model = cast.compile(model, mode="max-autotune-no-cudagraphs")   # instead of torch.compile(model, ...)
        out = model(x)

The choice: an explicit backend (`cast.compile(model, **kw)`, or `backend=cast.backend(mode=...)` where the
code already passes a backend), not "every torch.compile while the cast is enabled". Why:

- Dynamo's own in-memory cache does not know about casts: a function compiled before `enabled()` would be
  served again inside it (our kernel never runs), and one compiled inside would be served after it. A backend
  object per cast is part of Dynamo's guards (its backend check), so compiled code is bound to the cast it was
  compiled for.
- Inductor's state is touched only while this backend compiles a graph, and restored right after it:
  enabling a cast changes nothing for anyone else's `torch.compile`, and nothing leaks when it is removed.

What the backend does around Inductor's `compile_fx` (the same as `torch.compile(backend="inductor", mode=…,
options=…)` otherwise):

1. For each op the cast routes that Inductor decomposes, the decomposition is wrapped by a veto that keeps
   the ATen op (returns `NotImplemented`) when grad is disabled while tracing and the first tensor's device and
   dtype are ones the cast has variants for. Nothing compares sizes (symbolic under dynamic shapes): the kept
   op is compiled as a fallback call `torch.ops.aten.<op>(...)`, which goes through the dispatcher to the
   cast's override, whose runtime guard decides per call (a miss runs PyTorch's kernel).
2. The op is registered with `make_fallback(op, layout_constraint=constrain_to_fx_strides,
   override_decomp=True)`, so Inductor passes the strides eager would (the guard keys on strides).
3. `post_grad_custom_post_pass` becomes a no-op pass (chaining any pass already configured) whose `uuid()`
   names the cast's digest and what it vetoed: Inductor's FX-graph and AOTAutograd caches can never serve
   a graph compiled for another cast, or for none, and a graph compiled for this cast is found again.

Inference only: with grad enabled while tracing (a joint forward/backward graph) nothing is vetoed and
Inductor decomposes as usual; at run time the router declines any call that needs autograd
(`runtime.Route`). Ops Inductor lowers directly (no decomposition, e.g. pointwise ops) keep Inductor's code;
ops it neither decomposes nor lowers are fallbacks already and reach the override as they are.

`mode="reduce-overhead"` (CUDA graphs): the fallback call is captured like any other kernel; the guard runs
during warm-up and capture, and its decision at capture (hit or miss) is what every replay of that graph
runs. A graph is recorded per input shape, so each shape gets its own decision.

Compiles through this backend are serialized by one lock (the tables patched are process-wide).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from engine.cast import runtime
from engine.ops import resolve_op

_COMPILE_LOCK = threading.RLock()
_MISSING = object()
_DEVICE_OF_KEY = {"CPU": "cpu", "CUDA": "cuda"}


def coverage(owner: object) -> dict[torch._ops.OpOverload, set[tuple[str, torch.dtype | None]]]:
    """Per ATen overload that `owner` routes: the (device type, dtype) pairs of its variants (dtype None
    where the key does not start with a tensor). Read from the installed routes, now."""
    out: dict[torch._ops.OpOverload, set[tuple[str, torch.dtype | None]]] = {}
    for (_op, dispatch_key), route in runtime.routes().items():
        device = _DEVICE_OF_KEY.get(dispatch_key)
        if device is None:
            continue
        for key, who in list(route.owners.items()):
            if who is not owner:
                continue
            first = key[0] if key else None
            dtype = first[0] if isinstance(first, tuple) and len(first) == 7 else None
            out.setdefault(route.op, set()).add((device, dtype))
    for op_name in _cpp_ops(owner):  # routed by the C++ router at the CUDA key: any dtype it was given
        out.setdefault(resolve_op(op_name), set()).add(("cuda", None))
    return out


def _cpp_ops(owner: object) -> list[str]:
    return list(getattr(owner, "_cpp_ops", []) or [])


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _veto(original: Callable[..., Any], pairs: frozenset) -> Callable[..., Any]:
    """The decomposition, except where the cast may serve the call: then the ATen op stays in the graph."""

    @functools.wraps(original)
    def decompose_unless_covered(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            t = _first_tensor(args, kwargs)
            if t is not None and ((t.device.type, t.dtype) in pairs or (t.device.type, None) in pairs):
                return NotImplemented
        return original(*args, **kwargs)

    decompose_unless_covered.kforge_veto = True  # type: ignore[attr-defined]
    return decompose_unless_covered


def inductor_snapshot(ops: list[torch._ops.OpOverload] | None = None) -> dict[str, Any]:
    """What the backend touches in Inductor, for `ops` (all decomposed/lowered ops when None): a
    comparable snapshot (identity of each entry), so a test can check that it is restored exactly."""
    from torch._inductor import config
    from torch._inductor import decomposition as D
    from torch._inductor import lowering as L

    def ident(d: dict, keys: Any) -> dict:
        return {k: id(d.get(k, _MISSING)) for k in keys}

    dkeys = list(D.decompositions) if ops is None else ops
    lkeys = list(L.lowerings) if ops is None else ops
    return {"decompositions": ident(D.decompositions, dkeys), "n_decompositions": len(D.decompositions),
            "lowerings": ident(L.lowerings, lkeys), "n_lowerings": len(L.lowerings),
            "fallbacks": sorted(map(str, L.fallbacks)),
            "needs_realized_inputs": sorted(map(str, L.needs_realized_inputs)),
            "layout_constraints": {str(k): id(v) for k, v in L._maybe_layout_constraints.items()},
            "post_grad_custom_post_pass": id(config.post_grad_custom_post_pass),
            "post_grad_custom_pre_pass": id(config.post_grad_custom_pre_pass),
            "fast_random_decomps": {str(k): id(v) for k, v in D.fast_random_decomps().items()}}


class CastCacheKey:
    """A post-grad pass that does nothing but put the cast into Inductor's cache keys (chains `previous`)."""

    def __init__(self, digest: str, vetoed: tuple, previous: Any = None):
        self.digest, self.vetoed, self.previous = digest, vetoed, previous

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.previous is not None:
            self.previous(graph)

    def uuid(self) -> Any:
        prev = self.previous.uuid() if hasattr(self.previous, "uuid") else None
        return ("kforge-cast", self.digest, self.vetoed, prev)


def _key_pass(digest: str, vetoed: tuple, previous: Any) -> Any:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    cls = type("KforgeCastCacheKey", (CastCacheKey, CustomGraphPass), {})
    return cls(digest, vetoed, previous)


@contextmanager
def inductor_state(owner: object, digest: str, previous_pass: Any = None) -> Iterator[tuple]:
    """Inside the block, Inductor keeps the ops `owner` routes (see the module docstring) and its caches are
    keyed by `digest`; every table and config entry touched is put back on exit. Yields what was vetoed."""
    from torch._inductor import config
    from torch._inductor import decomposition as D
    from torch._inductor import lowering as L

    with _COMPILE_LOCK:
        cov = coverage(owner)
        ops = [op for op in cov if op in D.decompositions]
        saved = {op: (D.decompositions[op], L.lowerings.get(op, _MISSING), op in L.fallbacks,
                      op in L.needs_realized_inputs, L._maybe_layout_constraints.get(op, _MISSING))
                 for op in ops}
        vetoed = tuple(sorted((str(op), tuple(sorted((d, str(t)) for d, t in cov[op]))) for op in ops))
        prev = previous_pass if previous_pass is not None else config.post_grad_custom_post_pass
        try:
            for op in ops:
                D.decompositions[op] = _veto(saved[op][0], frozenset(cov[op]))
                L.make_fallback(op, layout_constraint=L.constrain_to_fx_strides, override_decomp=True)
            D.fast_random_decomps.cache_clear()  # functools.cache over `decompositions`
            with config.patch(post_grad_custom_post_pass=_key_pass(digest, vetoed, prev)):
                yield vetoed
        finally:
            for op, (decomp, lowering, fell, realized, constraint) in saved.items():
                D.decompositions[op] = decomp
                _put(L.lowerings, op, lowering)
                _put(L._maybe_layout_constraints, op, constraint)
                if not fell:
                    L.fallbacks.discard(op)
                if not realized:
                    L.needs_realized_inputs.discard(op)
            D.fast_random_decomps.cache_clear()


def _put(d: dict, key: Any, value: Any) -> None:
    if value is _MISSING:
        d.pop(key, None)
    else:
        d[key] = value


class CastBackend:
    """A `torch.compile` backend: Inductor (with `mode`/`options` as for backend="inductor") that calls the
    cast's ops where it covers them. Equal only to itself, so Dynamo never shares its code with another."""

    compiler_name = "inductor"

    def __init__(self, cast: object, mode: str | None = None, options: dict[str, Any] | None = None,
                 dynamic: bool | None = None):
        options = dict(options or {})
        self._user_pass = options.pop("post_grad_custom_post_pass", None)
        self.cast = cast
        self.inner = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        self.vetoed: list[tuple] = []   # per graph compiled: what was kept for the cast

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        with inductor_state(self.cast, cast_digest(self.cast), self._user_pass) as vetoed:
            self.vetoed.append(vetoed)
            return self.inner(gm, example_inputs)

    def get_compiler_config(self) -> dict[str, Any]:
        return self.inner.get_compiler_config()

    def reset(self) -> None:
        self.inner.reset()


def cast_digest(cast: object) -> str:
    digest = getattr(cast, "digest", None)
    if not digest:
        raise ValueError("a cast composed with torch.compile needs a digest (its manifest's sha256)")
    return str(digest)


def backend(cast: object, *, mode: str | None = None, options: dict[str, Any] | None = None,
            dynamic: bool | None = None) -> CastBackend:
    """The backend to pass as `torch.compile(model, backend=...)` (mode and options go here, not there)."""
    return CastBackend(cast, mode, options, dynamic)


def compile(cast: object, model: Any = None, *, mode: str | None = None, options: dict[str, Any] | None = None,
            dynamic: bool | None = None, fullgraph: bool = False, **kwargs: Any) -> Any:
    """`torch.compile(model, mode=…, options=…, …)` whose graphs call the cast's ops (see the module doc)."""
    b = backend(cast, mode=mode, options=options, dynamic=dynamic)
    if model is None:
        return functools.partial(torch.compile, backend=b, dynamic=dynamic, fullgraph=fullgraph, **kwargs)
    return torch.compile(model, backend=b, dynamic=dynamic, fullgraph=fullgraph, **kwargs)
