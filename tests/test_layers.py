"""The layer contract: the pipeline reads top to bottom, and no module imports upward or in a circle.

Every `import` and `from … import` in engine/ and kforge_tui/ counts, at module level and inside
functions alike (a function-level import is still an arrow; hiding it in a function only delays the
failure). docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom first. A module may import from its own layer and the layers below it, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("records", ("engine", "engine.cards", "engine.errors", "engine.ops", "engine.outcomes", "engine.progress",
                 "engine.resources")),
    ("storage and maths", ("engine.store", "engine.search", "engine.bench")),
    ("models", ("engine.models",)),
    ("config", ("engine.config", "engine.userconfig")),
    ("capture", ("engine.capture",)),
    ("toolchain", ("engine.launch", "engine.compile")),
    ("verification", ("engine.verify",)),
    ("loading a cast", ("engine.cast",)),
    ("proposing and evaluating", ("engine.propose", "engine.lane")),
    ("running and exporting", ("engine.run", "engine.export")),
    ("command line", ("engine.cli",)),
    ("TUI", ("kforge_tui",)),
]

# Rooms of one layer that stay apart: each is developed and tested without the other.
APART: list[tuple[str, str]] = [
    ("engine.launch", "engine.compile"), ("engine.compile", "engine.launch"),
    ("engine.propose", "engine.lane"), ("engine.lane", "engine.propose"),
    ("engine.run", "engine.export"), ("engine.export", "engine.run"),
]

# What the TUI must never import, even though it sits on top: the engine's GPU and search code runs in
# the engine's own process (DESIGN.md: the TUI reads the store and starts the engine detached).
# The card record (engine.cards) is plain data: the TUI names chain cards and counts their calls once by it.
TUI_MAY_IMPORT = ("engine.cli", "engine.cards", "engine.errors", "engine.outcomes", "engine.store",
                  "engine.resources", "engine.progress", "kforge_tui",
                  # how the entry point ends when a model left a thread running (imports only os, sys, threading)
                  "engine.exits",
                  # the signal handling every command shares (serve stops on SIGTERM as run does): it imports
                  # nothing of the engine but engine.errors, which test_interrupt_stays_light holds it to
                  "engine.run.interrupt")

# Where `import engine.cast` may reach: a user loading a cast needs neither the exporter nor the engine.
CAST_MAY_NOT_IMPORT = ("engine.export", "engine.run", "engine.propose", "engine.lane", "engine.store",
                       "engine.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """Every project module `path` imports (module or function level), with the line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from engine.cast import runtime` imports the module engine.cast.runtime; `from engine.cast
            # import load` imports the package engine.cast
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub if sub in modules else node.module, node.lineno))
    return [(m, ln) for m, ln in out if m in modules]


def _graph() -> dict[str, list[tuple[str, int]]]:
    files = [p for pkg in ("engine", "kforge_tui") for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    return {name: sorted({(m, ln) for m, ln in _imports(path, set(modules)) if m != name})
            for name, path in modules.items()}


def _room(module: str) -> str:
    """The layer entry a module belongs to: the longest listed prefix."""
    best = ""
    for _, rooms in LAYERS:
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and len(room) > len(best):
                best = room
    return best


def _rank(room: str) -> int:
    return next(i for i, (_, rooms) in enumerate(LAYERS) if room in rooms)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


GRAPH = _graph()


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if not _room(m)] == []


def test_no_import_runs_up_the_layers():
    upward = []
    for src, targets in GRAPH.items():
        for dst, line in targets:
            a, b = _room(src), _room(dst)
            if b == "engine":  # the package's face (engine/__init__.py) holds nothing but a docstring
                continue
            if _rank(b) > _rank(a) or (a, b) in APART:
                upward.append(f"{src}:{line} imports {dst} ({a} -> {b})")
    assert upward == []


def test_the_tui_never_imports_engine_gpu_or_search_code():
    bad = [f"{src}:{line} imports {dst}" for src, targets in GRAPH.items() if src.startswith("kforge_tui")
           for dst, line in targets if not _within(dst, TUI_MAY_IMPORT)]
    assert bad == []


def test_interrupt_stays_light():
    """The TUI may import engine.run.interrupt only while it reaches nothing heavier than engine.errors."""
    bad = [f"engine.run.interrupt:{line} imports {dst}" for dst, line in GRAPH.get("engine.run.interrupt", ())
           if dst.startswith(("engine", "kforge_tui")) and dst != "engine.errors"]
    assert "engine.run.interrupt" in GRAPH and bad == []


def test_loading_a_cast_needs_no_exporter_engine_or_store():
    bad = [f"{src}:{line} imports {dst}" for src, targets in GRAPH.items() if _within(src, ("engine.cast",))
           for dst, line in targets if _within(dst, CAST_MAY_NOT_IMPORT)]
    assert bad == []


def test_no_import_circles():
    # Tarjan's strongly connected components over modules; any component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == []


@pytest.mark.parametrize("rule", ["upward", "circle"])
def test_the_checks_can_fail(rule, monkeypatch):
    """The contract is only worth something if a violation is caught: plant one of each kind."""
    planted = {k: list(v) for k, v in GRAPH.items()}
    if rule == "upward":
        planted["engine.cards"] = [("engine.run.orchestrator", 1)]
        monkeypatch.setitem(globals(), "GRAPH", planted)
        with pytest.raises(AssertionError):
            test_no_import_runs_up_the_layers()
    else:
        planted["engine.search.tree"] = [("engine.bench.stats", 1)]
        planted["engine.bench.stats"] = [("engine.search.tree", 1)]
        monkeypatch.setitem(globals(), "GRAPH", planted)
        with pytest.raises(AssertionError):
            test_no_import_circles()
