"""`engine.cast.load(path)`: a cast ready to install, or an inert one that says once why not.

    cast = engine.cast.load("sd35.cast")
    with cast.enabled():
        image = pipe(...)
    cast.stats()   # hits per variant, misses per op
    with cast.enabled(model):   # also the module cards: the model's proven modules run the cast's plans
        out = model(x)
    compiled = cast.compile(model)   # torch.compile whose graphs call the cast's ops (docs/compile.md)
    cast.stats()["targets"]   # per target (eager, cuda-graphs, compile[:MODE]): the variants that run there

A variant runs only under the targets its export kept it for (docs/cast.md, "Targets"). A cast written
before targets were recorded is held to the mode of its one whole-model check (eager, for most: under
torch.compile an H200 sd35_medium cast of that kind made the model 0.83× as fast); only a cast that records
no whole-model check at all (built by a script, or `export --no-model-check`) runs wherever it is installed.

Loading never raises for a bad file: a damaged zip, a digest mismatch, an unknown format version,
another GPU arch or torch minor version, or no GPU at all leave the affected variants (or all of them)
on PyTorch, with one CastWarning naming the reason. `strict=True` raises CastError instead.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.cast import runtime
from engine.cast.compat import current_env, incompatibility, torch_drift
from engine.cast.format import (
    CastError,
    CastFile,
    CastWarning,
    legacy_targets,
    module_card,
    pattern_card,
    read_cast,
)


@dataclass
class VariantState:
    """One variant of a loaded cast: usable or not, and why not."""

    id: str
    op: str
    signature_text: str
    problem: str | None = None
    plan: Any = None
    cpp: tuple[str, int] | None = None  # (op, index of its plan) while the C++ router dispatches it
    module: dict[str, Any] | None = None  # a module card's entry (class, paths, binding), else None
    pattern: dict[str, Any] | None = None  # a pattern card's entry (replaced inside compiled graphs), else None
    # The targets (eager, cuda-graphs, compile[:MODE]) whose whole-model check kept it, or for a variant
    # without recorded ones those of `legacy_targets`; None: no whole-model check at all, runs anywhere.
    targets: frozenset[str] | None = None
    recorded: bool = True  # the manifest records its targets (False: derived by legacy_targets, or None)

    @property
    def hits(self) -> int:
        if self.cpp is not None:
            from engine.cast import cpp_router

            ext = cpp_router.extension()
            st = cpp_router.stats(ext, self.cpp[0], "CUDA") if ext is not None else {}
            return int(st.get("hits", [0] * (self.cpp[1] + 1))[self.cpp[1]]) + (self.plan.hits if self.plan else 0)
        return self.plan.hits if self.plan is not None else 0


class Cast:
    """A loaded cast. `install()`/`remove()` are idempotent and thread-safe; `enabled()` scopes them."""

    def __init__(self, path: str, file: CastFile | None, problem: str | None, env: dict[str, Any] | None,
                 only: set[str] | None = None, plans: dict[str, Any] | None = None, any_target: bool = False):
        self.path = path
        self.file = file
        self.problem = problem            # why nothing of this cast can run here, or None
        self.env = env
        self.variants: list[VariantState] = []
        if file is not None:
            held = legacy_targets(file.manifest)
            for v in file.variants:
                why = problem or file.problems.get(v["id"])
                if why is None and only is not None and v["id"] not in only:
                    why = "not selected (load(..., only=…))"
                targets = v.get("targets")
                self.variants.append(VariantState(v["id"], v["op"], v.get("signature_text", ""), why,
                                                  module=module_card(v), pattern=pattern_card(v),
                                                  targets=held if targets is None else frozenset(targets),
                                                  recorded=targets is not None))
        self._plans = dict(plans or {})  # variant id -> Python plan used instead of its kernels
        self._any_target = any_target  # load(any_target=True): recorded targets are not enforced
        self._module_kept: dict[str, Any] = {}  # module-route counters by path, since removed
        self._module_skipped: list[str] = []  # module paths not patched at the last install, and why
        self._patterns: Any = None  # the pattern cards as a PatternSet, once built
        # Per op compiled graphs call: the layout copies Inductor made around it (engine.cast.compose)
        self.layout_copies: dict[str, dict[str, Any]] = {}
        # SDPA calls compiled in their math form, per graph compiled (engine.cast.attention; a compile count,
        # like layout_copies: a compiled graph's calls run no Python to count)
        self.attention_rewrites = 0
        self._lock = threading.RLock()
        self._cpp_ops: list[str] = []  # ops this cast routes through the C++ router while installed
        self._cpp_targets: dict[str, list[frozenset[str] | None]] = {}  # per C++-routed op: its plans' targets
        # per C++-routed op: its plans' first tensors (dtype, shape), for compose.covered_shapes
        self._cpp_shapes: dict[str, list[tuple[Any, tuple | None]]] = {}
        self._cpp_strides: dict[str, list[tuple | None]] = {}  # per C++-routed op: its plans' first-tensor strides
        self._cpp_outputs: dict[str, list[tuple | None]] = {}  # ... and their outputs' strides
        self._cpp_kept: dict[str, dict[str, Any]] = {}  # C++ counters of routes since removed
        self._installed = False
        self._kept_after_block = False  # installed before the outermost enabled() block: stays after it
        self._prepared = False
        self._depth = 0
        self._graphs: Any = None  # the GraphSet of the model named at install, where the cast holds graph routes
        self._layouts: Any = None  # the LayoutSet of the model named at install, where the cast holds layout routes
        # Route sets of models named at an earlier install(model) while installed: removed with the cast
        self._earlier_sets: list[Any] = []

    # ---- state -----------------------------------------------------------------------------------

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self.file.manifest if self.file is not None else None

    @property
    def installed(self) -> bool:
        return self._installed

    @property
    def digest(self) -> str:
        """sha256 of the manifest (which holds every kernel file's sha256): what compiled caches are keyed by."""
        import hashlib
        import json

        blob = json.dumps(self.manifest, sort_keys=True, default=str) if self.manifest is not None else self.path
        return hashlib.sha256(blob.encode()).hexdigest()

    def compile(self, model: Any = None, **kwargs: Any) -> Any:
        """`torch.compile(model, **kwargs)` whose graphs call this cast's ops where it covers them, and its
        pattern cards' chains as one guarded op each (inference only; the cast must be installed when the
        model is compiled and run). See engine.cast.compose and engine.cast.patterns."""
        from engine.cast import compose

        kwargs.setdefault("patterns", self.pattern_set())
        return compose.compile(self, model, **kwargs)

    def backend(self, **kwargs: Any) -> Any:
        """A `torch.compile(..., backend=cast.backend(mode=…, options=…))` backend doing what `compile` does."""
        from engine.cast import compose

        kwargs.setdefault("patterns", self.pattern_set())
        return compose.backend(self, **kwargs)

    def pattern_set(self) -> Any:
        """The cast's usable pattern cards as one engine.cast.patterns.PatternSet (built once, on first use;
        None when it has none). Chains that cannot be matched are in its `problems`, and in stats().

        A module card's chain is a pattern too: inside a compiled graph its module's forward is traced
        (the patched forward steps aside while Dynamo compiles), so the same op graph is replaced there."""
        with self._lock:
            if self._patterns is None:
                cards = [v for v in self.usable() if v.pattern is not None or v.module is not None]
                if not cards:
                    return None
                self._prepare()
                by_id = {v["id"]: v for v in self.file.variants} if self.file is not None else {}
                pairs = [(by_id[v.id]["signature"], v.plan) for v in cards if v.plan is not None]
                if not pairs:
                    return None
                from engine.cast import patterns

                self._patterns = patterns.build(self, pairs)
            return self._patterns

    def usable(self) -> list[VariantState]:
        """Variants that will (or do) run."""
        return [v for v in self.variants if v.problem is None]

    def stats(self) -> dict[str, Any]:
        """Hits per variant and misses per op (misses count every cast's routes for the op)."""
        ops = {v.op for v in self.variants}
        misses, near, through, near_keys, grad, declined, determinism, formats = {}, {}, {}, {}, {}, {}, {}, {}
        for (op, _key), route in runtime.routes().items():
            if op in ops:
                misses[op] = route.misses
                grad[op] = route.grad_declines
                declined[op] = route.target_declines
                determinism[op] = route.determinism_declines
                formats[op] = route.format_declines
                near[op] = route.near_misses
                through[op] = route.fallthrough
                near_keys[op] = [repr(k) for k in route.near_keys]
        for op, kept in self._cpp_kept.items():  # counted by C++ routes since removed
            misses[op] = misses.get(op, 0) + kept["misses"]
            near[op] = near.get(op, 0) + kept["near_misses"]
            near_keys[op] = near_keys.get(op, []) + list(kept["near_keys"])
        if self._cpp_ops:
            from engine.cast import cpp_router

            ext = cpp_router.extension()
            for op in self._cpp_ops:
                st = cpp_router.stats(ext, op, "CUDA")
                misses[op] = misses.get(op, 0) + int(st.get("misses", 0))
                near[op] = near.get(op, 0) + int(st.get("near_misses", 0))
                near_keys[op] = near_keys.get(op, []) + list(st.get("near_keys", []))
                declined[op] = declined.get(op, 0) + int(st.get("target_declines", 0))
                determinism[op] = determinism.get(op, 0) + int(st.get("determinism_declines", 0))
                formats[op] = formats.get(op, 0) + int(st.get("format_declines", 0))
        for op, kept in self._cpp_kept.items():
            declined[op] = declined.get(op, 0) + kept.get("target_declines", 0)
            determinism[op] = determinism.get(op, 0) + kept.get("determinism_declines", 0)
            formats[op] = formats.get(op, 0) + kept.get("format_declines", 0)
        mods = self._module_stats()
        patched = {vid for m in mods.values() if m["active"] for vid in m["variants"]}
        return {"file": self.path, "installed": self._installed, "problem": self.problem,
                "variants": [{"id": v.id, "op": v.op, "signature": v.signature_text, "hits": v.hits,
                              "active": v.plan is not None and v.problem is None and self._installed
                              and (v.module is None or v.id in patched), "problem": v.problem,
                              "router": "c++" if v.cpp else "python",
                              "targets": None if v.targets is None else sorted(v.targets)}
                             for v in self.variants],
                "targets": self.active_by_target(), "target_declines": declined,
                "determinism_declines": {op: n for op, n in determinism.items() if n},
                # calls with a proven key that PyTorch takes for another memory format than every proof's (a
                # size-1 dim's stride): eager's kernel, which lays its output out otherwise (not near misses)
                "format_declines": {op: n for op, n in formats.items() if n},
                "misses": misses, "near_misses": near, "fallthrough": through, "near_miss_keys": near_keys,
                "grad_declines": grad, "modules": mods, "modules_skipped": list(self._module_skipped),
                "graph_routes": self._graphs.stats() if self._graphs is not None else {},
                "layout_routes": self._layouts.stats() if self._layouts is not None else {},
                "layout_routes_summary": ({"classes": self.layout_routes().get("classes", []),
                                           **self._layouts.summary()} if self._layouts is not None else None),
                "graph_routes_summary": ({"classes": self.graph_route_classes(), **self._graphs.summary()}
                                         if self._graphs is not None else None),
                "patterns": {v.id: v.plan.hits for v in self.variants
                             if (v.pattern is not None or v.module is not None) and v.plan is not None
                             and hasattr(v.plan, "hits")},
                "pattern_problems": dict(self._patterns.problems) if self._patterns is not None else {},
                "pattern_misses": self._pattern_misses(),
                "pattern_matches": self._pattern_matches(),
                # convolution biases split off in those graphs for conv-bias fold cards, and of them put back
                # because no pattern took the add (engine.cast.patterns `_split_conv_biases`)
                "folds_split": self._patterns.folds["split"] if self._patterns is not None else 0,
                "folds_reverted": self._patterns.folds["reverted"] if self._patterns is not None else 0,
                "layout_copies": {k: dict(v, conversions=list(v["conversions"])) for k, v in self.layout_copies.items()},
                "attention_rewrites": self.attention_rewrites}

    def _pattern_misses(self) -> dict[str, Any]:
        """Per pattern op of this cast whose compiled calls missed: what they brought, what was proven."""
        if self._patterns is None:
            return {}
        from engine.cast.patterns import describe_key

        ops = {bp.op.name: bp.op for bp in self._patterns.everything_built()}
        mine: dict[str, list[str]] = {}
        for bp in self._patterns.everything_built():  # this cast's own variants, in the table or not (removed)
            d = describe_key(bp.key)
            if d not in mine.setdefault(bp.op.name, []):
                mine[bp.op.name].append(d)
        return {name: {**op.why_missed(), "proven_for": mine[name]} for name, op in ops.items()
                if op.misses or op.target_declines or op.size_declines}

    def _pattern_matches(self) -> dict[str, int]:
        """Per pattern op: matches in the graphs compiled in this process (a graph from Inductor's cache is
        not rewritten again, so not counted)."""
        return dict(self._patterns.matched) if self._patterns is not None else {}

    def active_by_target(self) -> dict[str, list[str]]:
        """Per target (eager, cuda-graphs, compile[:MODE]): the usable variants that run under it. A variant
        without recorded targets is under those of `legacy_targets` (every target when that is None)."""
        from engine.cast.cpp_router import TARGET_BITS

        return {t: self.variants_under(t) for t in TARGET_BITS}

    def variants_under(self, target: str) -> list[str]:
        """The usable variants that may run under `target` (any name, e.g. 'compile:max-autotune' too): its
        recorded targets include it, or it has none held (no whole-model check, or load(any_target=True))."""
        return [v.id for v in self.usable() if (held := self._enforced(v)) is None or target in held]

    def runs_under(self, target: str) -> bool:
        """Whether some usable variant may run under `target` (`variants_under`)."""
        return bool(self.variants_under(target))

    def summary(self) -> str:
        """One line per target: how many variants run under it (what `stats()["targets"]` lists)."""
        n = len(self.usable())
        legacy = [v for v in self.usable() if not v.recorded]
        held = legacy[0].targets if legacy else None
        head = f"{self.path}: {n} usable variant(s)" + (
            "" if not legacy else
            f", {len(legacy)} without recorded targets (no whole-model check recorded: run under every target)"
            if held is None else
            f", {len(legacy)} without recorded targets (held to the cast's one whole-model check: "
            f"{', '.join(sorted(held))})")
        return "\n".join([head] + [f"  {t}: {len(ids)} variant(s)" for t, ids in self.active_by_target().items()])

    def _module_stats(self) -> dict[str, Any]:
        """Per module path this cast patched: its variants, hits, misses and declines (by reason)."""
        from engine.cast import modules

        out: dict[str, Any] = {}
        for path, st in self._module_kept.items():
            out[path] = {**st.as_dict(), "active": False, "variants": []}
        for path, route in modules.routes_of(self).items():
            kept = out.get(path)
            now = route.stats.as_dict()
            if kept is not None:  # counters of an earlier install of the same path
                now["hits"] += kept["hits"]
                now["misses"] += kept["misses"]
                for why, n in kept["declines"].items():
                    now["declines"][why] = now["declines"].get(why, 0) + n
            out[path] = {**now, "active": route.active, "variants": sorted({v.vid for v in route.table.values()})}
        return out

    def reset_stats(self) -> None:
        from engine.cast import modules

        self._cpp_kept = {}
        self._module_kept = {}
        for route in modules.routes_of(self).values():
            route.stats = modules.PathStats()
        if self._graphs is not None:
            self._graphs.reset_counters()
        if self._layouts is not None:
            self._layouts.reset_counters()
        if self._cpp_ops:
            from engine.cast import cpp_router

            ext = cpp_router.extension()
            for op in self._cpp_ops:
                cpp_router.reset(ext, op, "CUDA")
        for v in self.variants:
            if v.plan is not None:
                v.plan.hits = 0
        for (op, _), route in runtime.routes().items():
            if any(v.op == op for v in self.variants):
                route.misses = route.near_misses = route.fallthrough = route.grad_declines = 0
                route.target_declines = route.determinism_declines = route.format_declines = 0
                route.near_keys = []
        if self._patterns is not None:
            for bp in self._patterns.everything_built():
                bp.op.hits = bp.op.misses = bp.op.target_declines = bp.op.size_declines = 0
                bp.op.miss_keys = []

    # ---- install / remove --------------------------------------------------------------------------

    def install(self, model: Any = None) -> Cast:
        """Put the guarded overrides in place (a no-op when already installed or nothing is usable).

        `model`: the nn.Module whose submodules the cast's module cards were proven for (their paths are
        resolved in it); without it only the op variants are installed."""
        with self._lock:
            if self.problem is not None:
                return self
            if self._installed:
                if model is not None:
                    self._install_modules(model)
                    self._install_layouts(model)
                    self._install_graphs(model)
                return self
            self._prepare()
            if model is not None:
                self._install_modules(model)
                self._install_layouts(model)
            if self._patterns is not None:  # compiled with this cast before: its graphs' ops serve it again
                self._patterns.enter()
            usable = self._distinct([v for v in self.usable()
                                     if v.plan is not None and v.module is None and v.pattern is None])
            if usable and _cpp_wanted():
                usable = self._install_cpp(usable)
            entries = [v.plan.entry for v in usable]
            refused: dict[str, str] = {}
            shadowed = runtime.add_entries(self, entries, refused=refused) if entries else []
            if refused:
                for v in usable:
                    if v.id in refused:
                        v.problem = refused[v.id]
                _warn(f"{self.path}: {len(refused)} variant(s) stay on PyTorch: "
                      + "; ".join(f"{vid} ({why})" for vid, why in refused.items()))
            if shadowed:
                _warn(f"{self.path}: {len(shadowed)} variant(s) already covered by another installed cast "
                      f"({', '.join(shadowed)}); those stay with it")
            self._installed = True
            runtime.note_serving(self, True)
            if model is not None:  # after the module cards: a graph captures the kernels that serve inside it
                self._install_graphs(model)
            return self

    def remove(self) -> None:
        """Take this cast's overrides out; ops no other cast covers get their original kernel back."""
        with self._lock:
            if not self._installed:
                return
            from engine.cast import modules

            if self._graphs is not None:
                self._graphs.remove()
            if self._layouts is not None:
                self._layouts.remove()
            for earlier in self._earlier_sets:
                earlier.remove()
            self._earlier_sets = []
            for path, st in modules.release(self).items():
                kept = self._module_kept.setdefault(path, modules.PathStats())
                kept.hits += st.hits
                kept.misses += st.misses
                for why, n in st.declines.items():
                    kept.declines[why] = kept.declines.get(why, 0) + n
            runtime.remove_owner(self)
            if self._patterns is not None:
                from engine.cast import patterns

                # The set stays built: graphs compiled with it still call its ops, and install puts its
                # variants back in their tables (dropping it left every later call a miss).
                patterns.remove_owner(self)
            if self._cpp_ops:
                from engine.cast import cpp_router

                ext = cpp_router.extension()
                for v in self.variants:  # the C++ counters go with the routes: keep them, as the Python router's
                    if v.cpp is not None and v.plan is not None:
                        v.plan.hits = v.hits
                for op in self._cpp_ops:
                    st = cpp_router.stats(ext, op, "CUDA")
                    kept = self._cpp_kept.setdefault(op, {"misses": 0, "near_misses": 0, "near_keys": [],
                                                          "target_declines": 0, "determinism_declines": 0,
                                                          "format_declines": 0})
                    kept["misses"] += int(st.get("misses", 0))
                    kept["target_declines"] += int(st.get("target_declines", 0))
                    kept["determinism_declines"] += int(st.get("determinism_declines", 0))
                    kept["format_declines"] += int(st.get("format_declines", 0))
                    kept["near_misses"] += int(st.get("near_misses", 0))
                    kept["near_keys"] += [k for k in st.get("near_keys", []) if k not in kept["near_keys"]]
                    cpp_router.uninstall(ext, op, "CUDA")
                self._cpp_ops = []
                self._cpp_targets = {}
                self._cpp_shapes = {}
                self._cpp_strides = {}
                self._cpp_outputs = {}
                for v in self.variants:
                    v.cpp = None
            self._installed = False
            runtime.note_serving(self, False)

    @contextlib.contextmanager
    def enabled(self, model: Any = None) -> Iterator[Cast]:
        """Installed inside the block (nested blocks keep it until the outermost ends); `model` as for install.
        A cast already installed when the outermost block starts (`install()`) stays installed after it."""
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._kept_after_block = self._installed
            if self._depth == 1 or model is not None:
                self.install(model)
        try:
            yield self
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and not self._kept_after_block:
                    self.remove()

    def graph_route_classes(self) -> list[str]:
        """The module classes whose instances this cast replays from CUDA graphs in eager (engine.cast.graphs),
        as its export chose them (`export --graph-routes`); empty for most casts."""
        g = ((self.manifest or {}).get("source") or {}).get("graph_routes") or {}
        classes = g.get("classes") or []
        return [c for c in classes if isinstance(c, str)] if isinstance(classes, list) else []

    def layout_routes(self) -> dict[str, Any]:
        """The manifest's layout routes (`export --layout-routes`): {"classes", "targets", "signatures", ...};
        empty for most casts."""
        g = ((self.manifest or {}).get("source") or {}).get("layout_routes") or {}
        return g if isinstance(g, dict) and isinstance(g.get("classes"), list) and g["classes"] else {}

    def attention_routes(self, target: str) -> list[dict[str, Any]]:
        """The SDPA signatures this cast computes in their math form when compiled for `target`
        (engine.cast.attention; the manifest's `source.attention_routes`, as an export proved them); empty for
        most casts, for every target it was not proven for, and where the cast cannot run here (`problem`: another
        GPU or software than it was proven on)."""
        from engine.cast.attention import valid_signature

        if self.problem is not None:
            return []
        g = ((self.manifest or {}).get("source") or {}).get("attention_routes") or {}
        if not isinstance(g, dict) or not isinstance(g.get("targets"), list) or target not in g["targets"]:
            return []
        sigs = g.get("signatures")
        return [s for s in sigs if valid_signature(s)] if isinstance(sigs, list) else []

    def _install_layouts(self, model: Any) -> None:
        """Layout routes on the model's modules of the class the export chose, for the signatures it proved
        (one set per model, reused)."""
        lr = self.layout_routes()
        if not lr:
            return
        from engine.cast.layouts import LayoutSet

        if self._layouts is None or self._layouts.model is not model:
            if self._layouts is not None and self._installed:  # another model's, still routed: remove() takes it
                self._earlier_sets.append(self._layouts)
            classes = {c for c in lr["classes"] if isinstance(c, str)}
            sigs = lr.get("signatures") if isinstance(lr.get("signatures"), dict) else {}
            targets = frozenset(t for t in (lr.get("targets") or ["eager"]) if isinstance(t, str))
            self._layouts = LayoutSet(model, lambda path, m: type(m).__name__ in classes, signatures=sigs,
                                      targets=targets)
            if self._layouts.skipped:
                _warn(f"{self.path}: {len(self._layouts.skipped)} module(s) not run channels-last: "
                      + "; ".join(f"{p or '(the model)'} ({why})" for p, why in
                                  list(self._layouts.skipped.items())[:3]))
        self._layouts.install()

    def _install_graphs(self, model: Any) -> None:
        """Graph routes on the model's modules of the classes the export chose (one set per model, reused)."""
        classes = set(self.graph_route_classes())
        if not classes:
            return
        from engine.cast.graphs import GraphSet

        if self._graphs is None or self._graphs.model is not model:
            if self._graphs is not None and self._installed:  # another model's, still routed: remove() takes it
                self._earlier_sets.append(self._graphs)
            self._graphs = GraphSet(model, lambda path, m: type(m).__name__ in classes)
        self._graphs.install()

    def _install_modules(self, model: Any) -> None:
        """Patch the forwards of the model's modules that this cast's module cards were proven for.

        A path the model lacks, a module of another class, a binding that does not fit, or a module that
        another cast already claims (first wins) is skipped, with one warning line for all of them."""
        from engine.capture.module_binding import class_key, class_name, dotted_key
        from engine.cast import modules

        by_id = {v["id"]: v for v in self.file.variants}
        wanted: dict[str, tuple[Any, list[Any]]] = {}
        skipped = []
        for st in self.usable():
            if st.module is None or st.plan is None:
                continue
            v = by_id[st.id]
            for path in st.module["paths"]:
                try:
                    mod = model.get_submodule(path)
                except AttributeError:
                    skipped.append(f"{path} (no such module)")
                    continue
                if type(mod).__name__ != st.module["class"]:
                    skipped.append(f"{path} (a {type(mod).__name__}, not {st.module['class']})")
                    continue
                # by its dotted name too, where the cast records it: a class of the same name elsewhere (a subclass
                # named alike, another library's) is not the proven one
                if class_key(type(mod)) != dotted_key(st.module.get("class_path", class_name(type(mod)))):
                    skipped.append(f"{path} (a {class_name(type(mod))}, not {st.module['class_path']})")
                    continue
                try:
                    bound = modules.bind_variant(st.id, mod, v["signature"], st.module, st.plan)
                except modules.ModuleCardError as e:
                    skipped.append(f"{path} ({st.id}: {e})")
                    continue
                wanted.setdefault(path, (mod, []))[1].append(bound)
            self._extend(model, st, v, wanted)
        for path, (mod, variants) in wanted.items():
            why = modules.claim(self, mod, path, variants)
            if why is not None:
                skipped.append(f"{path} ({why})")
        self._module_skipped = skipped
        if skipped:
            # Paths the model lacks (a cast of a whole pipeline on one of its parts) are many and alike: the
            # warning names a few and counts them, and lists every other reason in full.
            absent = [x[:-len(" (no such module)")] for x in skipped if x.endswith(" (no such module)")]
            others = [x for x in skipped if not x.endswith(" (no such module)")]
            parts = ([f"{len(absent)} not in this model ({', '.join(absent[:3])}{', …' if len(absent) > 3 else ''})"]
                     if len(absent) > 3 else [f"{a} (no such module)" for a in absent]) + others
            _warn(f"{self.path}: {len(skipped)} module path(s) stay on PyTorch: " + "; ".join(parts))

    def _extend(self, model: Any, st: VariantState, v: dict[str, Any], wanted: dict[str, tuple[Any, list[Any]]]
                ) -> None:
        """The card's other instances: modules of the same class (by its dotted name) at paths the capture
        did not see, whose own attributes (and submodules, where the cast records them) equal those of an
        instance it proved (`states`) and whose tensors bind as the proof's did. A model captured shrunk and
        run at its real depth has its other layers' modules served too. A card recorded without states extends
        to none; a module that does not fit is left alone silently (it was never the card's)."""
        from engine.capture.module_binding import class_key, dotted_key, proven_state, state_matches
        from engine.cast import modules

        states, class_path = st.module.get("states"), st.module.get("class_path")
        if not states or not class_path:
            return
        proven = set(st.module["paths"])
        for path, mod in model.named_modules():
            cls = type(mod)
            if path in proven or class_key(cls) != dotted_key(class_path):
                continue
            if "forward" in mod.__dict__ or not isinstance(modules.route_of(mod), (modules.ModuleRoute, type(None))):
                continue
            if not state_matches(proven_state(mod), states):
                continue
            try:
                bound = modules.bind_variant(st.id, mod, v["signature"], st.module, st.plan)
            except modules.ModuleCardError:
                continue
            wanted.setdefault(path, (mod, []))[1].append(bound)

    def _install_cpp(self, usable: list[VariantState]) -> list[VariantState]:
        """Route what the C++ router supports through it; returns the variants left for the Python router."""
        from engine.cast import cpp_router
        from engine.cast.guard import layout_of
        from engine.ops import resolve_op

        ext = cpp_router.extension()
        if ext is None:
            _warn(f"{self.path}: the C++ router is not available here ({cpp_router.why_not()}); dispatching "
                  "from Python, which adds several µs of host time per call (a host-bound model may gain less "
                  "or lose; KFORGE_CAST_ROUTER=python silences this)")
            return usable
        by_id = {v["id"]: v for v in self.file.variants}
        taken = {op for (op, _key) in runtime.routes()}
        groups: dict[str, list[VariantState]] = {}
        rest = []
        for st in usable:
            v = by_id[st.id]
            layout = layout_of(resolve_op(v["op"]))
            if layout.op_name in taken or not cpp_router.supported(layout, v["signature"]):
                rest.append(st)
            else:
                groups.setdefault(layout.op_name, []).append(st)
        for op, states in groups.items():
            layout = layout_of(resolve_op(op))
            try:
                plans = [cpp_router.plan_for(ext, st.plan, layout, by_id[st.id]["signature"]) for st in states]
                for st, plan in zip(states, plans):
                    cpp_router.set_plan_targets(ext, plan, self._enforced(st))
                    cpp_router.set_plan_reorders(ext, plan, getattr(st.plan, "reorders", False))
                cpp_router.install(ext, op, "CUDA", plans, runtime.held(resolve_op(op)))
            except Exception as e:  # another cast routes it in C++, or a plan it cannot take: Python
                _warn(f"{self.path}: {op} stays with the Python router ({type(e).__name__}: {e})")
                rest.extend(states)
                continue
            self._cpp_ops.append(op)
            self._cpp_targets[op] = [st.targets for st in states]
            self._cpp_shapes[op] = [_first_tensor_desc(by_id[st.id]["signature"]) for st in states]
            self._cpp_strides[op] = [_first_tensor_stride(by_id[st.id]["signature"]) for st in states]
            self._cpp_outputs[op] = [_output_strides(by_id[st.id]) for st in states]
            for i, st in enumerate(states):
                st.cpp = (op, i)
        return rest

    @staticmethod
    def _distinct(usable: list[VariantState]) -> list[VariantState]:
        """The variants, less any whose guard key (and proven memory formats) another of this cast's has: the
        first serves those calls, and the others stay off with a problem that says so (either router would
        give the first every call, and the others would read as never hit)."""
        first: dict[tuple, str] = {}
        out = []
        for v in usable:
            op, key = v.plan.entry[0], v.plan.entry[1]
            k = (op, key, getattr(v.plan, "formats", ()))
            if k in first:
                v.problem = f"the same signature as variant {first[k]} of this cast, which serves its calls"
                continue
            first[k] = v.id
            out.append(v)
        return out

    def _enforced(self, state: VariantState) -> frozenset[str] | None:
        """The targets a variant's plan is held to: its recorded ones, or none with load(any_target=True)."""
        return None if self._any_target else state.targets

    def _prepare(self) -> None:
        """Load modules and resolve launches once (needs the GPU); a variant that fails stays on PyTorch."""
        if self._prepared:
            return
        self._prepared = True
        import torch

        from engine.cast.guard import first_shape, layout_of, proven_formats, signature_key
        from engine.cast.kernels import make_plan
        from engine.launch import cuda_driver as drv
        from engine.ops import resolve_op

        assert self.file is not None
        failed = []
        by_id = {v["id"]: v for v in self.file.variants}
        for state in self.usable():  # Python plans given to load(): no GPU needed for them
            if state.id in self._plans:
                fn = self._plans[state.id]
                state.plan = fn if isinstance(fn, runtime.Plan) else runtime.Plan(state.id, fn)
                state.plan.targets = self._enforced(state)
                if state.module is None and state.pattern is None:
                    v = by_id[state.id]
                    layout = layout_of(resolve_op(v["op"]))
                    key = signature_key(layout, v["signature"], 0)
                    state.plan.formats = proven_formats(layout, v["signature"])
                    state.plan.entry = (layout.op_name, key, state.plan, first_shape(v["signature"]))
        if all(s.plan is not None for s in self.usable()):
            _note_output_strides(self.usable(), by_id)
            return
        device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=device)  # the primary context must exist before the driver API uses it
        drv.init()
        props = torch.cuda.get_device_properties(device)
        max_shared = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
        arch = self.env.get("arch") if self.env else None
        for state in self.usable():
            if state.plan is not None:
                continue
            v = by_id[state.id]
            try:
                if state.module is not None or state.pattern is not None:
                    state.plan = _chain_kernel_plan(v, _image(self.file, v, arch), device, max_shared)
                    state.plan.targets = self._enforced(state)
                    continue
                layout = layout_of(resolve_op(v["op"]))
                key = signature_key(layout, v["signature"], device.index or 0)
                image = _image(self.file, v, arch)
                plan = make_plan(v["id"], v, image, layout, device, max_shared)
                plan.formats = proven_formats(layout, v["signature"])
                plan.entry = (layout.op_name, key, plan, first_shape(v["signature"]))
                plan.targets = self._enforced(state)
                state.plan = plan
            except Exception as e:  # any failure here means: this variant stays on PyTorch
                state.problem = f"cannot prepare: {type(e).__name__}: {e}"
                failed.append(f"{state.id} ({state.problem})")
        _note_output_strides(self.usable(), by_id)
        if failed:
            _warn(f"{self.path}: {len(failed)} variant(s) stay on PyTorch: " + "; ".join(failed))


def _output_strides(variant: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """The strides of the tensor outputs a variant was proven to return."""
    return tuple(tuple(o["stride"]) for o in variant.get("outputs") or []
                 if isinstance(o, dict) and o.get("kind", "tensor") == "tensor" and "stride" in o)


def _note_output_strides(states: Any, by_id: dict[str, dict[str, Any]]) -> None:
    """Each plan's `output_strides` (what compose compares with a compiled graph's before passing an input in
    the layout Inductor holds it in), and whether its kernels may round otherwise from run to run (`reorders`)."""
    from engine.verify.tolerance import may_reorder

    for state in states:
        v = by_id.get(state.id)
        if state.plan is not None and v is not None:
            state.plan.output_strides = _output_strides(v)
            state.plan.reorders = may_reorder(v["op"], v.get("signature"))


def _chain_kernel_plan(v: dict[str, Any], image: bytes, device: Any, max_shared: int) -> runtime.Plan:
    """A module card's kernels as a plan over the chain's inputs `in0..inN` (needs the launcher to take
    chain cards; where it cannot, the variant stays on PyTorch with the loader's warning)."""
    from engine.cast.guard import OpLayout
    from engine.cast.kernels import make_plan

    names = tuple(a["name"] for a in v["signature"]["args"])
    n = len(names)
    layout = OpLayout(v["op"], names, ("tensor",) * n, (False,) * n, (None,) * n, (), False, n > 0, (False,) * n)
    return make_plan(v["id"], v, image, layout, device, max_shared)


def _first_tensor_desc(signature: dict[str, Any]) -> tuple[Any, tuple | None]:
    """(torch dtype, shape) of a variant signature's first argument, shape None when it is no tensor."""
    import torch

    from engine.cast.guard import first_shape

    shape = first_shape(signature)
    return (getattr(torch, signature["args"][0]["dtype"]) if shape is not None else None), shape


def _first_tensor_stride(signature: dict[str, Any]) -> tuple | None:
    """The strides of a variant signature's first argument, None when it is no tensor."""
    from engine.cast.guard import first_shape

    return tuple(signature["args"][0]["stride"]) if first_shape(signature) is not None else None


def other_arch_only(cast_env: dict[str, Any], here: dict[str, Any]) -> bool:
    """The only difference that matters is the GPU arch (a GPU is visible, the torch minor is the same)."""
    from engine.cast.compat import torch_minor

    want = cast_env.get("torch_minor") or torch_minor(str(cast_env.get("torch", "")))
    return bool(here.get("arch")) and cast_env.get("arch") != here["arch"] and want == here.get("torch_minor")


def _images_for(file: CastFile, arch: str) -> str:
    """What the cast has for `arch`, in words: cubins compiled for it, or PTX the driver would compile."""
    n = len(file.variants)
    cubins = sum(1 for v in file.variants if f"cubin:{arch}" in v["files"])
    ptx = sum(1 for v in file.variants if "ptx" in v["files"])
    if cubins == n:
        return f"cubins compiled for {arch} (not proven there)"
    return f"{cubins} of {n} variant(s) compiled for {arch}, PTX for {ptx}"


def _cpp_wanted() -> bool:
    from engine.cast import cpp_router

    return cpp_router.wanted()


def _image(file: CastFile, v: dict[str, Any], arch: str | None) -> bytes:
    """The variant's kernel image for this GPU: the cubin for its exact arch (the proven one, or one
    `export --also-arch` compiled for it), else the PTX (the driver compiles it for this GPU)."""
    for role in ("cubin", f"cubin:{arch}"):
        cubin = v["files"].get(role)
        if cubin and cubin.get("arch") == arch and cubin["path"] in file.files:
            return file.files[cubin["path"]]
    ptx = v["files"].get("ptx")
    if ptx and ptx["path"] in file.files:
        return file.files[ptx["path"]] + b"\0"
    raise CastError("no cubin for this arch and no PTX")


def _warn(message: str) -> None:
    warnings.warn(CastWarning(f"kforge cast {message}"), stacklevel=3)


def load(path: str | Path, *, strict: bool = False, env: dict[str, Any] | None = None,
         only: set[str] | None = None, plans: dict[str, Any] | None = None, unproven_ok: bool = False,
         any_target: bool = False) -> Cast:
    """Read and check a cast for this process. Never raises for a bad file unless `strict`.

    `only`: install just these variant ids (the rest stay on PyTorch, silently).
    `plans`: variant id -> a Python callable run on a hit instead of the variant's kernels (for an op
    variant `fn(bound arguments)`, for a module card `fn([in0, …, inN])` returning the chain's outputs);
    a reference run, or tests without a GPU.
    `unproven_ok`: on a GPU of another arch than the one the cast was proven on (same torch), install it
    anyway (its cubin for this arch, else its PTX). Only after `kforge-tui audit FILE --verify` passed
    here: without it such a cast stays on PyTorch, and the warning says this in one line.
    `any_target`: run every variant wherever the cast is installed, whatever targets its export recorded
    (checks of each variant through the public op in eager: `audit --verify`, confirmation).
    """
    path = str(path)
    try:
        file = read_cast(path)
    except CastError as e:
        if strict:
            raise
        _warn(f"{path}: not installed: {e}; the model runs on PyTorch")
        return Cast(path, None, str(e), None)
    here = env if env is not None else current_env()
    problem = incompatibility(file.manifest["env"], here)
    if problem is not None and other_arch_only(file.manifest["env"], here):
        if unproven_ok:
            _warn(f"{path}: proven on {file.manifest['env'].get('arch')} ({file.manifest['env'].get('gpu')}), "
                  f"installed on {here['arch']} ({here.get('gpu')}) because unproven_ok=True "
                  f"({_images_for(file, here['arch'])})")
            problem = None
        else:
            problem = (f"proven on {file.manifest['env'].get('arch')} ({file.manifest['env'].get('gpu')}), not on "
                       f"this {here['arch']} ({here.get('gpu')}); it carries {_images_for(file, here['arch'])}: check "
                       f"it here with 'kforge-tui audit {path} --verify', then load it with unproven_ok=True")
    if problem is not None:
        if strict:
            raise CastError(f"{path}: {problem}")
        _warn(f"{path}: not installed: {problem}; the model runs on PyTorch")
        return Cast(path, file, problem, here)
    cast = Cast(path, file, None, here, only, plans, any_target)
    if (drift := torch_drift(file.manifest["env"], here)) is not None:
        # Proven against another build of eager: say so once, with the check that settles it here.
        _warn(f"{path}: {drift}; 'kforge-tui audit {path} --verify' re-checks its kernels under this torch")
    validated = (file.manifest.get("source") or {}).get("model_check") or {}
    if validated.get("mode") == "cuda-graphs" and not strict:
        eager = validated.get("eager_speedup")
        _warn(f"{path}: its kernels were validated for CUDA-graph replay of the model"
              + (f" (in plain eager it ran {eager:.2f}x)" if eager else "")
              + "; install it around graph capture, not for eager forwards")
    if file.problems:
        bad = "; ".join(f"{vid}: {why}" for vid, why in file.problems.items())
        if strict:
            raise CastError(f"{path}: {bad}")
        _warn(f"{path}: {len(file.problems)} of {len(file.variants)} variant(s) stay on PyTorch: {bad}")
    return cast
