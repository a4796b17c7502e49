"""`engine.cast.load(path)`: a cast ready to install, or an inert one that says once why not.

    cast = engine.cast.load("sd35.cast")
    with cast.enabled():
        image = pipe(...)
    cast.stats()   # hits per variant, misses per op
    compiled = cast.compile(model)   # torch.compile whose graphs call the cast's ops (docs/compile.md)

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
from engine.cast.compat import current_env, incompatibility
from engine.cast.format import CastError, CastFile, CastWarning, read_cast


@dataclass
class VariantState:
    """One variant of a loaded cast: usable or not, and why not."""

    id: str
    op: str
    signature_text: str
    problem: str | None = None
    plan: Any = None
    cpp: tuple[str, int] | None = None  # (op, index of its plan) while the C++ router dispatches it

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
                 only: set[str] | None = None):
        self.path = path
        self.file = file
        self.problem = problem            # why nothing of this cast can run here, or None
        self.env = env
        self.variants: list[VariantState] = []
        if file is not None:
            for v in file.variants:
                why = problem or file.problems.get(v["id"])
                if why is None and only is not None and v["id"] not in only:
                    why = "not selected (load(..., only=…))"
                self.variants.append(VariantState(v["id"], v["op"], v.get("signature_text", ""), why))
        self._lock = threading.RLock()
        self._cpp_ops: list[str] = []  # ops this cast routes through the C++ router while installed
        self._cpp_kept: dict[str, dict[str, Any]] = {}  # C++ counters of routes since removed
        self._installed = False
        self._prepared = False
        self._depth = 0

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
        """`torch.compile(model, **kwargs)` whose graphs call this cast's ops where it covers them (inference
        only; the cast must be installed when the model is compiled and run). See engine.cast.compose."""
        from engine.cast import compose

        return compose.compile(self, model, **kwargs)

    def backend(self, **kwargs: Any) -> Any:
        """A `torch.compile(..., backend=cast.backend(mode=…, options=…))` backend doing what `compile` does."""
        from engine.cast import compose

        return compose.backend(self, **kwargs)

    def usable(self) -> list[VariantState]:
        """Variants that will (or do) run."""
        return [v for v in self.variants if v.problem is None]

    def stats(self) -> dict[str, Any]:
        """Hits per variant and misses per op (misses count every cast's routes for the op)."""
        ops = {v.op for v in self.variants}
        misses, near, through, near_keys, grad = {}, {}, {}, {}, {}
        for (op, _key), route in runtime.routes().items():
            if op in ops:
                misses[op] = route.misses
                grad[op] = route.grad_declines
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
        return {"file": self.path, "installed": self._installed, "problem": self.problem,
                "variants": [{"id": v.id, "op": v.op, "signature": v.signature_text, "hits": v.hits,
                              "active": v.plan is not None and self._installed, "problem": v.problem,
                              "router": "c++" if v.cpp else "python"}
                             for v in self.variants],
                "misses": misses, "near_misses": near, "fallthrough": through, "near_miss_keys": near_keys,
                "grad_declines": grad}

    def reset_stats(self) -> None:
        self._cpp_kept = {}
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
                route.near_keys = []

    # ---- install / remove --------------------------------------------------------------------------

    def install(self) -> Cast:
        """Put the guarded overrides in place (a no-op when already installed or nothing is usable)."""
        with self._lock:
            if self._installed or self.problem is not None:
                return self
            self._prepare()
            usable = [v for v in self.usable() if v.plan is not None]
            if usable and _cpp_wanted():
                usable = self._install_cpp(usable)
            entries = [v.plan.entry for v in usable]
            shadowed = runtime.add_entries(self, entries) if entries else []
            if shadowed:
                _warn(f"{self.path}: {len(shadowed)} variant(s) already covered by another installed cast "
                      f"({', '.join(shadowed)}); those stay with it")
            self._installed = True
            return self

    def remove(self) -> None:
        """Take this cast's overrides out; ops no other cast covers get their original kernel back."""
        with self._lock:
            if not self._installed:
                return
            runtime.remove_owner(self)
            if self._cpp_ops:
                from engine.cast import cpp_router

                ext = cpp_router.extension()
                for v in self.variants:  # the C++ counters go with the routes: keep them, as the Python router's
                    if v.cpp is not None and v.plan is not None:
                        v.plan.hits = v.hits
                for op in self._cpp_ops:
                    st = cpp_router.stats(ext, op, "CUDA")
                    kept = self._cpp_kept.setdefault(op, {"misses": 0, "near_misses": 0, "near_keys": []})
                    kept["misses"] += int(st.get("misses", 0))
                    kept["near_misses"] += int(st.get("near_misses", 0))
                    kept["near_keys"] += [k for k in st.get("near_keys", []) if k not in kept["near_keys"]]
                    cpp_router.uninstall(ext, op, "CUDA")
                self._cpp_ops = []
                for v in self.variants:
                    v.cpp = None
            self._installed = False

    @contextlib.contextmanager
    def enabled(self) -> Iterator[Cast]:
        """Installed inside the block (nested blocks keep it until the outermost ends)."""
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self.install()
        try:
            yield self
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self.remove()

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
                cpp_router.install(ext, op, "CUDA", plans)
            except Exception as e:  # another cast routes it in C++, or a plan it cannot take: Python
                _warn(f"{self.path}: {op} stays with the Python router ({type(e).__name__}: {e})")
                rest.extend(states)
                continue
            self._cpp_ops.append(op)
            for i, st in enumerate(states):
                st.cpp = (op, i)
        return rest

    def _prepare(self) -> None:
        """Load modules and resolve launches once (needs the GPU); a variant that fails stays on PyTorch."""
        if self._prepared:
            return
        self._prepared = True
        import torch

        from engine.cast.guard import first_shape, layout_of, signature_key
        from engine.cast.kernels import make_plan
        from engine.launch import cuda_driver as drv
        from engine.ops import resolve_op

        assert self.file is not None
        device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=device)  # the primary context must exist before the driver API uses it
        drv.init()
        props = torch.cuda.get_device_properties(device)
        max_shared = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
        arch = self.env.get("arch") if self.env else None
        failed = []
        by_id = {v["id"]: v for v in self.file.variants}
        for state in self.usable():
            v = by_id[state.id]
            try:
                layout = layout_of(resolve_op(v["op"]))
                key = signature_key(layout, v["signature"], device.index or 0)
                image = _image(self.file, v, arch)
                plan = make_plan(v["id"], v, image, layout, device, max_shared)
                plan.entry = (layout.op_name, key, plan, first_shape(v["signature"]))
                state.plan = plan
            except Exception as e:  # any failure here means: this variant stays on PyTorch
                state.problem = f"cannot prepare: {type(e).__name__}: {e}"
                failed.append(f"{state.id} ({state.problem})")
        if failed:
            _warn(f"{self.path}: {len(failed)} variant(s) stay on PyTorch: " + "; ".join(failed))


def _cpp_wanted() -> bool:
    from engine.cast import cpp_router

    return cpp_router.wanted()


def _image(file: CastFile, v: dict[str, Any], arch: str | None) -> bytes:
    cubin = v["files"].get("cubin")
    if cubin and cubin.get("arch") == arch and cubin["path"] in file.files:
        return file.files[cubin["path"]]
    ptx = v["files"].get("ptx")
    if ptx and ptx["path"] in file.files:
        return file.files[ptx["path"]] + b"\0"
    raise CastError("no cubin for this arch and no PTX")


def _warn(message: str) -> None:
    warnings.warn(CastWarning(f"kforge cast {message}"), stacklevel=3)


def load(path: str | Path, *, strict: bool = False, env: dict[str, Any] | None = None,
         only: set[str] | None = None) -> Cast:
    """Read and check a cast for this process. Never raises for a bad file unless `strict`.

    `only`: install just these variant ids (the rest stay on PyTorch, silently).
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
    if problem is not None:
        if strict:
            raise CastError(f"{path}: {problem}")
        _warn(f"{path}: not installed: {problem}; the model runs on PyTorch")
        return Cast(path, file, problem, here)
    cast = Cast(path, file, None, here, only)
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
