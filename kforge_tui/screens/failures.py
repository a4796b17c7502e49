"""Every failed candidate of the run, filtered by category; enter opens its detail."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Header

from engine.outcomes import describe_failure
from engine.store.read import CandidateHead
from kforge_tui import keymap as keys
from kforge_tui.readmodel import Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen, LiveBar, LiveTable


class FailuresScreen(KforgeScreen):
    BINDINGS = keys.FAILURES

    def __init__(self) -> None:
        super().__init__()
        self.category: str | None = None
        self._ids: list[str] = []  # row keys in the order shown (oldest first: rows never move)
        self._pos: dict[str, int] = {}
        self._pending: dict[str, CandidateHead] = {}  # new failures held while the end of the list is out of view

    def compose(self) -> ComposeResult:
        yield Header()
        yield LiveBar(id="categories", classes="bar")
        yield LiveTable(id="failures", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#failures", LiveTable).add_columns("candidate", "op", "category", "error")
        self.rebuild()

    def on_screen_resume(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Oldest first, so a tick never moves a row. Changed rows are redrawn in place; new failures are
        appended when the end of the list is in view, else held (the bar says how many) until the cursor
        reaches the end — appending below the view would repaint the whole table for nothing."""
        nodes = self.app.model.nodes
        mine = {n.id: nodes.get(n.id, n) for n in snap.changed_nodes}
        if not any(n.status == "rejected" or n.id in self._pos or n.id in self._pending
                   for n in mine.values()):
            return
        table = self.query_one("#failures", LiveTable)
        gone = [nid for nid, n in mine.items() if nid in self._pos and not self._wanted(n)]
        for nid, n in mine.items():
            if nid in self._pending and not self._wanted(n):
                del self._pending[nid]
        wanted = sorted((n for n in mine.values() if self._wanted(n)), key=lambda n: n.order)
        if gone:
            table.remove_rows(gone)
            drop = set(gone)
            self._ids = [nid for nid in self._ids if nid not in drop]
            self._pos = {nid: i for i, nid in enumerate(self._ids)}
        table.set_rows({n.id: self._cells(n) for n in wanted if n.id in self._pos})
        for n in wanted:
            if n.id not in self._pos:
                self._pending[n.id] = n
        if self._pending and self._end_in_view(table):
            self._flush(table)
        self._bar()

    def _end_in_view(self, table: LiveTable) -> bool:
        rows_shown = max(1, table.size.height - 1)
        return table.row_count <= rows_shown or table.cursor_row >= table.row_count - 2 or \
            table.scroll_offset.y + rows_shown >= table.row_count

    def _flush(self, table: LiveTable) -> None:
        # A cursor on the last row follows the list, like `tail -f`: it moves to the newest failure.
        follow = table.row_count > 0 and table.cursor_row >= table.row_count - 1
        new = sorted(self._pending.values(), key=lambda n: n.order)
        self._pending.clear()
        table.set_rows({n.id: self._cells(n) for n in new})  # new keys are appended in this order
        self._ids += [n.id for n in new]
        self._pos = {nid: i for i, nid in enumerate(self._ids)}
        if follow and new:
            table.move_cursor(row=table.row_count - 1)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self._pending:
            table = self.query_one("#failures", LiveTable)
            if self._end_in_view(table):
                self._flush(table)
                self._bar()

    def _wanted(self, n: CandidateHead) -> bool:
        return n.status == "rejected" and (self.category is None or (n.category or "unknown") == self.category)

    def _cells(self, r: CandidateHead) -> list:
        card = self.app.model.cards.get(r.card_id)
        return [r.id, card.label if card else r.card_id,
                Text(r.category or "unknown", style="red"), r.error_head[:90]]

    def _bar(self) -> None:
        cats = self.app.model.failure_categories()
        bar = Text()
        if self._pending:  # first, so it shows at 80 columns
            bar.append(f" +{len(self._pending)} new at the end (ctrl+end) ", style="bold reverse")
        total = sum(cats.values())
        for name, n in [("all", total), *cats.items()]:
            active = (self.category or "all") == name
            bar.append(f" {name} {n} ", style="reverse bold" if active else "")
        bar.append("  oldest first", style="dim")
        if self.category is not None:
            bar.append(f"  {self.category}: {describe_failure(self.category)}", style="dim")
        self.query_one("#categories", LiveBar).show(bar)

    def rebuild(self) -> None:
        """Fill the table from scratch: on mount, and when the user picks a category."""
        self._pending.clear()
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
