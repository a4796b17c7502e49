"""Every key the TUI answers to, with a stable id per action so a config file can remap it.

`~/.config/kforge/tui.toml` (or `--keymap FILE`) may hold:

    [keymap]
    "app.pause" = "P"
    "tree.best" = "B,ctrl+b"

Ids are listed by `kforge-tui --help-keys`-style docs below and shown in the command palette.
"""

from __future__ import annotations

import sys
from pathlib import Path

from textual.binding import Binding

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG = Path("~/.config/kforge/tui.toml")


def B(key: str, action: str, description: str, id: str, show: bool = True, priority: bool = False,
      tooltip: str = "") -> Binding:
    """A binding with an id (remappable) and a tooltip (its command-palette title; the footer shows the
    shorter description)."""
    return Binding(key, action, description, show=show, id=id, tooltip=tooltip or description, priority=priority)


APP = [
    B("question_mark", "toggle_help", "Help", "app.help", tooltip="Help: every key of this screen"),
    B("T", "next_theme", "Theme", "app.theme", tooltip="Next theme"),
    B("q", "quit", "Quit", "app.quit"),
    B("o", "switch_mode('overview')", "Overview", "app.overview"),
    B("c", "switch_mode('cards')", "Cards", "app.cards"),
    B("f", "switch_mode('failures')", "Failures", "app.failures"),
    # Before Compare: at 80 columns the footer has room for one of them, and a new user wants the charts.
    B("g", "switch_mode('charts')", "Charts", "app.charts", tooltip="Charts of the run"),
    B("m", "switch_mode('compare')", "Compare", "app.compare"),
    B("p", "control('pause')", "Pause", "app.pause"),
    B("r", "control('resume')", "Resume", "app.resume"),
    B("X", "stop_run", "Stop run", "app.stop"),
]
# Shown first in every footer, so 80 columns never lose them (the footer does not wrap).
ESSENTIAL = ("app.help", "app.theme", "app.quit")
CARDS = [
    B("enter", "open_tree", "Tree", "cards.tree"),
    B("slash", "filter", "Filter", "cards.filter"),
    B("s", "sort_next", "Sort", "cards.sort"),
    B("v", "sort_reverse", "Reverse", "cards.reverse", show=False),
    B("l", "latency", "Chart", "cards.latency", tooltip="Chart of the card's search"),
    B("exclamation_mark", "prioritize", "Prioritise", "cards.prioritize"),
    B("escape", "clear_filter", "Clear filter", "cards.clear", show=False),
]
TREE = [
    B("enter", "open_detail", "Detail", "tree.detail"),
    B("b", "best", "Best", "tree.best"),
    B("n", "next_failure", "Next failed", "tree.next_failure"),
    B("N", "prev_failure", "Prev failed", "tree.prev_failure", show=False),
    # Priority: the focused Tree would otherwise scroll sideways on the arrows.
    B("right", "expand", "Expand / into", "tree.expand", show=False, priority=True),
    B("left", "collapse", "Collapse / to parent", "tree.collapse", show=False, priority=True),
    B("l", "latency", "Chart", "tree.latency", tooltip="Chart of the card's search"),
    B("exclamation_mark", "prioritize", "Prioritise", "tree.prioritize", show=False),
    B("escape", "back", "Back", "tree.back"),
]
DETAIL_TABS = ["source", "diff", "launch", "compile", "error", "verify", "timing", "proposer"]
DETAIL = [B(str(i + 1), f"tab('{t}')", t.capitalize() if t != "compile" else "Compile log", f"detail.{t}",
            show=t in ("source", "compile", "error", "verify"))
          for i, t in enumerate(DETAIL_TABS)] + [B("escape", "back", "Back", "detail.back")]
FAILURES = [
    B("enter", "open_detail", "Detail", "failures.detail"),
    B("right_square_bracket", "category(1)", "Next category", "failures.next"),
    B("left_square_bracket", "category(-1)", "Prev category", "failures.prev"),
    B("a", "category(0)", "All", "failures.all"),
]
OVERVIEW = [B("e", "exports", "Exports", "overview.exports",
              tooltip="Exports of the run, per target")]
EXPORTS = [B("escape", "back", "Back", "exports.back")]
COMPARE = [B("a", "all_runs", "All runs", "compare.all", show=False)]
LATENCY = [B("escape", "back", "Back", "latency.back")]


def load_keymap(path: Path | None = None) -> dict[str, str]:
    """The `[keymap]` table of the TUI config (`path`, else the default file when it exists)."""
    path = path or DEFAULT_CONFIG.expanduser()
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    return check_keymap(data.get("keymap", {}), str(path))


def check_keymap(keymap: object, where: str) -> dict[str, str]:
    """A `[keymap]` table checked: binding ids this TUI has, mapped to key strings; ValueError naming `where`."""
    if not isinstance(keymap, dict) or not all(isinstance(v, str) for v in keymap.values()):
        raise ValueError(f"{where}: [keymap] must map binding ids to key strings, e.g. \"app.pause\" = \"P\"")
    known = {b.id for group in (APP, CARDS, TREE, DETAIL, FAILURES, OVERVIEW, EXPORTS, COMPARE, LATENCY) for b in group}
    unknown = sorted(set(keymap) - known)
    if unknown:
        raise ValueError(f"{where}: unknown binding id(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return dict(keymap)
