"""Declarative launch specs: which kernels to launch, with what grid, block, shared memory and arguments.

The agent writes only this spec (TOML or JSON); `parse_spec` checks its structure, `resolve` evaluates
it against a card's arguments into concrete numbers and symbolic pointers the launcher fills in.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

from engine.launch.expr import Env, Expr, SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CTYPES = ("ptr", "i32", "i64", "u32", "u64", "f32", "f64")
INT_RANGES = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1), "u32": (0, 2**32 - 1),
              "u64": (0, 2**64 - 1)}
MAX_SHARED_BYTES = 227 * 1024  # sm_90's largest dynamic shared memory per block (opt-in)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
# Bounds on the spec itself, so a hostile or runaway spec stays cheap to check.
MAX_SOURCE = 64 * 1024
MAX_LAUNCHES = 16
MAX_WORKSPACES = 16
MAX_ARGS = 64
# Bounds by the card, so a spec cannot ask for resources out of all proportion to the work: a workspace
# (or all of them together) of at most max(256 MiB, 16 × the bytes of the card's tensors), and a launch
# of at most max(2**24, 64 × the elements of the card's tensors) threads (grid × block): one thread per
# element with 64-way splits still fits. Without them a 2**62-byte workspace fails inside the allocator
# and a legal but astronomical grid runs until the watchdog.
MIN_WORKSPACE_LIMIT = 256 << 20
WORKSPACE_PER_CARD_BYTE = 16
MIN_THREAD_LIMIT = 2**24
THREADS_PER_CARD_ELEMENT = 64

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_TOP_KEYS = ("launch", "workspace")
_LAUNCH_KEYS = ("kernel", "grid", "block", "shared", "args", "cooperative")
_WORKSPACE_KEYS = ("name", "bytes", "zero")


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument: its C type and its text (a tensor name for `ptr`, else an expression)."""

    ctype: str
    text: str
    expr: Expr | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Validate on construction so a hand-built ArgSpec is as safe as a parsed one.
        if self.ctype not in CTYPES:
            raise SpecError(f"unknown arg type {self.ctype!r} (allowed: {', '.join(CTYPES)})")
        if self.ctype == "ptr":
            if not _is_ptr_text(self.text):
                raise SpecError(f"ptr must name a tensor, an output, a list item or ws.NAME, got {self.text!r}")
        else:
            expr = self.expr if self.expr is not None else Expr.parse(self.text)
            if self.ctype in INT_RANGES:
                expr.check_int()
            object.__setattr__(self, "expr", expr)
            object.__setattr__(self, "text", expr.text)

    @property
    def workspace(self) -> str | None:
        """The workspace a `ptr` names (`ws.NAME`), else None."""
        return self.text[3:] if self.ctype == "ptr" and self.text.startswith("ws.") else None


@dataclass(frozen=True)
class Launch:
    """One kernel launch; grid and block keep the dims as written (missing dims are 1)."""

    kernel: str
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared: Expr
    args: tuple[ArgSpec, ...]
    # A cooperative launch (cuLaunchCooperativeKernel): the driver runs every block of the grid at once or
    # refuses the launch, so blocks may wait for each other (a kernel that keeps data on chip across a
    # grid-wide exchange). The grid must fit the GPU's resident blocks.
    cooperative: bool = False


class WorkspacesKept(str):
    """A prefill (the string it equals) that also asks the launcher for the workspaces its last call so marked
    held, as that call left them (a model's workspaces hold what the last call left): the lane's re-check
    after timing (engine.verify.pipeline.CardCheck.recheck_in_place). Anywhere else it is the plain prefill."""

    __slots__ = ()


class StaleWorkspacesKept(list):
    """WorkspacesKept for a prefill of stale answers (a list, one per output): the re-check's calls find their
    outputs holding the candidate's own last answer and their workspaces as its last call left them, as a
    model's reused blocks hold them."""

    __slots__ = ()


def keeping_workspaces(prefill: str | list) -> WorkspacesKept | StaleWorkspacesKept:
    """`prefill` marked to keep the workspaces (WorkspacesKept for a string, StaleWorkspacesKept for answers)."""
    return WorkspacesKept(prefill) if isinstance(prefill, str) else StaleWorkspacesKept(prefill)


@dataclass(frozen=True)
class Workspace:
    """A scratch buffer the launcher allocates per call (memset to 0 first when `zero`)."""

    name: str
    bytes: Expr
    zero: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    """Launches run in order on one stream, plus the workspaces they share."""

    launches: tuple[Launch, ...]
    workspaces: tuple[Workspace, ...] = ()


@dataclass(frozen=True)
class ResolvedArg:
    """A concrete argument: an int/float, or for `ptr` a reference ('input', name) / ('output', k) /
    ('workspace', name) / ('list', name, j) / ('null',) the launcher turns into a device pointer."""

    ctype: str
    value: Any


@dataclass(frozen=True)
class ResolvedLaunch:
    """A launch with every number evaluated and checked against the device limits."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    args: tuple[ResolvedArg, ...]
    cooperative: bool = False


@dataclass(frozen=True)
class ResolvedSpec:
    """A spec evaluated for one card: launches, and workspaces as (name, bytes, zero)."""

    launches: tuple[ResolvedLaunch, ...]
    workspaces: tuple[tuple[str, int, bool], ...]


# ------------------------------------------------------------------------------------------- parsing


def parse_spec(source: str | dict, *, fmt: str = "auto") -> LaunchSpec:
    """Parse a TOML/JSON text or an already-loaded dict; checks syntax and structure, not values."""
    data = _load(source, fmt)
    _keys(data, _TOP_KEYS, "")
    workspaces = _workspaces(data.get("workspace", []))
    declared = {w.name for w in workspaces}
    raw = data.get("launch")
    if raw is None:
        raise SpecError("missing (at least one [[launch]] table is needed)", "launch")
    if not isinstance(raw, list):
        raise SpecError("must be a list of tables ([[launch]])", "launch")
    if not raw:
        raise SpecError("must have at least one entry", "launch")
    if len(raw) > MAX_LAUNCHES:
        raise SpecError(f"more than {MAX_LAUNCHES} launches", "launch")
    launches = tuple(_launch(item, f"launch[{i}]", declared) for i, item in enumerate(raw))
    return LaunchSpec(launches, workspaces)


def _load(source: str | dict, fmt: str) -> dict:
    if fmt not in ("auto", "toml", "json"):
        raise ValueError(f"fmt must be 'auto', 'toml' or 'json', not {fmt!r}")
    if isinstance(source, dict):
        return source
    if not isinstance(source, str):
        raise SpecError(f"expected TOML/JSON text or a dict, got {type(source).__name__}", "spec")
    if len(source) > MAX_SOURCE:
        raise SpecError(f"longer than {MAX_SOURCE} characters", "spec")
    if fmt == "auto":
        fmt = "json" if source.lstrip().startswith("{") else "toml"
    try:
        data = json.loads(source) if fmt == "json" else tomllib.loads(source)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise SpecError(f"invalid {fmt.upper()}: {e}", "spec") from None
    if not isinstance(data, dict):
        raise SpecError("the top level must be a table/object", "spec")
    return data


def _keys(table: Any, allowed: tuple[str, ...], path: str) -> None:
    if not isinstance(table, dict):
        raise SpecError("must be a table/object", path or "spec")
    for k in table:
        if k not in allowed:
            raise SpecError(f"unknown key (allowed: {', '.join(allowed)})", _join(path, str(k)))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _workspaces(raw: Any) -> tuple[Workspace, ...]:
    if not isinstance(raw, list):
        raise SpecError("must be a list of tables ([[workspace]])", "workspace")
    if len(raw) > MAX_WORKSPACES:
        raise SpecError(f"more than {MAX_WORKSPACES} workspaces", "workspace")
    out: list[Workspace] = []
    for i, w in enumerate(raw):
        path = f"workspace[{i}]"
        _keys(w, _WORKSPACE_KEYS, path)
        for k in ("name", "bytes"):
            if k not in w:
                raise SpecError(f"missing {k!r}", path)
        name = w["name"]
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise SpecError(f"must be an identifier, got {name!r}", f"{path}.name")
        if any(o.name == name for o in out):
            raise SpecError(f"duplicate workspace {name!r}", f"{path}.name")
        zero = w.get("zero", False)
        if not isinstance(zero, bool):
            raise SpecError(f"must be true or false, got {zero!r}", f"{path}.zero")
        out.append(Workspace(name, _int_expr(w["bytes"], f"{path}.bytes"), zero))
    return tuple(out)


def _launch(raw: Any, path: str, declared: set[str]) -> Launch:
    _keys(raw, _LAUNCH_KEYS, path)
    for k in ("kernel", "grid", "block"):
        if k not in raw:
            raise SpecError(f"missing {k!r}", path)
    kernel = raw["kernel"]
    if not isinstance(kernel, str) or not _IDENT.fullmatch(kernel):
        raise SpecError(f"must be the extern \"C\" name of a kernel (an identifier), got {kernel!r}",
                        f"{path}.kernel")
    grid = _dims(raw["grid"], f"{path}.grid")
    block = _dims(raw["block"], f"{path}.block")
    shared = _int_expr(raw.get("shared", 0), f"{path}.shared")
    args_raw = raw.get("args", [])
    if not isinstance(args_raw, list):
        raise SpecError("must be a list of one-key tables like { ptr = \"input\" }", f"{path}.args")
    if len(args_raw) > MAX_ARGS:
        raise SpecError(f"more than {MAX_ARGS} arguments", f"{path}.args")
    args = tuple(_arg(a, f"{path}.args[{j}]", declared) for j, a in enumerate(args_raw))
    cooperative = raw.get("cooperative", False)
    if not isinstance(cooperative, bool):
        raise SpecError(f"must be true or false, got {cooperative!r}", f"{path}.cooperative")
    return Launch(kernel, grid, block, shared, args, cooperative)


def _dims(raw: Any, path: str) -> tuple[Expr, ...]:
    items = raw if isinstance(raw, list) else [raw]  # `block = 256` is taken as [256]
    if not 1 <= len(items) <= 3:
        raise SpecError(f"needs 1 to 3 dims, got {len(items)}", path)
    return tuple(_int_expr(x, f"{path}[{i}]") for i, x in enumerate(items))


def _int_expr(raw: Any, path: str) -> Expr:
    try:
        if isinstance(raw, float):
            raise SpecError(f"must be an int, got {raw!r}")
        expr = Expr.parse(raw)
        expr.check_int()
    except SpecError as e:
        raise e.at(path) from None
    return expr


def _arg(raw: Any, path: str, declared: set[str]) -> ArgSpec:
    if not isinstance(raw, dict) or len(raw) != 1:
        got = ", ".join(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise SpecError(f"must be a table with exactly one of {', '.join(CTYPES)} (got: {got or 'nothing'})",
                        path)
    ((ctype, value),) = raw.items()
    if ctype not in CTYPES:
        raise SpecError(f"unknown arg type {ctype!r} (allowed: {', '.join(CTYPES)})", path)
    where = f"{path} ({ctype})"
    if ctype == "ptr" and not isinstance(value, str):
        raise SpecError(f"must be a tensor name or ws.NAME string, got {value!r}", where)
    if ctype != "ptr" and isinstance(value, float) and ctype not in ("f32", "f64"):
        raise SpecError(f"integer types need an int, got {value!r}", where)
    try:
        if ctype == "ptr":
            arg = ArgSpec(ctype, value)
        else:
            expr = Expr.parse(value)
            arg = ArgSpec(ctype, expr.text, expr)
    except SpecError as e:
        raise e.at(where) from None
    ws = arg.workspace
    if ws is not None and ws not in declared:
        raise SpecError(f"workspace {ws!r} is not declared (declared: {', '.join(sorted(declared)) or 'none'})",
                        where)
    return arg


def _is_ptr_text(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    name = text[3:] if text.startswith("ws.") else text
    return bool(_IDENT.fullmatch(name))


# ----------------------------------------------------------------------------------------- resolving


def resolve(spec: LaunchSpec, env: Env, *, max_shared: int = MAX_SHARED_BYTES,
            max_workspace_bytes: int | None = None) -> ResolvedSpec:
    """Evaluate `spec` for the card `env` describes and check every value against the device limits
    and the card's resource bounds; `max_workspace_bytes` (e.g. free GPU memory) tightens the latter."""
    tensors = env.tensors()
    card_bytes = sum(t.nbytes for t in tensors)
    ws_limit = max(MIN_WORKSPACE_LIMIT, WORKSPACE_PER_CARD_BYTE * card_bytes)
    ws_rule = f"max(256 MiB, {WORKSPACE_PER_CARD_BYTE} × the card's {card_bytes} tensor bytes)"
    if max_workspace_bytes is not None and max_workspace_bytes < ws_limit:
        ws_limit, ws_rule = max(0, max_workspace_bytes), "the GPU memory free for it"
    workspaces = []
    for i, w in enumerate(spec.workspaces):
        path = f"workspace[{i}].bytes"
        n = _eval_int(w.bytes, env, path)
        if n < 0:
            raise SpecError(f"must be ≥ 0, got {n}", path)
        if n > ws_limit:
            raise SpecError(f"workspace {w.name!r} asks for {n} bytes; at most {ws_limit} are allowed "
                            f"({ws_rule})", path)
        workspaces.append((w.name, n, w.zero))
    total = sum(n for _, n, _ in workspaces)
    if total > ws_limit:
        raise SpecError(f"the workspaces ask for {total} bytes together; at most {ws_limit} are allowed "
                        f"({ws_rule})", "workspace")
    card_elems = sum(t.numel for t in tensors)
    max_threads = max(MIN_THREAD_LIMIT, THREADS_PER_CARD_ELEMENT * card_elems)
    names = {w.name for w in spec.workspaces}
    launches = tuple(_resolve_launch(launch, f"launch[{i}]", env, names, max_shared)
                     for i, launch in enumerate(spec.launches))
    for i, rl in enumerate(launches):
        blocks, per_block = math.prod(rl.grid), math.prod(rl.block)
        if blocks * per_block > max_threads:
            raise SpecError(f"{blocks} blocks × {per_block} threads = {blocks * per_block} threads exceed the "
                            f"{max_threads} this card allows (max(2**24, {THREADS_PER_CARD_ELEMENT} × its "
                            f"{card_elems} tensor elements))", f"launch[{i}].grid")
    return ResolvedSpec(launches, tuple(workspaces))


def _eval_int(expr: Expr, env: Env, path: str) -> int:
    try:
        return expr.evaluate_int(env)
    except SpecError as e:
        raise e.at(path) from None


def _resolve_launch(launch: Launch, path: str, env: Env, workspaces: set[str], max_shared: int) -> ResolvedLaunch:
    grid = _resolve_dims(launch.grid, f"{path}.grid", env, MAX_GRID, None)
    block = _resolve_dims(launch.block, f"{path}.block", env, MAX_BLOCK, MAX_THREADS)
    shared = _eval_int(launch.shared, env, f"{path}.shared")
    if not 0 <= shared <= max_shared:
        raise SpecError(f"{shared} bytes of dynamic shared memory; must be 0 … {max_shared}", f"{path}.shared")
    args = tuple(_resolve_arg(a, f"{path}.args[{j}] ({a.ctype})", env, workspaces)
                 for j, a in enumerate(launch.args))
    return ResolvedLaunch(launch.kernel, grid, block, shared, args, launch.cooperative)


def _resolve_dims(dims: tuple[Expr, ...], path: str, env: Env, limits: tuple[int, int, int],
                  max_product: int | None) -> tuple[int, int, int]:
    if not 1 <= len(dims) <= 3:
        raise SpecError(f"needs 1 to 3 dims, got {len(dims)}", path)
    out = [1, 1, 1]
    for i, d in enumerate(dims):
        out[i] = _eval_int(d, env, f"{path}[{i}]")
        if out[i] < 1:
            raise SpecError(f"{'xyz'[i]} = {out[i]}; must be ≥ 1", f"{path}[{i}]")
    # The thread count first: it is the limit people hit, and it names the real problem for [2048].
    if max_product is not None and math.prod(out) > max_product:
        raise SpecError(f"{math.prod(out)} threads per block exceed {max_product}", path)
    for i, v in enumerate(out):
        if v > limits[i]:
            raise SpecError(f"{'xyz'[i]} = {v} exceeds {limits[i]}", f"{path}[{i}]")
    return out[0], out[1], out[2]


def _resolve_arg(arg: ArgSpec, path: str, env: Env, workspaces: set[str]) -> ResolvedArg:
    try:
        if arg.ctype == "ptr":
            ws = arg.workspace
            if ws is not None:
                if ws not in workspaces:
                    raise SpecError(f"workspace {ws!r} is not declared")
                return ResolvedArg("ptr", ("workspace", ws))
            return ResolvedArg("ptr", env.pointer(arg.text))
        assert arg.expr is not None  # set by ArgSpec.__post_init__
        if arg.ctype in INT_RANGES:
            v = arg.expr.evaluate_int(env)
            lo, hi = INT_RANGES[arg.ctype]
            if not lo <= v <= hi:
                raise SpecError(f"value {v} does not fit in {arg.ctype}")
            return ResolvedArg(arg.ctype, v)
        f = float(arg.expr.evaluate(env))
        if arg.ctype == "f32":
            try:
                rounded = struct.unpack("<f", struct.pack("<f", f))[0]
            except OverflowError:
                rounded = float("inf")
            if rounded in (float("inf"), float("-inf")):
                raise SpecError(f"value {f!r} is not representable in f32")
        return ResolvedArg(arg.ctype, f)
    except SpecError as e:
        raise e.at(path) from None


# ---------------------------------------------------------------------------------------- formatting


def spec_to_toml(spec: LaunchSpec) -> str:
    """The spec as TOML that `parse_spec` reads back to an equal spec."""
    lines: list[str] = []
    for w in spec.workspaces:
        lines += ["[[workspace]]", f"name = {_str(w.name)}", f"bytes = {_expr(w.bytes)}"]
        if w.zero:
            lines.append("zero = true")
        lines.append("")
    for launch in spec.launches:
        lines += ["[[launch]]", f"kernel = {_str(launch.kernel)}",
                  f"grid = [{', '.join(_expr(d) for d in launch.grid)}]",
                  f"block = [{', '.join(_expr(d) for d in launch.block)}]",
                  f"shared = {_expr(launch.shared)}"]
        if launch.cooperative:
            lines.append("cooperative = true")
        if launch.args:
            lines.append("args = [")
            lines += [f"  {{ {a.ctype} = {_arg_value(a)} }}," for a in launch.args]
            lines.append("]")
        else:
            lines.append("args = []")
        lines.append("")
    return "\n".join(lines)


def _str(s: str) -> str:
    # Spec texts are printable ASCII (checked on parse), where JSON string escapes are valid TOML.
    return json.dumps(s)


def _expr(e: Expr) -> str:
    return e.text if e.is_literal_int else _str(e.text)


def _arg_value(a: ArgSpec) -> str:
    return _expr(a.expr) if a.expr is not None else _str(a.text)
