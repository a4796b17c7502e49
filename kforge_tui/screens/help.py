"""`?`: every key of the screen underneath, with what it does (the footer has room for a few)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from kforge_tui.keymap import ESSENTIAL


def key_rows(screen: Screen) -> list[tuple[str, str, str]]:
    """(key, what it does, where) for each active binding of `screen`: the app's essentials, then the
    screen's own keys, the other app keys, then Textual's (focus, copy, the focused widget's cursor)."""
    app = screen.app
    groups: dict[int, list[tuple[str, str, str]]] = {0: [], 1: [], 2: [], 3: []}
    seen: set[tuple[str, str]] = set()
    for active in screen.active_bindings.values():
        b = active.binding
        what = b.tooltip or b.description or b.action
        if (b.action, what) in seen and b.id:
            continue
        seen.add((b.action, what))
        where = "anywhere" if active.node is app else ("this screen" if active.node is screen else "focused list")
        # Ours (they have ids) before Textual's own (focus, copy, cursor moves).
        rank = 0 if b.id in ESSENTIAL else 3 if not b.id else 1 if active.node is screen else 2
        groups[rank].append((app.get_key_display(b), what, where))
    return [row for rank in sorted(groups) for row in groups[rank]]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.rows = key_rows(under)
        self.title_text = f"Keys of the {type(under).__name__.removesuffix('Screen').lower()} screen"

    def compose(self) -> ComposeResult:
        # No header row (key, what, where speak for themselves): at 80×24 every key of a screen fits.
        table = Table("key", "what it does", "where", box=None, pad_edge=False, expand=True, show_header=False)
        for key, what, where in self.rows:
            table.add_row(Text(key, style="bold"), what, Text(where, style="dim"))
        scroll = VerticalScroll(id="help")
        scroll.border_title = f"{self.title_text} (esc or ? closes)"  # in the border: one more row of keys
        with scroll:
            yield Static(table)

    def action_close(self) -> None:
        self.dismiss(None)
