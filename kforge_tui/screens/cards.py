"""Operator cards: a sortable, filterable table; enter opens the card's search tree."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.readmodel import CardRow, Snapshot

# (header, key for sorting, cell text)
COLUMNS = [
    ("op", lambda c: c.op, lambda c: c.op.removeprefix("aten::")),
    ("signature", lambda c: c.signature, lambda c: c.signature[:34]),
    ("calls", lambda c: c.calls, lambda c: fmt.calls(c.calls)),
    ("share", lambda c: c.share, lambda c: fmt.share(c.share)),
    ("eager µs", lambda c: c.eager_us or 0, lambda c: fmt.us(c.eager_us)),
    ("best µs", lambda c: c.best_us or 1e18, lambda c: fmt.us(c.best_us)),
    ("speedup", lambda c: c.speedup or 0, lambda c: _speedup_cell(c)),
    ("roof", lambda c: c.roofline_pct or 0, lambda c: fmt.pct(c.roofline_pct)),
    ("status", lambda c: c.status, lambda c: c.status),
    ("cands", lambda c: c.candidates, lambda c: str(c.candidates)),
    ("fails", lambda c: c.failures, lambda c: Text(str(c.failures), style="red" if c.failures else "")),
]
DEFAULT_SORT = 3  # share: where the time goes


def _speedup_cell(c: CardRow) -> Text:
    if c.speedup is None:
        return Text(fmt.DASH)
    return Text(fmt.speedup(c.speedup), style="bold green" if c.speedup > 1 else "yellow")


class CardsScreen(Screen):
    BINDINGS = keys.CARDS

    def __init__(self) -> None:
        super().__init__()
        self.sort_col = DEFAULT_SORT
        self.reverse = True
        self.filter_text = ""
        self._shown: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter: op, signature or status (enter to apply, esc to clear)", id="filter")
        yield Static(id="cards-bar", classes="bar")
        yield DataTable(id="cards", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#cards", DataTable)
        for i, (name, _, _) in enumerate(COLUMNS):
            table.add_column(name, key=str(i))
        self.rebuild()
        table.focus()

    def on_screen_resume(self) -> None:
        self.rebuild()
        if not self.query_one("#filter", Input).has_class("visible"):
            self.query_one("#cards", DataTable).focus()

    def visible_cards(self) -> list[CardRow]:
        needle = self.filter_text.lower()
        rows = [c for c in self.app.model.cards.values()
                if not needle or needle in f"{c.op} {c.signature} {c.status} {c.card_id}".lower()]
        key = COLUMNS[self.sort_col][1]
        return sorted(rows, key=key, reverse=self.reverse)

    def rebuild(self) -> None:
        table = self.query_one("#cards", DataTable)
        cur = self.current_card_id()
        rows = self.visible_cards()
        table.clear()
        for c in rows:
            table.add_row(*(cell(c) for _, _, cell in COLUMNS), key=c.card_id)
        self._shown = [c.card_id for c in rows]
        if cur in self._shown:
            table.move_cursor(row=self._shown.index(cur))
        self._bar()

    def _bar(self) -> None:
        name = COLUMNS[self.sort_col][0]
        total = len(self.app.model.cards)
        shown = f"{len(self._shown)} of {total} cards" if self.filter_text else f"{total} cards"
        filt = f" · filter '{self.filter_text}'" if self.filter_text else ""
        self.query_one("#cards-bar", Static).update(
            f"{shown} · sorted by {name} {'↓' if self.reverse else '↑'}{filt}")

    def apply_snapshot(self, snap: Snapshot) -> None:
        if not snap.changed_cards:
            return
        table = self.query_one("#cards", DataTable)
        visible = {c.card_id for c in self.visible_cards()}
        if visible != set(self._shown):
            self.rebuild()
            return
        # Only the changed cells are redrawn; the order is kept until the user sorts again.
        for c in snap.changed_cards:
            if c.card_id not in visible:
                continue
            for i, (_, _, cell) in enumerate(COLUMNS):
                table.update_cell(c.card_id, str(i), cell(c))

    def current_card_id(self) -> str | None:
        table = self.query_one("#cards", DataTable)
        if not self._shown or table.cursor_row is None or table.cursor_row >= len(self._shown):
            return None
        return self._shown[table.cursor_row]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open_tree()

    def action_open_tree(self) -> None:
        card = self.current_card_id()
        if card:
            self.app.open_tree(card)

    def action_latency(self) -> None:
        card = self.current_card_id()
        if card:
            self.app.open_latency(card)

    def action_prioritize(self) -> None:
        card = self.current_card_id()
        if card:
            self.app.action_control("prioritize", card)

    def action_sort_next(self) -> None:
        self.sort_col = (self.sort_col + 1) % len(COLUMNS)
        self.rebuild()

    def action_sort_reverse(self) -> None:
        self.reverse = not self.reverse
        self.rebuild()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("visible")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("visible")
        self.filter_text = ""
        self.rebuild()
        self.query_one("#cards", DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.rebuild()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one("#cards", DataTable).focus()
        if not event.value.strip():
            event.input.remove_class("visible")
