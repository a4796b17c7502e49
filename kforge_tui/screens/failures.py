"""Every failed candidate of the run, filtered by category; enter opens its detail."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header

from kforge_tui import keymap as keys
from kforge_tui.readmodel import NodeRow, Snapshot
from kforge_tui.widgets import LiveBar, LiveTable


class FailuresScreen(Screen):
    BINDINGS = keys.FAILURES

    def __init__(self) -> None:
        super().__init__()
        self.category: str | None = None
        self._ids: list[str] = []  # row keys in the order shown (newest first)
        self._pos: dict[str, int] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield LiveBar(id="categories", classes="bar")
        yield LiveTable(id="failures", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#failures", LiveTable).add_columns("candidate", "op", "category", "error")
        self.rebuild()

    def on_screen_resume(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        """New failures go on top and changed ones are redrawn in place; the table is never rebuilt."""
        nodes = self.app.model.nodes
        mine = {n.id: nodes.get(n.id, n) for n in snap.changed_nodes}
        if not any(n.status == "rejected" or n.id in self._pos for n in mine.values()):
            return
        self._bar()
        table = self.query_one("#failures", LiveTable)
        gone = [nid for nid, n in mine.items() if nid in self._pos and not self._wanted(n)]
        rows = {nid: self._cells(n) for nid, n in mine.items() if self._wanted(n)}
        if gone:
            table.remove_rows(gone)
        table.set_rows(rows)
        new = [nid for nid in rows if nid not in self._pos]
        if not (new or gone):
            return
        cur = self._ids[table.cursor_row] if self._ids and table.cursor_row < len(self._ids) else None
        kept = [nid for nid in self._ids if nid not in set(gone)]
        self._ids = sorted(kept + new, key=lambda nid: -nodes[nid].order)
        self._pos = {nid: i for i, nid in enumerate(self._ids)}
        table.reorder(self._ids)
        if cur in self._pos and table.cursor_row != self._pos[cur]:
            table.move_cursor(row=self._pos[cur], scroll=False)  # the cursor stays on its candidate

    def _wanted(self, n: NodeRow) -> bool:
        return n.status == "rejected" and (self.category is None or (n.category or "unknown") == self.category)

    def _cells(self, r: NodeRow) -> list:
        card = self.app.model.cards.get(r.card_id)
        return [r.id, card.op.removeprefix("aten::") if card else r.card_id,
                Text(r.category or "unknown", style="red"), r.error_head[:90]]

    def _bar(self) -> None:
        cats = self.app.model.failure_categories()
        bar = Text()
        total = sum(cats.values())
        for name, n in [("all", total), *cats.items()]:
            active = (self.category or "all") == name
            bar.append(f" {name} {n} ", style="reverse bold" if active else "")
        self.query_one("#categories", LiveBar).show(bar)

    def rebuild(self) -> None:
        """Fill the table from scratch: on mount, and when the user picks a category."""
        self._bar()
        table = self.query_one("#failures", LiveTable)
        rows = self.app.model.failures(self.category)
        ids = [r.id for r in rows]
        if ids == self._ids:
            return
        cur = table.cursor_row
        table.clear()
        for r in rows:
            table.add_row(*self._cells(r), key=r.id)
        self._ids = ids
        self._pos = {nid: i for i, nid in enumerate(ids)}
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
        table = self.query_one("#failures", LiveTable)
        if self._ids and table.cursor_row is not None and table.cursor_row < len(self._ids):
            self.app.open_candidate(self._ids[table.cursor_row])
