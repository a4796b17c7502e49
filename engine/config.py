"""Model configs (`configs/models/*.toml`): load, validate, and build the capture target."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from engine.errors import UsageError
from engine.models.target import CaptureTarget, exit_guarded, target_from_inputs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_TOP_KEYS = {"name", "description", "builder", "params", "small", "dtype", "multiplicity", "capture", "run"}
# [run]: a run's settings for this model (`kforge-tui run` flags win over them; they win over the user
# config). Not part of the config's identity: changing them is no reason to capture again.
RUN_KEYS = {"provider": str, "model": str, "base_url": str, "iterations": int, "strategy": str,
            "wall_time": float, "max_proposals": int, "max_cost": float, "max_tokens": int, "ops": str}
_CAPTURE_KEYS = {"samples", "sample_budget_mb", "total_sample_budget_mb", "layout_twins", "conv_bias_folds"}
_CAPTURE_SWITCHES = ("layout_twins", "conv_bias_folds")   # true, false or "auto"
_DTYPE_KEYS = {"cuda", "cpu"}
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")

DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class ModelConfig:
    """A validated model config. `params` already has `[small]` applied when asked for."""

    path: Path
    sha256: str
    name: str
    description: str
    builder: str
    params: Mapping[str, Any]
    small: bool
    dtypes: Mapping[str, str]
    multiplicity: Mapping[str, int]
    samples: int = 3
    sample_budget_mb: int = 256  # per card; its first sample is always kept
    total_sample_budget_mb: int = 8192  # per capture for op samples, and as much again for chain samples
    raw: Mapping[str, Any] = field(default_factory=dict)
    # Channels-last twins of GroupNorm cards (engine.capture.twins): "auto", True or False. Off by default
    # until their path under compile has passed on the GPU (docs/compile.md, "Layouts: channels-last twins")
    layout_twins: Any = "auto"
    # Conv-bias folded GroupNorm -> SiLU chain cards (engine.capture.folds): "auto" (a CUDA capture that ran a
    # convolution), True or False
    conv_bias_folds: Any = "auto"
    run: Mapping[str, Any] = field(default_factory=dict)  # the [run] table, validated (RUN_KEYS)
    builder_file: Path | None = None  # the builder's module source, part of `sha256`; None if not a file

    def dtype_for(self, device: str) -> torch.dtype:
        """The dtype the model runs in on `device` ('cuda' or 'cpu')."""
        return DTYPES[self.dtypes.get(device, "float32")]


def shipped_configs() -> dict[str, Path]:
    """The reference model configs shipped in the package, by name (resnet50, sd35_medium, …)."""
    from engine.resources import shipped_dir

    root = shipped_dir("configs") / "models"
    return {p.stem: p for p in sorted(root.glob("*.toml"))}


def find_config(path: str | Path) -> Path:
    """A config path as given, else a shipped reference config of that name."""
    p = Path(path)
    if p.is_file() and p.suffix == ".py":
        raise UsageError(f"{p}: a Python file, not a config: pass a .toml that names it, e.g. name = \"{p.stem}\" and "
                         f"builder = \"{p.name}:build\" (docs/examples.md)")
    if p.is_file():
        return p
    shipped = shipped_configs()
    if str(path) in shipped:
        return shipped[str(path)]
    if p.is_dir():
        raise UsageError(f"{p}: a folder, not a config file; pass its .toml (e.g. {p / 'model.toml'})")
    raise UsageError(f"{p}: config file not found; pass a path such as configs/models/resnet50.toml "
                     f"or a shipped name ({', '.join(shipped)})")


def load_config(path: str | Path, *, small: bool = False) -> ModelConfig:
    """Read and validate a model config; every problem is a one-line UsageError naming file and key."""
    p = find_config(path)
    data = p.read_bytes()
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: invalid TOML: {e}") from None

    def bad(key: str, why: str) -> UsageError:
        return UsageError(f"{p}: key '{key}': {why}")

    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise bad(unknown[0], f"unknown key; allowed keys are {', '.join(sorted(_TOP_KEYS))}")
    for key in ("name", "builder"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise bad(key, "required, a non-empty string")
    if not _NAME.fullmatch(raw["name"]):
        raise bad("name", f"{raw['name'][:40]!r} names the workspace's folders: use 1 to 100 letters, digits, "
                  "'.', '_' or '-' (not starting with '.')")
    builder = raw["builder"]
    if builder.count(":") != 1 or not all(builder.split(":")):
        raise bad("builder", f"'{builder}' must be 'module:function' (or 'file.py:function')")
    for table in ("params", "small", "dtype", "multiplicity", "capture", "run"):
        if table in raw and not isinstance(raw[table], dict):
            raise bad(table, f"must be a table ([{table}])")
    params = dict(raw.get("params", {}))
    # The builder is passed the capture's device and the config's dtype for it; a [params] value took their place,
    # and a builder told "cuda" on a CPU capture failed with a hint to take a `device` argument it already took.
    if "device" in params:
        raise bad("params.device", "the builder is passed the capture's device (--device cpu|cuda; default cuda where "
                  "there is one); take it out of [params]")
    if isinstance(params.get("dtype"), str) and params["dtype"] in DTYPES:
        raise bad("params.dtype", f"the builder is passed the config's dtype as a torch.dtype; set it in [dtype] "
                  f"(cuda = \"{params['dtype']}\", cpu = ...) and take it out of [params]")
    small_over = raw.get("small", {})
    for k in small_over:
        if k not in params:
            raise bad(f"small.{k}", "overrides no key of [params]; add it to [params] first")
    if small and "small" not in raw:
        raise bad("small", "--small asks for the config's [small] sizes, and it has none: add a [small] table "
                  "(the params to shrink for a CPU) or leave out --small")
    if small:
        params.update(small_over)
    dtypes = raw.get("dtype", {})
    for k, v in dtypes.items():
        if k not in _DTYPE_KEYS:
            raise bad(f"dtype.{k}", "unknown device; use 'cuda' or 'cpu'")
        if not isinstance(v, str) or v not in DTYPES:
            raise bad(f"dtype.{k}", f"unknown dtype {v!r}; use one of {', '.join(DTYPES)}")
    mult = raw.get("multiplicity", {})
    for k, v in mult.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise bad(f"multiplicity.{k}", "must be a positive integer (layers of this kind in the full model)")
    cap = raw.get("capture", {})
    for k, v in cap.items():
        if k not in _CAPTURE_KEYS:
            raise bad(f"capture.{k}", f"unknown key; allowed: {', '.join(sorted(_CAPTURE_KEYS))}")
        if k in _CAPTURE_SWITCHES:
            if v not in (True, False, "auto"):
                raise bad(f"capture.{k}", 'must be true, false or "auto"')
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "samples" else 1):
            raise bad(f"capture.{k}", "must be a non-negative integer")
    run = _run_table(raw.get("run", {}), bad)
    builder_file = _builder_file(p, builder)
    # Where the builder's own imports are found (resolve_builder puts it on the import path): a `.py` builder's
    # folder, else the config's.
    imports_root = builder_file.parent if builder_file and builder.split(":")[0].endswith(".py") else p.parent.resolve()
    identity_bytes = data
    if "run" in raw:  # the same model with other run settings is the same capture
        rest = {k: v for k, v in raw.items() if k != "run"}
        identity_bytes = b"kforge-config-without-run\0" + json.dumps(rest, sort_keys=True, default=str).encode()
    return ModelConfig(
        path=p, sha256=_identity(identity_bytes, builder, builder_file, imports_root), name=raw["name"],
        description=str(raw.get("description", "")), builder=builder, params=params, small=small,
        dtypes=dict(dtypes), multiplicity=dict(mult), samples=cap.get("samples", 3),
        sample_budget_mb=cap.get("sample_budget_mb", 256),
        total_sample_budget_mb=cap.get("total_sample_budget_mb", 8192), raw=raw, run=run,
        builder_file=builder_file, layout_twins=cap.get("layout_twins", "auto"),
        conv_bias_folds=cap.get("conv_bias_folds", "auto"),
    )


def _run_table(t: Mapping[str, Any], bad: Callable[[str, str], UsageError]) -> dict[str, Any]:
    """The [run] table's values, each of its type and > 0 where it is a number."""
    out: dict[str, Any] = {}
    for k, v in t.items():
        kind = RUN_KEYS.get(k)
        if kind is None:
            raise bad(f"run.{k}", f"unknown key; allowed: {', '.join(sorted(RUN_KEYS))}")
        if kind is str:
            if not isinstance(v, str) or not v.strip():
                raise bad(f"run.{k}", "must be a non-empty string")
            if k == "ops":
                try:
                    re.compile(v)
                except re.error as e:
                    raise bad(f"run.{k}", f"not a regular expression ({e})") from None
        elif isinstance(v, bool) or not isinstance(v, (int,) if kind is int else (int, float)) or not 0 < v < math.inf:
            # TOML has inf and nan: `wall_time = inf` was stored in the run's config as Infinity (not JSON)
            raise bad(f"run.{k}", f"must be {'a whole number >= 1' if kind is int else 'a finite number > 0'}")
        out[k] = float(v) if kind is float else v
    return out


def _builder_file(config_path: Path, builder: str) -> Path | None:
    """The source file of the builder's module, found without importing it: a `.py` path relative to the
    config (it must exist), else the module's `.py` on the import path (a user package or the engine's own
    `engine.models.*`); None where the module is no plain source file (an extension, not installed: then
    `resolve_builder` reports it)."""
    mod_name = builder.split(":")[0]
    if mod_name.endswith(".py"):
        file = (config_path.parent / mod_name).resolve()
        if not file.is_file():
            why = "is not a file" if file.exists() else "not found"
            raise UsageError(f"{config_path}: key 'builder': file {file} {why}; fix the path (relative to "
                             f"the config)")
        return file
    try:
        parts = mod_name.split(".")
        spec = getattr(sys.modules.get(parts[0]), "__spec__", None) or importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            name = ".".join(parts[: i + 1])
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__spec__", None) is not None:
                spec = module.__spec__
                continue
            if spec is None or spec.submodule_search_locations is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, list(spec.submodule_search_locations))
    except (ImportError, ValueError, AttributeError):
        return None
    origin = getattr(spec, "origin", None)
    if spec is None or not spec.has_location or not origin or not origin.endswith(".py"):
        return None
    file = Path(origin)
    return file if file.is_file() else None


def _identity(toml: bytes, builder: str, builder_file: Path | None, root: Path | None = None) -> str:
    """The config's identity (`ModelConfig.sha256`, a capture's `config_sha256`): the TOML bytes plus the
    builder module's source, so that editing the model is a new capture, and the sources of the user's own modules
    it imports from `root` (the folder its imports are found in: `local_sources`). Installed packages do not count."""
    if builder_file is None:
        return hashlib.sha256(toml).hexdigest()
    try:
        source = builder_file.read_bytes()
    except OSError as e:
        raise UsageError(f"{builder_file}: cannot read the builder of this config ({e.strerror or e}); "
                         f"fix its permissions or the config's 'builder' key") from None
    h = hashlib.sha256(b"kforge-config-identity-v2\0")
    parts = [toml, builder.encode(), source]
    for file in local_sources(builder_file, root) if root is not None else []:
        # A model split in files (`from layers import Block`): editing layers.py was no new capture, and `run`
        # searched the old model's cards. (A builder that imports none keeps the identity it had.)
        with contextlib.suppress(OSError):
            parts += [str(file.relative_to(root)).encode(), file.read_bytes()]
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


_MAX_LOCAL_SOURCES = 500


def local_sources(builder_file: Path, root: Path) -> list[Path]:
    """The `.py` files under `root` that the builder file imports, followed through their own imports (read, not
    imported): a model split in files next to its builder (`from layers import Block`, `from mypkg.net import
    Net`, relative imports inside such a package). A name that Python finds elsewhere first (the standard
    library, an installed package) is not followed; `root` comes after them on the import path."""
    import ast

    root = root.resolve()
    found: dict[Path, None] = {}
    todo, done = [builder_file.resolve()], set()

    def module_files(base: Path, parts: list[str]) -> list[Path]:
        files = []
        for i in range(1, len(parts) + 1):
            path = base.joinpath(*parts[:i])
            if path.with_suffix(".py").is_file():
                files.append(path.with_suffix(".py"))
                break   # a module, not a package: what follows are names in it
            if not path.is_dir():
                break
            if (path / "__init__.py").is_file():
                files.append(path / "__init__.py")
        return files

    def elsewhere(top: str) -> bool:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return False
        origins = [spec.origin] if spec is not None and spec.origin else []
        origins += list(spec.submodule_search_locations or []) if spec is not None else []
        return spec is not None and not any(Path(o).resolve().is_relative_to(root) for o in origins
                                            if o not in ("built-in", "frozen"))

    while todo and len(done) < _MAX_LOCAL_SOURCES:
        file = todo.pop()
        if file in done:
            continue
        done.add(file)
        try:
            tree = ast.parse(file.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            wanted: list[tuple[Path, list[str]]] = []
            if isinstance(node, ast.Import):
                wanted = [(root, a.name.split(".")) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:   # relative: inside the file's own package
                base = file.parent
                for _ in range(node.level - 1):
                    base = base.parent
                mod = node.module.split(".") if node.module else []
                wanted = [(base, [*mod, a.name]) for a in node.names] + ([(base, mod)] if mod else [])
            elif isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module.split(".")
                wanted = [(root, [*mod, a.name]) for a in node.names] + [(root, mod)]
            for base, parts in wanted:
                if not base.resolve().is_relative_to(root) or (base == root and elsewhere(parts[0])):
                    continue
                for f in module_files(base, parts):
                    f = f.resolve()
                    if f.is_relative_to(root) and f not in found and f != builder_file.resolve():
                        found[f] = None
                        todo.append(f)
    return sorted(found)


def _importable(folder: Path) -> None:
    """`folder` on the import path (after what is there), once."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


def resolve_builder(config: ModelConfig):
    """Import the config's builder function; a module path or a `.py` file next to the config."""
    mod_name, func_name = config.builder.split(":")
    try:
        if mod_name.endswith(".py"):
            file = config.builder_file or (config.path.parent / mod_name).resolve()
            if not file.is_file():
                raise UsageError(f"{config.path}: key 'builder': file {file} not found")
            _importable(file.parent)   # its neighbours, as `python file.py` would find them (a model split in files)
            spec = importlib.util.spec_from_file_location(f"kforge_user_model_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            # Registered as imported: torch.compile (Dynamo) looks the model's classes up by module name,
            # and a module missing from sys.modules failed the whole-model check under compile on the H200.
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(spec.name, None)
                raise
        else:
            _importable(config.path.parent.resolve())   # a module next to the config, as from that folder
            module = importlib.import_module(mod_name)
    except UsageError:
        raise
    except Exception as e:  # an import error of the user's module is bad input, not our crash
        first = (str(e).strip().splitlines() or [""])[0]
        fix = ("install it or fix the module path" if isinstance(e, ImportError)
               else "fix the module (--debug shows the traceback)")
        raise UsageError(f"{config.path}: key 'builder': cannot import '{mod_name}' ({type(e).__name__}: "
                         f"{first}); {fix}") from e
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise UsageError(f"{config.path}: key 'builder': '{mod_name}' has no function '{func_name}'")
    return fn


def _shape_of(result: Any) -> str:
    """What a builder returned, in words: `a tuple of 3 (Module, tuple, dict)`, `a Module`."""
    if isinstance(result, (tuple, list)):
        kinds = ", ".join("Module" if isinstance(x, torch.nn.Module) else type(x).__name__ for x in result[:4])
        more = ", ..." if len(result) > 4 else ""
        swapped = (len(result) == 2 and isinstance(result[1], torch.nn.Module)
                   and not isinstance(result[0], torch.nn.Module))
        return (f"a {type(result).__name__} of {len(result)} ({kinds}{more})"
                + (": the model comes first" if swapped else ""))
    if result is None:
        return "None (does it end without `return`?)"
    return f"a {'Module' if isinstance(result, torch.nn.Module) else type(result).__name__}"


def build_target(config: ModelConfig, device: torch.device) -> CaptureTarget:
    """Call the builder with the config's params (plus device/dtype where it accepts them)."""
    fn = resolve_builder(config)
    kwargs = dict(config.params)
    sig = inspect.signature(fn)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for name, value in (("device", device), ("dtype", config.dtype_for(device.type)), ("small", config.small)):
        if accepts_any or name in sig.parameters:
            kwargs.setdefault(name, value)
    _check_params(config, fn, kwargs)
    try:
        result = fn(**kwargs)
    except UsageError:
        raise
    except SystemExit as e:   # a builder that calls sys.exit (a script's main): kforge ended silently with its code
        raise UsageError(f"{config.path}: builder {config.builder} called sys.exit({e.code!r}); a builder returns "
                         "(model, example_inputs)") from e
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        hint = "check its [params]"
        if any(w in first for w in ("CUDA", "cuda", "NVIDIA")) and not torch.cuda.is_available():
            hint = ("this machine has no CUDA GPU: give the builder a `device` argument (it is passed the capture's "
                    "device) and build the model and its inputs there")
        raise UsageError(f"{config.path}: builder {config.builder} failed ({type(e).__name__}: {first}); "
                         f"{hint} (--debug shows the traceback)") from e
    if isinstance(result, CaptureTarget):
        target = result
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        target = target_from_inputs(*result)
    else:
        raise UsageError(f"{config.path}: builder {config.builder} must return (model, example_inputs) or a "
                         f"CaptureTarget, got {_shape_of(result)}; example_inputs is a tuple of the forward's "
                         "positional inputs or a dict of its keyword inputs")
    # (a build asked for on 'meta' itself, as the full-depth tests make one to count layers, is meta by design)
    meta = None if torch.device(device).type == "meta" else next(
        (name for name, t in [*target.module.named_parameters(), *target.module.named_buffers()] if t.is_meta), None)
    if meta is not None:
        raise UsageError(f"{config.path}: builder {config.builder} returned a model whose '{meta}' is on the 'meta' "
                         "device (no data): Kernel Forge runs the model on real data; build it on the `device` the "
                         "builder is passed (after a meta init: to_empty(device=device) and load or fill its weights)")
    # Inference only: capture, the lane, the whole-model check and the benchmarks all see the model in eval
    # mode (dropout off, batch norm on its running statistics), whatever mode the builder left it in.
    training = [f"module '{name}'" if name else "the model" for name, m in target.module.named_modules() if m.training]
    try:
        target.module.eval()
    except NotImplementedError as e:   # a torch.export program's module(): "Calling eval() is not supported yet."
        # It said "internal error: NotImplementedError: ..." (exit 1). Its mode was fixed when it was exported.
        target = replace(target, notes={**target.notes, "eval mode": (
            f"the model's mode cannot be switched ({type(e).__name__}: {e}), as with the module() of a torch.export "
            "program, whose dropout and batch norm run as they were exported: Kernel Forge runs it as it is; export "
            "it from the model in eval mode (model.eval() before torch.export.export) for inference")})
        training = []
    if training:
        target = replace(target, notes={**target.notes, "eval mode": (
            f"the builder returned {training[0]}{f' and {len(training) - 1} more module(s)' if len(training) > 1 else ''}"
            " in training mode; Kernel Forge runs it in eval mode (inference: dropout off, batch norm on its "
            "running statistics)")})
    # A module compiled by torch.compile runs as Inductor's code in the user's model, where a cast's kernels are not
    # called (docs/compile.md); under capture Dynamo steps aside and its ops run as eager runs them.
    compiled = [f"module '{name}'" if name else "the model" for name, m in target.module.named_modules()
                if _compiled(m)]
    if compiled:
        target = replace(target, notes={**target.notes, "torch.compile": (
            f"{compiled[0]}{f' and {len(compiled) - 1} more' if len(compiled) > 1 else ''} is compiled by "
            "torch.compile: its cards are its ops as eager runs them (under capture Dynamo steps aside), but in the "
            "model they run as Inductor's code, which a cast's kernels do not reach; return it uncompiled and "
            "compile the model through the cast, cast.compile(model) (docs/compile.md)")})
    # A config's [multiplicity] describes its shrunk build; a builder asked for the real depth built every layer.
    if config.multiplicity and not target.full_depth:
        target = replace(target, multiplicity={**target.multiplicity, **config.multiplicity})
    # Every forward of the model, by capture or export, reports a sys.exit in it as an error (ModelExited).
    target = replace(target, forward=exit_guarded(target.forward))
    known = {name for name, _ in target.module.named_modules()}
    for prefix in target.multiplicity:
        if prefix not in known:
            raise UsageError(f"{config.path}: key 'multiplicity.{prefix}': no module of that path in the "
                             f"model; use a name from model.named_modules()")
    return target


def _compiled(m: torch.nn.Module) -> bool:
    """Whether `m` is torch.compile's wrapper of a module (an OptimizedModule) or compiled in place (m.compile())."""
    return ((type(m).__name__ == "OptimizedModule" and type(m).__module__.startswith("torch._dynamo"))
            or getattr(m, "_compiled_call_impl", None) is not None)


def _check_params(config: ModelConfig, fn: Callable, keys: Mapping[str, Any]) -> None:
    """A UsageError naming the first of `keys` that the builder `fn` takes no argument of."""
    sig = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    unknown = [k for k in keys if k not in sig.parameters]
    if unknown:
        raise UsageError(f"{config.path}: key 'params.{unknown[0]}': builder {config.builder} "
                         f"takes no such argument")


def override_params(config: ModelConfig, params: Mapping[str, Any]) -> ModelConfig:
    """`config` with some of its [params] replaced (a script's `NAME@key=value`); a key its builder does not take
    is the UsageError `build_target` gives. The overrides are part of the config's identity."""
    if not params:
        return config
    _check_params(config, resolve_builder(config), params)
    h = hashlib.sha256(b"kforge-config-params-override\0" + config.sha256.encode())
    h.update(json.dumps(dict(params), sort_keys=True).encode())
    return replace(config, params={**config.params, **params}, sha256=h.hexdigest())


def config_model(config: str, device: str = "cuda",
                 params: Mapping[str, Any] | None = None) -> tuple[torch.nn.Module, Callable[[], Any]]:
    """(module, forward) of a config (a shipped name like "resnet50" or a path), exactly as `capture` and `run`
    build it, so an end-to-end check runs the calls a run's cast was made for; `params` overrides its [params]
    (e.g. {"full_depth": True})."""
    target = build_target(override_params(load_config(config), params or {}), torch.device(device))
    return target.module, target.forward


# ------------------------------------------------------------------ models named in scripts: NAME@key=value

@dataclass(frozen=True)
class ModelSpec:
    """A model as the whole-model scripts name it: a config (a shipped name, a file, or a script's own model
    such as bench_e2e's sd35_vae) and overrides of its [params], written `NAME@key=value[,key=value]`."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def overrides(self) -> str:
        """The overrides as written after '@' (`full_depth=true`); '' without any."""
        return ",".join(f"{k}={_toml_scalar(v)}" for k, v in self.params.items())

    @property
    def label(self) -> str:
        """How reports name the model: the config's stem, then its overrides (`gemma4_e2b@full_depth=true`)."""
        stem = Path(self.name).stem
        return f"{stem}@{self.overrides}" if self.params else stem


def _toml_scalar(v: Any) -> str:
    """`v` as TOML writes it (true, 3, 0.5, "a string")."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, str) else repr(v)


def _parse_scalar(text: str) -> Any:
    """One TOML scalar (true, false, 3, 0.5, "a string"); ValueError otherwise."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        doc = {}
    value = doc.get("v")
    if len(doc) != 1 or not isinstance(value, (bool, int, float, str)):
        raise ValueError
    return value


def parse_model_spec(text: str) -> ModelSpec:
    """`NAME` or `NAME@key=value[,key=value]` as a ModelSpec; a UsageError naming `text` when it is malformed."""
    name, at, rest = text.partition("@")
    name = name.strip()
    if not name:
        raise UsageError(f"{text!r}: no model name before '@'; write NAME@key=value, e.g. gemma4_e2b@full_depth=true")
    params: dict[str, Any] = {}
    if at:
        for item in rest.split(","):
            key, eq, value = (part.strip() for part in item.partition("="))
            if not eq or not key.isidentifier() or not value:
                raise UsageError(f"{text!r}: {item!r} is not key=value; write NAME@key=value[,key=value]")
            if key in params:
                raise UsageError(f"{text!r}: {key!r} is given twice")
            try:
                params[key] = _parse_scalar(value)
            except ValueError:
                raise UsageError(f"{text!r}: {value!r} is not a TOML value; write true, false, a number or a quoted "
                                 f"string ({key}=\"...\")") from None
    return ModelSpec(name, params)


def load_model_spec(text: str) -> tuple[ModelSpec, ModelConfig]:
    """`NAME` or `NAME@key=value[,key=value]` parsed and its config loaded with those [params] overridden (as
    bench_e2e builds a model); a UsageError naming what is wrong."""
    spec = parse_model_spec(text)
    return spec, override_params(load_config(spec.name), spec.params)


def parse_model_list(text: str) -> list[ModelSpec]:
    """A comma-separated list of models, each `NAME` or `NAME@key=value[,key=value]`: a `key=value` after
    `NAME@...` is one more override of that model (so `a@x=1,y=2,b` is two models)."""
    items: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and "@" not in piece:
            if not items or "@" not in items[-1]:
                raise UsageError(f"{text!r}: {piece!r} follows no NAME@; write NAME@key=value[,key=value]")
            items[-1] += "," + piece
        else:
            items.append(piece)
    return [parse_model_spec(item) for item in items]


def sd35_vae(device: str = "cuda") -> tuple[torch.nn.Module, Callable[[], Any]]:
    """The sd35_medium config's VAE decode alone: a 1x16x128x128 bf16 latent to a 1024x1024 image."""
    module, _ = config_model("sd35_medium", device)
    vae = module.vae
    del module.transformer
    cfg = vae.config
    latent = torch.randn(1, cfg.latent_channels, 128, 128, generator=torch.Generator().manual_seed(0)
                         ).to(device, torch.bfloat16)
    return vae, lambda: vae.decode(latent / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0]


def config_or_error(model: str, small: bool = False) -> tuple[ModelConfig | None, str | None]:
    """(the config at `model`, None), or (None, the one line a script prints before exiting 2) for a config that
    does not load: the input named, and why. `model` may be `CONFIG@key=value[,key=value]` (parse_model_spec):
    the config with those [params] overridden, e.g. configs/examples/gemma4_e2b_decode.toml@full_depth=true."""
    try:
        spec = parse_model_spec(model)
        return override_params(load_config(spec.name, small=small), spec.params), None
    except (UsageError, FileNotFoundError, ValueError) as e:
        return None, f"error: --model {model}: {e}"
