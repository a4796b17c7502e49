"""Every failed candidate of the run, filtered by category; enter opens its detail."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from kforge_tui import keymap as keys
from kforge_tui.readmodel import Snapshot


class FailuresScreen(Screen):
    BINDINGS = keys.FAILURES

    def __init__(self) -> None:
        super().__init__()
        self.category: str | None = None
        self._ids: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="categories", classes="bar")
        yield DataTable(id="failures", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#failures", DataTable).add_columns("candidate", "op", "category", "error")
        self.rebuild()

    def on_screen_resume(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        if any(n.status == "rejected" for n in snap.changed_nodes):
            self.rebuild()

    def rebuild(self) -> None:
        model = self.app.model
        cats = model.failure_categories()
        bar = Text()
        total = sum(cats.values())
        for name, n in [("all", total), *cats.items()]:
            active = (self.category or "all") == name
            bar.append(f" {name} {n} ", style="reverse bold" if active else "")
        self.query_one("#categories", Static).update(bar)
        table = self.query_one("#failures", DataTable)
        rows = model.failures(self.category)
        ids = [r.id for r in rows]
        if ids == self._ids:
            return
        cur = table.cursor_row
        table.clear()
        for r in rows:
            card = model.cards.get(r.card_id)
            table.add_row(r.id, card.op.removeprefix("aten::") if card else r.card_id,
                          Text(r.category or "unknown", style="red"), r.error_head[:90], key=r.id)
        self._ids = ids
        if ids and cur is not None:
            table.move_cursor(row=min(cur, len(ids) - 1))

    def categories(self) -> list[str | None]:
        return [None, *self.app.model.failure_categories()]

    def action_category(self, step: int) -> None:
        cats = self.categories()
        if step == 0:
            self.category = None
        else:
            i = cats.index(self.category) if self.category in cats else 0
            self.category = cats[(i + step) % len(cats)]
        self._ids = []
        self.rebuild()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open_detail()

    def action_open_detail(self) -> None:
        table = self.query_one("#failures", DataTable)
        if self._ids and table.cursor_row is not None and table.cursor_row < len(self._ids):
            self.app.open_candidate(self._ids[table.cursor_row])
