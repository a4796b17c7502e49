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

1. For each op the cast routes that Inductor decomposes (and has a variant for this mode, see 3), the decomposition is wrapped by a veto that keeps
   the ATen op (returns `NotImplemented`) when grad is disabled while tracing and the first tensor's device and
   dtype are ones the cast has variants for. The kept op is compiled as a fallback call
   `torch.ops.aten.<op>(...)`, which goes through the dispatcher to the cast's override, whose runtime guard
   decides per call (a miss runs PyTorch's kernel). Sizes: where the first tensor's sizes are concrete
   (static shapes) and no op variant of the cast has them (`covered_shapes`), the call is
   decomposed as Inductor would: kept, it could only miss, and PyTorch's kernel can be many times slower
   than Inductor's code. Symbolic sizes (dynamic shapes) are never compared: the op is kept. Only op
   variants count: a size that only pattern cards have is decomposed too, and their patterns, traced under
   the same veto, hold the decomposition there (a call the pattern does not match, such as a GroupNorm no
   SiLU follows, is then Inductor's code, not a guard miss).
2. The op is registered with `make_fallback(op, layout_constraint=constrain_to_fx_strides,
   override_decomp=True)`, so Inductor passes the strides eager would (the guard keys on strides). Where
   Inductor holds an input in another layout (a convolution's output under its layout optimization is
   channels-last) it copies it first, and where the op's output goes to a consumer that wants another layout
   it copies that too: each copy is a pass over the tensor. `layout_copies` records both, per op (below).
3. Only variants proven for the mode's target (`compile`, `compile:MODE`; a variant without recorded targets:
   where its cast's one whole-model check ran, `format.legacy_targets`, or every mode when it has none) are
   kept, and the compiled graph runs inside `runtime.target_scope(target)`, so the routers decline
   at run time any variant the export did not keep for this mode (docs/cast.md, "Targets").
4. `post_grad_custom_post_pass` becomes a no-op pass (chaining any pass already configured) whose `uuid()`
   names the cast's digest and what it vetoed: Inductor's FX-graph and AOTAutograd caches can never serve
   a graph compiled for another cast, or for none, and a graph compiled for this cast is found again.

Inference only: with grad enabled while tracing (a joint forward/backward graph) nothing is vetoed and
Inductor decomposes as usual; at run time the router declines any call that needs autograd
(`runtime.Route`). Ops Inductor lowers directly (no decomposition, e.g. pointwise ops) keep Inductor's code;
ops it neither decomposes nor lowers are fallbacks already and reach the override as they are.

`mode="reduce-overhead"` (CUDA graphs): the fallback call is captured like any other kernel; the guard runs
during warm-up and capture, and its decision at capture (hit or miss) is what every replay of that graph
runs. A graph is recorded per input shape, so each shape gets its own decision.

Pattern cards (`backend(cast, patterns=[(signature, plan), ...])`, see `engine/cast/patterns.py`): chains of
ops that are not one module (SiLU(gate) * up, GroupNorm → SiLU, a residual add and the norm after it) are
found in the post-grad graph by the same pass (before any user pass), and each match becomes one call to a
registered `kforge::chain_<digest>` op whose runtime guard picks the cast's variant or eager for the card.
The pass's `uuid()` includes the patterns, so a cached graph compiled without them is never served. Only
graphs traced with grad disabled are rewritten.

Layout copies (`CastBackend.layout_copies`, also a cast's `stats()["layout_copies"]`): per op of the cast
that compiled graphs call, how many calls were compiled, how many of their stored inputs Inductor copied into
the layout the variants were proven for (`inputs_copied`; a pointwise not stored yet that it computes straight
into that layout is `inputs_computed`, no copy), how many of their outputs it copied into another layout for
a consumer, and the first strides it had to convert. On a convolutional model Inductor runs channels-last,
and a GroupNorm → SiLU pattern card whose output feeds a convolution gains the SiLU pass and pays a copy back
(18 per SD3.5 VAE decode on the H200).

Convolution biases: on CUDA Inductor splits a convolution's bias off into a pointwise add that its own
consumers fuse; before a cast's op it computes that add straight into the channels-last layout the op's
variant was proven for (`inputs_computed_as_held`: no copy). Until 2026-12-06h the cast instead had such a
convolution keep its bias (cuDNN's convolution, then ATen's broadcast `add_` at about 45 % of a copy's rate):
on an H200 the SD3.5 VAE decode ran 1.295x compile alone that way and 1.372x with the add split off, CIs
disjoint (docs/results/vae-bias-2026-12-06g), so the split is all there is now. That add is still one pass
over the convolution's output. Where the cast has a conv-bias fold card (the chain `add(x, b[1,C,1,1])` →
GroupNorm → SiLU, whose kernel adds `b[c]` as it loads `x`), the pattern pass splits the bias off in the
post-grad graph itself, so the card's pattern has the add to match: the card's op is then handed the
convolution's stored output (`inputs_as_held`, no pointwise computed for it) and the pass is gone. A split no
pattern took is put back before Inductor lowers the graph (`patterns._split_conv_biases`; a cast's
`stats()["folds_reverted"]`).

Compiles through this backend are serialized by one lock (the tables patched are process-wide).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from engine.capture.twins import channels_last_strides
from engine.cast import runtime
from engine.ops import may_have_sizes, resolve_op, same_strides, tensors_of

if TYPE_CHECKING:
    from engine.cast import patterns as chain_patterns

_COMPILE_LOCK = threading.RLock()
_MISSING = object()
_DEVICE_OF_KEY = {"CPU": "cpu", "CUDA": "cuda"}


def _owned_keys(owner: object, target: str | None, with_plan: bool = False) -> Iterator[tuple[Any, str, Any]]:
    """(op, device type, first tensor's key or None) of each installed guard-table entry of `owner` that may
    run under `target` (no recorded targets, or `target` among them); `with_plan`: (key, plan) for the key."""
    for (_op, dispatch_key), route in runtime.routes().items():
        device = _DEVICE_OF_KEY.get(dispatch_key)
        if device is None:
            continue
        for key, who in list(route.owners.items()):
            if who is not owner:
                continue
            targets = getattr(route.table.get(key), "targets", None)
            if target is not None and targets is not None and target not in targets:
                continue
            first = key[0] if key else None
            ok = isinstance(first, tuple) and len(first) == 7 and isinstance(first[0], torch.dtype)
            yield route.op, device, ((first, route.table.get(key)) if with_plan else first) if ok else None


def coverage(owner: object, target: str | None = None
             ) -> dict[torch._ops.OpOverload, set[tuple[str, torch.dtype | None]]]:
    """Per ATen overload that `owner` routes: the (device type, dtype) pairs of its variants (dtype None
    where the key does not start with a tensor). Read from the installed routes, now. With `target`, only
    variants that may run under it (no recorded targets, or `target` among them)."""
    out: dict[torch._ops.OpOverload, set[tuple[str, torch.dtype | None]]] = {}
    for op, device, first in _owned_keys(owner, target):
        out.setdefault(op, set()).add((device, first[0] if first is not None else None))
    cpp_targets = getattr(owner, "_cpp_targets", None) or {}
    for op_name in _cpp_ops(owner):  # routed by the C++ router at the CUDA key: any dtype it was given
        plans = cpp_targets.get(op_name, [None])
        if target is None or any(t is None or target in t for t in plans):
            out.setdefault(resolve_op(op_name), set()).add(("cuda", None))
    return out


Shapes = "dict[torch._ops.OpOverload, frozenset[tuple[str, torch.dtype, tuple[int, ...]]] | None]"


def covered_shapes(owner: object, target: str | None = None) -> Shapes:
    """Per ATen overload `owner` routes: every (device type, dtype, shape) its first tensor has in a variant
    that may run under `target` (as `coverage`); None where some variant's key has no first-tensor shape or
    its router does not say (then no shape is ruled out).

    Pattern cards add no sizes. They once did (their patterns were traced with the op kept, so the graph had
    to keep it): the SD3.5 VAE's GroupNorms that no SiLU follows then ran PyTorch's kernel through a guard
    miss wherever only a GroupNorm -> SiLU card had their size. Patterns are traced under the veto itself
    (`PatternSet.prepare`), so they hold the op exactly where the graph does."""
    out: dict[Any, set | None] = {}

    def add(op: Any, item: tuple | None) -> None:
        if item is None:
            out[op] = None
        elif out.setdefault(op, set()) is not None:
            out[op].add(item)

    for op, device, first in _owned_keys(owner, target):
        add(op, (device, first[0], tuple(first[1])) if first is not None else None)
    cpp_shapes = getattr(owner, "_cpp_shapes", None) or {}
    cpp_targets = getattr(owner, "_cpp_targets", None) or {}
    for op_name in _cpp_ops(owner):
        op = resolve_op(op_name)
        shapes = cpp_shapes.get(op_name)
        if shapes is None:
            add(op, None)
            continue
        for (dtype, shape), t in zip(shapes, cpp_targets.get(op_name, [None] * len(shapes))):
            if target is None or t is None or target in t:
                add(op, None if shape is None else ("cuda", dtype, tuple(shape)))
    return {op: (None if v is None else frozenset(v)) for op, v in out.items()}


Layouts = "dict[torch._ops.OpOverload, dict[tuple[str, torch.dtype, tuple[int, ...], tuple[int, ...]], tuple | None]]"


def covered_layouts(owner: object, target: str | None = None) -> Layouts:
    """Per ATen overload `owner` routes: for every (device type, dtype, shape, strides) its first tensor has in
    a variant that may run under `target`, the strides of the tensor outputs that variant was proven to return
    (None: not recorded). A compiled call whose first input Inductor already holds in one of these layouts,
    and whose traced outputs have those strides, is passed as it is (no copy to eager's strides)."""
    out: dict[Any, dict] = {}
    for op, device, first in _owned_keys(owner, target, with_plan=True):
        if first is not None:
            (first, plan) = first
            out.setdefault(op, {})[(device, first[0], tuple(first[1]), tuple(first[2]))] = \
                getattr(plan, "output_strides", None)
    cpp_shapes = getattr(owner, "_cpp_shapes", None) or {}
    cpp_strides = getattr(owner, "_cpp_strides", None) or {}
    cpp_outputs = getattr(owner, "_cpp_outputs", None) or {}
    cpp_targets = getattr(owner, "_cpp_targets", None) or {}
    for op_name in _cpp_ops(owner):
        shapes, strides = cpp_shapes.get(op_name) or [], cpp_strides.get(op_name) or []
        outs = cpp_outputs.get(op_name) or [None] * len(shapes)
        for (dtype, shape), stride, o, t in zip(shapes, strides, outs,
                                                cpp_targets.get(op_name, [None] * len(shapes))):
            if shape is not None and stride is not None and (target is None or t is None or target in t):
                out.setdefault(resolve_op(op_name), {})[("cuda", dtype, tuple(shape), tuple(stride))] = o
    return out


def _shapes_key(shapes: dict) -> str:
    """A short digest of `covered_shapes` for Inductor's cache keys (the veto's decisions depend on it)."""
    import hashlib

    rows = sorted((str(op), "*" if v is None else sorted(f"{d}/{t}/{list(s)}" for d, t, s in v))
                  for op, v in shapes.items())
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def _cpp_ops(owner: object) -> list[str]:
    return list(getattr(owner, "_cpp_ops", []) or [])


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _veto(original: Callable[..., Any], pairs: frozenset, shapes: frozenset | None = None
          ) -> Callable[..., Any]:
    """The decomposition, except where the cast may serve the call: then the ATen op stays in the graph.
    With `shapes` (`covered_shapes`), a call whose first tensor has concrete sizes that no variant has is
    decomposed too: the op kept for it would only run PyTorch's kernel (every call a guard miss), which can
    be many times slower than Inductor's code (the VAE's 1024² × 256 GroupNorm: 7.2 ms against 0.47 ms).
    A symbolic size (dynamic shapes) matches any: the op is kept where the concrete sizes can be a variant's,
    and the runtime guard decides."""

    @functools.wraps(original)
    def decompose_unless_covered(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            t = _first_tensor(args, kwargs)
            if t is not None and ((t.device.type, t.dtype) in pairs or (t.device.type, None) in pairs):
                if shapes is None or any(d == t.device.type and dt == t.dtype and may_have_sizes(t.shape, shape)
                                         for d, dt, shape in shapes):
                    return NotImplemented
        return original(*args, **kwargs)

    decompose_unless_covered.kforge_veto = True  # type: ignore[attr-defined]
    return decompose_unless_covered


def inductor_snapshot(ops: list[torch._ops.OpOverload] | None = None) -> dict[str, Any]:
    """What the backend touches in Inductor, for `ops` (all decomposed/lowered ops when None): a
    comparable snapshot (identity of each entry), so a test can check that it is restored exactly."""
    from torch._inductor import config, ir
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
            "joint_custom_passes": (id(config.joint_custom_pre_pass), id(config.joint_custom_post_pass)),
            "pattern_matcher": config.pattern_matcher,
            "inductor_patterns": _inductor_pattern_counts(),
            "fast_random_decomps": {str(k): id(v) for k, v in D.fast_random_decomps().items()},
            "copy_input": id(ir.ExternKernel.__dict__.get("copy_input"))}  # wrapped while compiling (layout copies)


def _inductor_pattern_counts() -> dict[str, int]:
    """How many of the patterns in Inductor's own pattern passes are ours (always 0: ours live in a pass
    of their own). Their total would not do: Inductor fills its passes lazily at its first compile."""
    from torch._inductor.fx_passes import joint_graph, post_grad

    passes = {f"post_grad.{i}": p for i, p in enumerate(post_grad.pass_patterns)}
    passes.update({"joint_graph.early": joint_graph.early_patterns, "joint_graph": joint_graph.patterns})

    def ours(entry: Any) -> bool:
        return getattr(getattr(entry, "handler", None), "__module__", "").startswith("engine.")

    return {k: sum(ours(e) for v in p.patterns.values() for e in v) for k, p in passes.items()}


# Which calls the veto keeps whole, in Inductor's cache keys: a graph compiled under an older rule is never
# served again (2: under dynamic shapes, only where the concrete sizes can be a variant's; 3: a convolution
# whose output only the cast's ops read, in a layout their variants take as held, keeps its bias; 4: an input
# not stored yet is computed into the channels-last layout a variant was proven for; 5: no bias kept, rule 3
# gone).
VETO_RULE = 5


class CastCacheKey:
    """The cast's post-grad pass: replaces its pattern cards' matches (when `patterns` is given), then runs
    `previous`; its `uuid()` puts the cast, what it vetoed and its patterns into Inductor's cache keys."""

    def __init__(self, digest: str, vetoed: tuple, previous: Any = None,
                 patterns: chain_patterns.PatternSet | None = None, apply_patterns: bool = True,
                 target: str | None = None, shapes: str = ""):
        self.digest, self.vetoed, self.previous = digest, vetoed, previous
        self.patterns, self.apply_patterns, self.target = patterns, apply_patterns, target
        self.shapes = shapes  # _shapes_key of the sizes the veto keeps the ops for
        self.matches: list[dict[str, int]] = []   # per graph this pass ran on: matches per pattern op
        # Per graph this pass ran on: its calls of ops a route may serve (names in `self.routed`), after the
        # rewrite; None where `routed` is unknown. Not part of uuid(): a record, not a change to the graph.
        self.routed: frozenset[str] | None = None
        self.routed_calls: list[int | None] = []   # per graph; None: not counted (no `routed`)

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.patterns is not None and self.patterns.built and self.apply_patterns:
            self.matches.append(self.patterns.apply(graph, self.target, (self.vetoed, self.shapes)))
        if self.previous is not None:
            self.previous(graph)
        self.routed_calls.append(None if self.routed is None else _routed_calls(graph, self.routed))

    def uuid(self) -> Any:
        prev = self.previous.uuid() if hasattr(self.previous, "uuid") else None
        pats = (self.patterns.uuid((self.vetoed, self.shapes)), self.apply_patterns) \
            if self.patterns is not None else None
        return ("kforge-cast", VETO_RULE, self.digest, self.vetoed, self.shapes, pats, self.target, prev)


def _schema_name(op: Any) -> str | None:
    """'aten::add_' for torch.ops.aten.add_.Tensor, 'aten::add_.Tensor' or 'aten::add_'; None for anything
    that is not an op (a Python function, a higher-order op)."""
    if isinstance(op, str):
        ns, sep, rest = op.partition("::")
        return f"{ns}::{rest.partition('.')[0]}" if sep else None
    schema = getattr(op, "_schema", None)
    return getattr(schema, "name", None) if schema is not None else None


def routed_names(owner: object) -> frozenset[str]:
    """The ops (schema names, any overload) a route may serve in a graph compiled for `owner`: every
    variant's op of `owner` whatever its targets (installed or not: it may be installed after the compile),
    the ops its C++ router takes, and every route installed now, Python or C++ (another cast's). The `kforge`
    namespace (pattern ops) is always counted (`_routed_calls`)."""
    names = {_schema_name(getattr(v, "op", None) or "") for v in getattr(owner, "variants", None) or ()}
    from engine.cast import cpp_router

    names.update(_schema_name(op) for op in _cpp_ops(owner))
    names.update(_schema_name(op) for op in cpp_router.installed_ops())  # another cast's, through C++
    names.update(_schema_name(op) for op, _key in runtime.routes())
    names.discard(None)
    return frozenset(names)


def _routed_calls(graph: torch.fx.Graph, routed: frozenset[str]) -> int:
    """Calls in a post-grad graph of an op named in `routed`, or of any op in the `kforge` namespace. A
    higher-order op (cond, while_loop, a subgraph call…) counts as one: what its subgraphs call is not read."""
    n = 0
    for node in graph.nodes:
        if node.op == "call_function":
            if isinstance(node.target, torch._ops.HigherOrderOperator):
                n += 1
                continue
            name = _schema_name(node.target)
            if name is not None and (name in routed or name.startswith("kforge::")):
                n += 1
    return n


def _key_pass(digest: str, vetoed: tuple, previous: Any, patterns: Any = None, apply_patterns: bool = True,
              target: str | None = None, shapes: str = "") -> Any:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    cls = type("KforgeCastCacheKey", (CastCacheKey, CustomGraphPass), {})
    return cls(digest, vetoed, previous, patterns, apply_patterns, target, shapes)


@contextmanager
def inductor_state(owner: object, digest: str, previous_pass: Any = None,
                   patterns: chain_patterns.PatternSet | None = None, apply_patterns: bool = True,
                   record: list | None = None, target: str | None = None,
                   copies: dict | None = None, routed_calls: list | None = None) -> Iterator[tuple]:
    """Inside the block, Inductor keeps the ops `owner` routes (see the module docstring), replaces the
    matches of `patterns` (when `apply_patterns`) and its caches are keyed by `digest` and the patterns;
    every table and config entry touched is put back on exit. Yields what was vetoed; per graph the
    post-grad pass rewrote, its matches are appended to `record`. `target`: keep only the ops of variants
    that may run under it (runtime.compile_target of the mode). `copies`: filled with the layout copies
    Inductor made around the cast's ops (see the module docstring). `routed_calls`: per graph the pass ran
    on (a graph served from Inductor's caches is not), its calls of ops a route may serve (`routed_names`)."""
    from torch._inductor import config
    from torch._inductor import decomposition as D
    from torch._inductor import lowering as L

    with _COMPILE_LOCK:
        cov = coverage(owner, target)
        shapes = covered_shapes(owner, target)
        layouts = covered_layouts(owner, target)
        _register_held(layouts)
        ops = [op for op in cov if op in D.decompositions]
        saved = {op: (D.decompositions[op], L.lowerings.get(op, _MISSING), op in L.fallbacks,
                      op in L.needs_realized_inputs, L._maybe_layout_constraints.get(op, _MISSING))
                 for op in ops}
        vetoed = tuple(sorted((str(op), tuple(sorted((d, str(t)) for d, t in cov[op]))) for op in ops))
        kept: dict = {}
        copies = {} if copies is None else copies
        names: dict[Any, str] = {}
        prev = previous_pass if previous_pass is not None else config.post_grad_custom_post_pass
        try:
            for op in ops:
                D.decompositions[op] = _veto(saved[op][0], frozenset(cov[op]), shapes.get(op))
                names[op] = str(op)
                L.make_fallback(op, layout_constraint=_recording_constraint(str(op), copies, layouts.get(op), op),
                                override_decomp=True)
            D.fast_random_decomps.cache_clear()  # functools.cache over `decompositions`
            # A chain holding a vetoed op is traced again here, under the veto (patterns.PatternSet.prepare),
            # once per set of vetoed ops and sizes: its pattern holds the op where the veto keeps it (a size an
            # op variant has) and its decomposition elsewhere, as the compiled graph will.
            skey = _shapes_key({op: shapes.get(op) for op in ops})
            active = patterns.prepare((vetoed, skey), ops) if patterns is not None and apply_patterns \
                else patterns
            # The pattern ops are fallbacks passed eager's strides (their guard keys on strides); registered
            # here and removed after, like the vetoed ops (Inductor would otherwise add them for good).
            chain_ops = [op for op in (active.ops() if active is not None else []) if op not in D.decompositions]
            kept.update({op: (L.lowerings.get(op, _MISSING), op in L.fallbacks, op in L.needs_realized_inputs,
                              L._maybe_layout_constraints.get(op, _MISSING)) for op in chain_ops})
            chain_layouts = active.first_layouts(target) if active is not None else {}
            for op in chain_ops:
                names[op] = str(op)
                L.make_fallback(op, layout_constraint=_recording_constraint(str(op), copies, chain_layouts.get(op)),
                                warn=False)
            # Ops that are fallbacks already (not decomposed) reach the override as they are: their outputs
            # are counted too, their inputs keep Inductor's own constraint.
            names.update({op: str(op) for op in cov if op not in names})
            key = _key_pass(digest, vetoed, prev, patterns, apply_patterns, target, skey)
            key.routed = routed_names(owner) if routed_calls is not None else None
            with config.patch(post_grad_custom_post_pass=key), _counting_output_copies(names, copies):
                try:
                    yield vetoed
                finally:
                    if record is not None:
                        record.extend(key.matches)
                    if routed_calls is not None:
                        routed_calls.extend(key.routed_calls)
        finally:
            for op, (lowering, fell, realized, constraint) in kept.items():
                _put(L.lowerings, op, lowering)
                _put(L._maybe_layout_constraints, op, constraint)
                if not fell:
                    L.fallbacks.discard(op)
                if not realized:
                    L.needs_realized_inputs.discard(op)
            for op, (decomp, lowering, fell, realized, constraint) in saved.items():
                D.decompositions[op] = decomp
                _put(L.lowerings, op, lowering)
                _put(L._maybe_layout_constraints, op, constraint)
                if not fell:
                    L.fallbacks.discard(op)
                if not realized:
                    L.needs_realized_inputs.discard(op)
            D.fast_random_decomps.cache_clear()


LAYOUTS_KEPT = 4  # distinct conversions kept per op, to say what Inductor had and what the op wanted


def _copy_row(copies: dict, name: str) -> dict[str, Any]:
    return copies.setdefault(name, {"calls": 0, "inputs_copied": 0, "outputs_copied": 0, "conversions": []})


def _note_conversion(row: dict[str, Any], what: str, had: Any, wanted: Any) -> None:
    def strides(x: Any) -> str:
        if x is None or isinstance(x, str):
            return x or "?"
        try:
            return "(" + ", ".join(str(int(v)) if str(v).lstrip("-").isdigit() else str(v) for v in x) + ")"
        except TypeError:
            return str(x)

    seen = f"{what}: {strides(had)} -> {strides(wanted)}"
    if seen not in row["conversions"] and len(row["conversions"]) < LAYOUTS_KEPT:
        row["conversions"].append(seen)


def _is_ir(x: Any) -> bool:
    """An Inductor IR node (a tensor argument of a lowered call), by the public class rather than a private
    helper that differs between torch releases."""
    from torch._inductor import ir

    return isinstance(x, ir.IRNode)


def _held_layout(x: Any) -> tuple | None:
    """(device type, dtype, shape, strides) of an IR node Inductor holds in a fixed layout with concrete sizes
    (a convolution's output, a graph input), else None: a flexible layout is Inductor's to choose."""
    from torch._inductor import ir

    try:
        if not ir.is_storage_and_layout(x) or not isinstance(x.get_layout(), ir.FixedLayout):
            return None
        size, stride = [int(v) for v in x.get_size()], [int(v) for v in x.get_stride()]
        return (x.get_device().type, x.get_dtype(), tuple(size), tuple(stride))
    except (TypeError, AttributeError, NotImplementedError):  # symbolic sizes, a node without a layout
        return None


def _computable_as(x: Any, layouts: dict) -> tuple | None:
    """For an input Inductor has not stored yet (a pointwise: a residual add, a split-off bias add), the
    channels-last layout of its concrete 4-D sizes where a variant was proven for it: Inductor can compute it
    straight into that layout as into eager's (a twin then serves it, and its output can stay channels-last
    for the convolution after it). None otherwise."""
    if _strides_of(x) is not None:
        return None
    try:
        size = tuple(int(v) for v in x.get_size())
        device, dtype = x.get_device().type, x.get_dtype()
    except (TypeError, AttributeError, NotImplementedError):  # symbolic sizes, a node without them
        return None
    if len(size) != 4:
        return None
    cl = (device, dtype, size, tuple(channels_last_strides(size)))
    return cl if _proven_for(layouts, cl) is not None else None


def _held_outputs(fx_node: Any, held: tuple) -> tuple | None:
    """(shape, strides) of the call's tensor outputs, by the op's meta kernel in the graph's fake mode, with
    its first input in the `held` layout: what Inductor's fallback call for the op asserts when handed that
    input (it asks the meta kernel, not the traced graph). None where the strides are symbolic."""
    from torch._guards import detect_fake_mode

    def val(a: Any) -> Any:
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    args = list(torch.fx.node.map_aggregate(fx_node.args, val))
    kwargs = dict(torch.fx.node.map_aggregate(fx_node.kwargs, val))
    mode = detect_fake_mode([a for a in args if isinstance(a, torch.Tensor)])
    if mode is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    _, dtype, shape, stride = held
    with mode:
        args[0] = torch.empty_strided(shape, stride, dtype=dtype, device=args[0].device)
        out = fx_node.target(*args, **kwargs)
    try:
        return tuple((tuple(int(n) for n in t.shape), tuple(int(s) for s in t.stride())) for t in tensors_of(out))
    except TypeError:  # symbolic sizes or strides: never compared
        return None


def _outputs_agree(proven: tuple, asserted: tuple) -> bool:
    """Whether a variant's proven output strides lay its outputs out as compiled code asserts them
    (`asserted`: (shape, strides) per output; `engine.ops.same_strides`, a size-1 dim's stride aside)."""
    return len(proven) == len(asserted) and all(same_strides(shape, p, a) for p, (shape, a) in zip(proven, asserted))


def _proven_for(layouts: dict, held: tuple) -> tuple | None:
    """The output strides of the variant proven for the `held` (device type, dtype, shape, strides), a size-1
    dim's stride aside (eager, Inductor and the guard keys disagree on it), or None."""
    device, dtype, shape, stride = held
    outs = layouts.get(held)
    if outs is not None:
        return outs
    return next((o for (d, t, s, st), o in layouts.items()
                 if o is not None and (d, t, tuple(s)) == (device, dtype, shape) and same_strides(shape, st, stride)),
                None)


def _traced_contiguous(fx_node: Any) -> bool:
    """Whether the graph was traced with the call's first input contiguous."""
    first = fx_node.args[0] if fx_node.args else None
    val = first.meta.get("val") if isinstance(first, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and bool(val.is_contiguous())


def _recording_constraint(name: str, copies: dict, layouts: dict | None = None,
                          op: Any = None) -> Callable[..., Any]:
    """`constrain_to_fx_strides` that counts, for the op `name`, the compiled calls and the inputs Inductor
    had to copy to give them eager's strides (`require_stride_order` returns a new node only when it copies).
    A first input Inductor already holds in a layout of `layouts` (`covered_layouts`: a variant was proven
    for it, e.g. channels-last, returning the output strides compiled code asserts for it) is passed as it is,
    and counted in `inputs_as_held`, only where the graph was traced with a contiguous first input: a call
    passed as held that goes to PyTorch's kernel (a miss, a declined hit) gets it made contiguous first, and
    its outputs copied into the asserted strides (`runtime.mark_held` is told of `op`, the ATen overload)."""
    from torch._inductor import lowering as L

    def pass_as_held(fx_node: Any, args: tuple) -> tuple[tuple | None, str | None]:
        """(the first input's held layout, None) where a variant was proven for it and returns the strides
        compiled code asserts of the call's outputs for that input (the op's meta kernel's, `_held_outputs`:
        torch 2.11's CUDA GroupNorm gives a channels-last output for a channels-last input, where the graph
        traced a contiguous one; H200, 2026-12-03e), else (None, why: None where no variant was proven for
        the layout). Never raises: a doubt means eager's strides, as without a variant."""
        try:
            held = _held_layout(args[0]) if args and layouts and _is_ir(args[0]) else None
            if held is None and args and layouts and _is_ir(args[0]):
                held = _computable_as(args[0], layouts)
            outs = _proven_for(layouts, held) if held is not None else None
            if outs is None:
                return None, None
            if not _traced_contiguous(fx_node):
                return None, "traced with a non-contiguous input"
            asserted = _held_outputs(fx_node, held)
            if asserted is None:
                return None, "no concrete output strides from the meta kernel"
            if not _outputs_agree(outs, asserted):
                return None, f"variant returns {list(outs)}, compiled code asserts {[s for _, s in asserted]}"
            if op is not None:
                runtime.mark_held(op, held[2], held[3], tuple(s for _, s in asserted))
            return held, None
        except Exception as e:  # noqa: BLE001
            return None, f"{type(e).__name__}: {e}"[:300]

    def constrain_and_count(fx_node: Any, *args: Any, **kwargs: Any) -> Any:
        held, declined = pass_as_held(fx_node, args)
        first, computed = (args[0] if args else None), False
        if held is not None and _held_layout(first) is None:
            # not stored yet: computed straight into the layout the variant was proven for (channels-last), as
            # it would have been into eager's; where that does not come out as the variant's, eager's strides
            try:
                from torch._inductor import ir

                first = ir.ExternKernel.require_channels_last(first)
                computed = _held_layout(first) == held
            except Exception:  # noqa: BLE001 - another torch's internals: eager's strides, as without a twin
                computed = False
            if not computed:
                held, first = None, args[0]
        if held is not None:
            # the first argument left out of eager's strides: a non-IR stand-in is passed through untouched
            new_args, new_kwargs = L.constrain_to_fx_strides(fx_node, None, *args[1:], **kwargs)
            new_args = (first, *new_args[1:])
        else:
            new_args, new_kwargs = L.constrain_to_fx_strides(fx_node, *args, **kwargs)
        try:  # the record: never a reason for the compile to fail
            row = _copy_row(copies, name)
            row["calls"] += 1
            if held is not None:
                row["inputs_as_held"] = row.get("inputs_as_held", 0) + 1
                if computed:   # of those, computed into the variant's layout (a pointwise not stored before)
                    row["inputs_computed_as_held"] = row.get("inputs_computed_as_held", 0) + 1
            elif declined is not None:  # a variant was proven for the held layout: why it was not passed it
                why = row.setdefault("held_declined", {})
                if declined in why or len(why) < LAYOUTS_KEPT:
                    why[declined] = why.get(declined, 0) + 1
            fx_args = list(fx_node.args) + [fx_node.kwargs.get(k) for k in kwargs]
            for k, (old, new, fx_arg) in enumerate(zip([*args, *kwargs.values()], [*new_args, *new_kwargs.values()],
                                                       fx_args)):
                if computed and k == 0:
                    continue   # counted above, as computed into the variant's layout
                if new is not old and _is_ir(old):
                    had = _strides_of(old)
                    if had is None:
                        # Not stored yet (a pointwise such as the bias add Inductor splits off a CUDA
                        # convolution, or a residual add): its kernel writes it in the op's layout, as it
                        # would have written it in any. A computation placed, not a copy of a stored tensor.
                        row["inputs_computed"] = row.get("inputs_computed", 0) + 1
                        continue
                    row["inputs_copied"] += 1
                    val = fx_arg.meta.get("val") if isinstance(fx_arg, torch.fx.Node) else None
                    _note_conversion(row, "input", had, val.stride() if isinstance(val, torch.Tensor) else "?")
        except Exception:  # noqa: BLE001
            pass
        return new_args, new_kwargs

    return constrain_and_count


def _strides_of(x: Any) -> Any:
    """The strides of an IR node's layout, where it has one now (else None)."""
    try:
        return x.maybe_get_stride()
    except Exception:  # noqa: BLE001 - a node whose layout is not decided: no strides to name
        return None


def _producer_op(x: Any) -> Any:
    """The op overload of the fallback kernel whose output the IR node `x` is (through boxes, views and the
    outputs of a multi-output kernel), or None."""
    from torch._inductor import ir

    node = x
    for _ in range(16):
        if isinstance(node, ir.MultiOutput):
            node = node.inputs[0] if getattr(node, "inputs", None) else None
        elif isinstance(node, ir.ExternKernel):
            return getattr(node, "op_overload", None)
        else:
            node = getattr(node, "data", None)
        if node is None:
            return None
    return None


@contextmanager
def _counting_output_copies(names: dict[Any, str], copies: dict) -> Iterator[None]:
    """While Inductor lowers, count the copies it makes of the outputs of the ops in `names` (op → name):
    a consumer (a convolution under layout optimization) that wants other strides than the op returned.
    `ExternKernel.copy_input` is wrapped (as the static or class method this torch has) and put back; the
    count never fails a compile."""
    from torch._inductor import ir

    original = ir.ExternKernel.__dict__.get("copy_input")
    if not isinstance(original, (staticmethod, classmethod)):  # another torch's shape of it: count nothing
        yield
        return
    inner = original.__func__

    def note(x: Any) -> None:
        try:
            name = names.get(_producer_op(x))
            if name is not None:
                row = _copy_row(copies, name)
                row["outputs_copied"] += 1
                _note_conversion(row, "output", _strides_of(x), "a consumer's")
        except Exception:  # noqa: BLE001 - a record, never a reason for the compile to fail
            pass

    if isinstance(original, classmethod):
        def copy_input_cm(cls: Any, x: Any) -> Any:
            note(x)
            return inner(cls, x)

        ir.ExternKernel.copy_input = classmethod(copy_input_cm)
    else:
        def copy_input(x: Any) -> Any:
            note(x)
            return inner(x)

        ir.ExternKernel.copy_input = staticmethod(copy_input)
    try:
        yield
    finally:
        ir.ExternKernel.copy_input = original


def describe_layout_copies(copies: dict[str, dict[str, Any]] | None) -> str | None:
    """One sentence on the layout copies Inductor made around a cast's ops (None when it made none). Inputs
    Inductor computed straight into the op's layout (`inputs_computed`: a pointwise not stored yet) are no
    copies and are not counted here."""
    rows = {k: v for k, v in (copies or {}).items() if v.get("inputs_copied") or v.get("outputs_copied")}
    if not rows:
        return None
    ins = sum(v["inputs_copied"] for v in rows.values())
    outs = sum(v["outputs_copied"] for v in rows.values())
    calls = sum(v["calls"] for v in (copies or {}).values())
    first = next(c for v in rows.values() for c in v["conversions"] or ["?"])
    declined = next((f"; {k} has a variant for the layout Inductor held but was not passed it ({w})"
                     for k, v in rows.items() for w in v.get("held_declined") or ()), "")
    return (f"Inductor copied {ins} input(s) and {outs} output(s) of the cast's ops into another layout "
            f"({calls} call(s) compiled; e.g. {first}): each copy is one more pass over its tensor{declined}")


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
                 dynamic: bool | None = None, patterns: Any = None):
        self.mode, self.options = mode, dict(options or {})  # as given: what torch.compile(mode=…) is checked against
        options = dict(options or {})
        self._user_pass = options.pop("post_grad_custom_post_pass", None)
        self.cast = cast
        self.target = runtime.compile_target(mode)   # what the cast's variants must have been proven for
        self.inner = torch._TorchCompileInductorWrapper(mode, options, dynamic)
        self.vetoed: list[tuple] = []   # per graph compiled: what was kept for the cast
        # Pattern cards: (signature, plan) pairs or PatternCards, or a PatternSet already built.
        from engine.cast import patterns as chain_patterns

        self.patterns = (patterns if isinstance(patterns, chain_patterns.PatternSet) or patterns is None
                         else chain_patterns.build(cast, list(patterns)))
        self.pattern_matches: list[dict[str, int]] = []   # per graph rewritten: matches per pattern op
        # Per op the graphs call: calls compiled and the layout copies Inductor made around them (shared with
        # the cast's own record where it keeps one, so `cast.stats()` reports every backend's compiles).
        shared = getattr(cast, "layout_copies", None)
        self.layout_copies: dict[str, dict[str, Any]] = shared if isinstance(shared, dict) else {}
        self.eager_runs = 0   # calls of graphs that pass inputs as held, run eagerly: the cast was not installed
        self.unwrapped = 0    # graphs returned as Inductor compiled them: they call nothing a route serves

    @property
    def pattern_problems(self) -> dict[str, str]:
        """Pattern cards that cannot be matched in a post-grad graph: card id → why."""
        return dict(self.patterns.problems) if self.patterns is not None else {}

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **given: Any) -> Any:
        _check_given(self.mode, self.options, given)
        # Inference only: a graph traced with grad enabled keeps Inductor's own code (and its backward).
        apply = not torch.is_grad_enabled()
        if apply:   # attention the cast proved faster in its math form for this target, before AOT traces it
            from engine.cast import attention

            routes = getattr(self.cast, "attention_routes", None)
            n = attention.rewrite(gm, routes(self.target) if callable(routes) else [])
            if n and isinstance(getattr(self.cast, "attention_rewrites", None), int):
                self.cast.attention_rewrites += n
        seen: list[int | None] = []
        with inductor_state(self.cast, cast_digest(self.cast), self._user_pass, self.patterns, apply,
                            self.pattern_matches, self.target, self.layout_copies, seen) as vetoed:
            self.vetoed.append(vetoed)
            compiled = self.inner(gm, example_inputs)
        # A graph that calls no op a route serves needs no target around its calls: it is returned as
        # Inductor made it, so that where nothing of the cast runs the compiled model runs exactly torch.compile's
        # code and calling convention. (ResNet-50 under reduce-overhead measured 0.987x before and 0.992x after
        # on the H200, both within the timing's own bias then; the point is that nothing of ours is left to cost.)
        # Known only where Inductor lowered the graph here (a graph from its caches is not lowered: `seen` is
        # empty) and for inference (a backward is compiled later, outside this pass).
        if apply and seen and all(n == 0 for n in seen):
            self.unwrapped += 1
            return compiled
        target = self.target
        # A graph that passes an input as Inductor holds it (channels-last) to one of the cast's ops needs the
        # cast's routes: without them, PyTorch's kernel gets the held layout, which the graph was not traced
        # with (and CUDA GroupNorm rejects). Run without the cast installed, it runs eagerly instead. Asked of
        # the cast, not of this compile's record: a graph served from Inductor's cache is not lowered, and an
        # input can be passed as held only where a variant's first input is not contiguous.
        held = _holds(covered_layouts(self.cast, self.target))
        eager = torch.compiler.disable(gm) if held else None
        cast = self.cast
        static = not _symbolic(gm)

        # The graph's calls are made under this compile mode's target: the routers run only the variants
        # proven for it (eager's own calls outside the graph keep theirs).
        @functools.wraps(compiled)
        def run_under_target(*args: Any, **kwargs: Any) -> Any:
            if eager is not None and not getattr(cast, "installed", True):
                self.eager_runs += 1
                return eager(*args, **kwargs)
            with runtime.target_scope(target), runtime.static_graph(static):
                return compiled(*args, **kwargs)

        return run_under_target

    def get_compiler_config(self) -> dict[str, Any]:
        return self.inner.get_compiler_config()

    def __deepcopy__(self, memo: dict) -> CastBackend:
        # A handle on the cast, not data: transformers' CompileConfig.to_dict() deep-copies its backend before
        # generate() compiles with it, and a copy would hold a copy of the cast (or fail on its lock).
        return self

    def __copy__(self) -> CastBackend:
        return self

    def reset(self) -> None:
        self.inner.reset()


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph Dynamo traced has a symbolic size (dynamic shapes) in its inputs."""
    for node in gm.graph.find_nodes(op="placeholder"):
        v = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and (
                any(isinstance(s, torch.SymInt) for s in v.shape) or
                any(isinstance(s, torch.SymInt) for s in v.stride())):
            return True
    return False


def _check_given(mode: str | None, options: dict[str, Any], given: dict[str, Any]) -> None:
    """torch.compile(model, backend=b, mode=…, options=…) hands a backend object its mode and options as keyword
    arguments (torch._TorchCompileWrapper), and so does transformers' generate() with
    `CompileConfig(backend=b)`, whose mode is "reduce-overhead" unless set. The cast's backend is made for one
    mode (the target its variants are held to): the same mode again is fine, another one is an error naming the
    fix, as are options other than the backend's own."""
    unknown = set(given) - {"mode", "options"}
    if unknown:
        raise TypeError(f"kforge cast backend: unexpected argument(s) {', '.join(sorted(unknown))} from torch.compile")
    if "mode" in given and runtime.compile_target(given["mode"]) != runtime.compile_target(mode):
        raise ValueError(f"kforge cast backend made for mode {mode or 'default'!r} was asked for mode "
                         f"{given['mode']!r} by torch.compile: make it with cast.backend(mode={given['mode']!r}), "
                         "or leave mode out of torch.compile")
    if given.get("options") and dict(given["options"]) != options:
        raise ValueError("kforge cast backend: torch.compile passed options other than the backend's own; pass "
                         "them to cast.backend(options=…) instead")


class InductorBackend(torch._TorchCompileInductorWrapper):
    """Inductor's own compile (the configuration `torch.compile(mode=…, options=…)` makes), for a cast with
    nothing for the mode: it takes the mode and options torch.compile hands a backend object, and its graphs
    run under the mode's target, so no variant of the cast runs in them."""

    def __init__(self, mode: str | None, options: dict[str, Any] | None, dynamic: bool | None):
        super().__init__(mode, options, dynamic)
        self._kforge_mode, self._kforge_options = mode, dict(options or {})
        self._kforge_target = runtime.compile_target(mode)

    def __call__(self, model_: Any, inputs_: Any, **given: Any) -> Any:
        _check_given(self._kforge_mode, self._kforge_options, given)
        return _under(self._kforge_target, super().__call__(model_, inputs_))


def _holds(layouts: Layouts) -> bool:
    """Whether a graph compiled with these layouts may pass an input as held: a variant's first input is
    not contiguous. A graph served from Inductor's cache is not lowered again, so the record cannot say."""
    return any(not _contiguous(shape, stride) for per_op in layouts.values() for (_, _, shape, stride) in per_op)


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Row-major contiguous, as torch tells (size-1 dims' strides aside)."""
    return torch.empty_strided(shape, stride, device="meta").is_contiguous()


# Ops whose CUDA kernel takes contiguous input only (CUDA native_group_norm checks X.is_contiguous()): in
# compiled code, a non-contiguous input of a layout a variant covers can only be one passed as held, so it is
# registered before the compile (`runtime.mark_held`), also for a graph Inductor serves from its cache.
CONTIGUOUS_ONLY = ("aten.native_group_norm.default",)


def _register_held(layouts: Layouts) -> None:
    for op, per_op in layouts.items():
        if str(op) in CONTIGUOUS_ONLY:
            for (device, _, shape, stride), outs in per_op.items():
                if device == "cuda" and not _contiguous(shape, stride):
                    runtime.mark_held(op, shape, stride, outs)


def cast_digest(cast: object) -> str:
    digest = getattr(cast, "digest", None)
    if not digest:
        raise ValueError("a cast composed with torch.compile needs a digest (its manifest's sha256)")
    return str(digest)


def nothing_under(cast: object, mode: str | None) -> bool:
    """Whether no variant of the cast may run under this compile mode's target (its export kept none for it:
    an eager cast on a model whose ops Inductor fuses better, ResNet-50's batch norms). Asked of the variants'
    held targets (`Cast.runs_under`), not of the installed routes, so it holds before the cast is installed; a
    variant with none held runs under every mode. A cast that cannot say is taken to have something."""
    runs_under = getattr(cast, "runs_under", None)
    if runs_under is None:
        return False
    target = runtime.compile_target(mode)
    routes = getattr(cast, "attention_routes", None)   # attention in its math form is the cast's too
    return not runs_under(target) and not (callable(routes) and routes(target))


def _under(target: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` called under `target`: the routers run only variants proven for it (a rejected eager variant of an
    op that compiled code calls through ATen, a convolution or an op Inductor falls back on, declines)."""
    @functools.wraps(fn)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        with runtime.target_scope(target):
            return fn(*args, **kwargs)
    return scoped


def _scoped_compile(target: str, compiled: Any) -> Any:
    """torch.compile's result with its calls made under `target`: an OptimizedModule stays one (its forward is
    wrapped, so Dynamo's code is the same as for torch.compile of the module), a function is wrapped."""
    if isinstance(compiled, torch.nn.Module):
        compiled.forward = _under(target, compiled.forward)
        return compiled
    return _under(target, compiled)


def backend(cast: object, *, mode: str | None = None, options: dict[str, Any] | None = None,
            dynamic: bool | None = None, patterns: Any = None) -> Any:
    """The backend to pass as `torch.compile(model, backend=...)` (mode and options go here, not there).
    `patterns`: the cast's pattern cards, `[(chain signature, plan), ...]` (engine/cast/patterns.py).

    Where nothing of the cast may run under the mode (`nothing_under`), an `InductorBackend`: Inductor's own
    compile, untouched (no vetoes, no pass, no registration), whose graphs run under the mode's target so that
    no variant of the cast runs in them. A backend object is a compile of its own (torch.compile wraps it, and
    Dynamo shares no code with another backend); `compile` shares torch.compile's."""
    if nothing_under(cast, mode):
        return InductorBackend(mode, options, dynamic)
    return CastBackend(cast, mode, options, dynamic, patterns)


def compile(cast: object, model: Any = None, *, mode: str | None = None, options: dict[str, Any] | None = None,
            dynamic: bool | None = None, fullgraph: bool = False, patterns: Any = None, **kwargs: Any) -> Any:
    """`torch.compile(model, mode=…, options=…, …)` whose graphs call the cast's ops (see the module doc).

    Where nothing of the cast may run under the mode (`nothing_under`), it is torch.compile's own compile of
    the model, called under the mode's target: Dynamo shares its code with a torch.compile of the same model
    and settings (one compile, nothing of the cast in it), and no variant runs inside, graph breaks included.
    On the H200 a CastBackend compiling for an eager-only ResNet-50 cast ran no kernel of ours and still read
    0.969-0.982 of torch.compile alone in four processes, while a second compile of torch.compile alone read
    0.976-1.041 against the first (docs/results/reproduce-h200/2026-12-04d/)."""
    if nothing_under(cast, mode):
        target = runtime.compile_target(mode)
        kw: dict[str, Any] = {"dynamic": dynamic, "fullgraph": fullgraph, **kwargs}
        if options:  # torch.compile takes a mode or options, not both: the mode's options under the user's
            from torch._inductor import list_mode_options

            kw["options"] = {**(list_mode_options(mode, dynamic) if mode not in (None, "default") else {}), **options}
        else:
            kw["mode"] = mode

        def make(m: Any) -> Any:
            return _scoped_compile(target, torch.compile(m, **kw))

        return make if model is None else make(model)
    b = backend(cast, mode=mode, options=options, dynamic=dynamic, patterns=patterns)
    if model is None:
        return functools.partial(torch.compile, backend=b, dynamic=dynamic, fullgraph=fullgraph, **kwargs)
    return torch.compile(model, backend=b, dynamic=dynamic, fullgraph=fullgraph, **kwargs)
