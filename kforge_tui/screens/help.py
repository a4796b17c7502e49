"""`?`: every key of the screen underneath, with what it does (the footer has room for a few)."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from kforge_tui.keymap import ESSENTIAL
from kforge_tui.widgets import literal

# Textual's own keys (bindings without an id: the focused list's cursor, focus, copy) are shown one row per
# kind, their keys in one cell: twenty cursor and page keys one a row pushed the screen's own keys out of
# the help at 80x24.
_TEXTUAL_GROUPS = (
    ("move the cursor or scroll", ("up", "down", "left", "right", "home", "end", "pageup", "pagedown")),
    ("open / select", ("enter",)),
    ("expand / collapse", ("space",)),
    ("focus next / previous", ("tab",)),
    ("copy the selected text", ("c",)),
)
_NAMES = {"\u2191": "up", "\u2193": "down", "\u2190": "left", "\u2192": "right", "pgup": "pageup",
          "pgdn": "pagedown", "\u23ce": "enter"}
_ARROWS = ("\u2191", "\u2193", "\u2190", "\u2192")
_MOVING = "keys of the focused list"


def _group(key: str) -> int | None:
    base = key.replace("^", "ctrl+").rsplit("+", 1)[-1]
    base = _NAMES.get(base, base)
    return next((i for i, (_, keys) in enumerate(_TEXTUAL_GROUPS) if base in keys), None)


def _modified(key: str) -> bool:
    return key.startswith("^") or "+" in key


def key_rows(screen: Screen) -> list[tuple[str, str, str]]:
    """(key, what it does, where) for each active binding of `screen`: the app's essentials, then the
    screen's own keys, the other app keys, then Textual's (cursor, focus, copy), one row per kind with
    'focused list' as where."""
    app = screen.app
    groups: dict[int, list[tuple[str, str, str]]] = {0: [], 1: [], 2: [], 3: []}
    textual: dict[int, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for active in screen.active_bindings.values():
        b = active.binding
        # Textual's own (no id) by their short name: its tooltips run to a sentence ("Quit the app and ...").
        what = (b.tooltip or b.description if b.id else b.description or b.tooltip) or b.action
        if (b.action, what) in seen and b.id:
            continue
        seen.add((b.action, what))
        where = "anywhere" if active.node is app else ("this screen" if active.node is screen else "focused list")
        key = app.get_key_display(b)
        g = None if b.id else _group(key)
        if g is not None:
            if key not in textual.setdefault(g, []):
                textual[g].append(key)
            continue
        # Ours (they have ids) before Textual's own.
        rank = 0 if b.id in ESSENTIAL else 3 if not b.id else 1 if active.node is screen else 2
        groups[rank].append((key, what, where))
    for g in sorted(textual):
        keys = textual[g]
        plain = [k for k in keys if not _modified(k)]
        arrows = "".join(k for k in plain if k in _ARROWS)
        shown = " ".join(([arrows] if arrows else []) + [k for k in plain if k not in _ARROWS])
        what = _TEXTUAL_GROUPS[g][0]
        if len(plain) < len(keys):
            what += " (" + ", ".join(sorted({k.split("+")[0] if "+" in k else "^" for k in keys
                                            if _modified(k)})) + ": further)" if g == 0 else ""
        groups[3].append((shown or " ".join(keys), what, "focused list"))
    return [row for rank in sorted(groups) for row in groups[rank]]


def _height(renderable: RenderableType, width: int) -> int:
    console = Console(width=width, no_color=True, legacy_windows=False)
    return len(console.render_lines(renderable, console.options.update_width(width), pad=False))


def _column(items: list[tuple[str, str] | str]) -> Group:
    """Headings (str) and the keys under each (key, what) as one column; the focused list's key groups
    ('↑↓ home end ...') each as one line that wraps, not as a key column that would squeeze the rest."""
    parts: list[RenderableType] = []
    table: Table | None = None
    moving = False
    for item in items:
        if isinstance(item, str):
            parts.append(Text(item, style="dim italic"))
            table, moving = None, item == _MOVING
            continue
        if moving:
            parts.append(Text.assemble((item[0], "bold"), "  ", item[1]))
            continue
        if table is None:
            table = Table.grid(padding=(0, 1))
            table.add_column(no_wrap=True, style="bold")
            table.add_column()
            parts.append(table)
        table.add_row(*map(literal, item))
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.rows = key_rows(under)
        self.title_text = f"Keys of the {type(under).__name__.removesuffix('Screen').lower()} screen"

    def compose(self) -> ComposeResult:
        scroll = VerticalScroll(id="help")
        scroll.border_title = f"{self.title_text} (esc or ? closes)"  # in the border: one more row of keys
        with scroll:
            # Inside the box (app.tcss: 78 wide with its border and padding, the footer below it).
            yield Static(self.key_table(min(74, self.app.size.width - 6), self.app.size.height - 3))

    def key_table(self, width: int, room: int) -> RenderableType:
        """One row per key (key, what it does, where) where that fits `room` rows of `width` cells; else
        two columns of keys under headings saying where each works (every key seen at 80x24, no scrolling)."""
        table = Table("key", "what it does", "where", box=None, pad_edge=False, expand=True, show_header=False)
        for key, what, where in self.rows:
            table.add_row(Text(key, style="bold"), what, Text(where, style="dim"))
        if _height(table, width) <= room:
            return table
        items: list[tuple[str, str] | str] = []
        for where in ("this screen", "anywhere", "focused list"):  # each section once
            rows = [(key, what) for key, what, w in self.rows if w == where]
            if rows:
                items += [_MOVING if where == "focused list" else where, *rows]
        best: tuple[int, RenderableType] | None = None
        for cut in range(1, len(items)):
            if isinstance(items[cut - 1], str):
                continue  # a heading does not end a column
            right = items[cut:]
            if not isinstance(right[0], str):  # the right column goes on under the heading it is in
                right = [next(x for x in reversed(items[:cut]) if isinstance(x, str)), *right]
            grid = Table.grid(expand=True, padding=(0, 2))
            grid.add_column(ratio=1)
            grid.add_column(ratio=1)
            grid.add_row(_column(items[:cut]), _column(right))
            h = _height(grid, width)
            if best is None or h < best[0]:
                best = (h, grid)
        return best[1] if best is not None else table

    def action_close(self) -> None:
        self.dismiss(None)
