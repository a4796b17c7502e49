"""Operator cards: a sortable, filterable table; enter opens the card's search tree."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Header, Input

from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.readmodel import CardRow, Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen, LiveBar, LiveTable

# (header, key for sorting, cell text): what a reader scans for first on the left, so 80 columns show
# it; the wide signature last (the candidate screen shows it in full).
COLUMNS = [
    ("op", lambda c: c.label, lambda c: _cut(c.label, OP_CHARS)),
    ("speedup", lambda c: c.speedup or 0, lambda c: _speedup_cell(c)),
    ("status", lambda c: c.status, lambda c: c.status),
    ("best µs", lambda c: c.best_us or 1e18, lambda c: fmt.us(c.best_us)),
    # A channels-last twin's calls are its original's: its share is said once, there
    ("share", lambda c: c.share, lambda c: "twin" if c.twin_of else fmt.share(c.share)),
    ("eager µs", lambda c: c.eager_us or 0, lambda c: fmt.us(c.eager_us)),
    ("compile µs", lambda c: c.compile_us or 0, lambda c: fmt.us(c.compile_us)),
    ("calls", lambda c: c.calls, lambda c: fmt.calls(c.calls)),
    ("roof", lambda c: c.roofline_pct or 0, lambda c: fmt.pct(c.roofline_pct)),
    # The best kernel's time (eager's until one is verified) over the lane's copy of the card's bytes.
    ("÷copy", lambda c: c.copy_pct or 0, lambda c: fmt.pct(c.copy_pct)),
    ("cands", lambda c: c.candidates, lambda c: str(c.candidates)),
    ("fails", lambda c: c.failures, lambda c: Text(str(c.failures), style="red" if c.failures else "")),
    ("signature", lambda c: c.detail, lambda c: c.detail[:48]),
]
# `s` cycles the sort through the columns in this order (unchanged when the display order changed).
SORTS = [next(col for col in COLUMNS if col[0] == name) for name in (
    "op", "signature", "calls", "share", "eager µs", "best µs", "speedup", "roof", "status", "cands", "fails",
    "compile µs", "÷copy")]  # columns added later go last: `s` keeps taking a user to the same places
DEFAULT_SORT = 3  # share: where the time goes
OP_CHARS = 44  # a chain card's member list is cut here in the table; its card view shows it whole


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _speedup_cell(c: CardRow) -> Text:
    if c.speedup is None:
        return Text(fmt.DASH)
    return Text(fmt.speedup(c.speedup), style="bold green" if c.speedup > 1 else "yellow")


class CardsScreen(KforgeScreen):
    BINDINGS = keys.CARDS

    def __init__(self) -> None:
        super().__init__()
        self.sort_col = DEFAULT_SORT
        self.reverse = True
        self.filter_text = ""
        self._shown: list[str] = []
        self._sort_keys: dict[str, object] = {}  # the sort key each shown card had when last ordered

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter: op, signature or status (enter to apply, esc to clear)", id="filter")
        yield LiveBar(id="cards-bar", classes="bar")
        yield LiveTable(id="cards", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

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

    def matches(self, c: CardRow) -> bool:
        needle = self.filter_text.lower()
        return not needle or needle in f"{c.label} {c.detail} {c.op} {c.signature} {c.status} {c.card_id}".lower()

    def visible_cards(self) -> list[CardRow]:
        rows = [c for c in self.app.model.cards.values() if self.matches(c)]
        key = SORTS[self.sort_col][1]
        return sorted(rows, key=key, reverse=self.reverse)

    def rebuild(self) -> None:
        """Fill the table from scratch: on mount, and when the user sorts or filters."""
        table = self.query_one("#cards", LiveTable)
        cur = self.current_card_id()
        rows = self.visible_cards()
        table.clear()
        for c in rows:
            table.add_row(*(cell(c) for _, _, cell in COLUMNS), key=c.card_id)
        self._shown = [c.card_id for c in rows]
        key = SORTS[self.sort_col][1]
        self._sort_keys = {c.card_id: key(c) for c in rows}
        if cur in self._shown:
            table.move_cursor(row=self._shown.index(cur))
        self._bar()

    def _bar(self) -> None:
        name = SORTS[self.sort_col][0]
        total = len(self.app.model.cards)
        shown = f"{len(self._shown)} of {total} cards" if self.filter_text else f"{total} cards"
        filt = f" · filter '{self.filter_text}'" if self.filter_text else ""
        # shares summed to 120 % on an unseen model's cards with nothing said: a chain card's calls are also its
        # ops' own cards' calls
        overlap = " · a chain card's share is also in its ops' cards" \
            if any(c.chain is not None for c in self.app.model.cards.values()) else ""
        self.query_one("#cards-bar", LiveBar).show(
            f"{shown} · sorted by {name} {'↓' if self.reverse else '↑'}{filt}{overlap}")

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Only changed cells are redrawn; rows move only when their sort key changed."""
        if not snap.changed_cards:
            return
        table = self.query_one("#cards", LiveTable)
        cur = self.current_card_id()
        key = SORTS[self.sort_col][1]
        shown = set(self._shown)
        updates, gone, reorder = {}, [], False
        for c in snap.changed_cards:
            if not self.matches(c):
                if c.card_id in shown:
                    gone.append(c.card_id)
                continue
            updates[c.card_id] = [cell(c) for _, _, cell in COLUMNS]
            k = key(c)
            if c.card_id not in shown or self._sort_keys.get(c.card_id) != k:
                self._sort_keys[c.card_id] = k
                reorder = True
        if gone:
            table.remove_rows(gone)
            for cid in gone:
                self._sort_keys.pop(cid, None)
            self._shown = [cid for cid in self._shown if cid not in set(gone)]
        table.set_rows(updates)
        self._shown += [cid for cid in updates if cid not in shown]  # new rows were appended
        if reorder:
            cards = self.app.model.cards
            # A stable sort of the current order: equal keys never shuffle on a tick.
            order = sorted(self._shown, key=lambda cid: key(cards[cid]), reverse=self.reverse)
            if order != self._shown:
                table.reorder(order)
                self._shown = order
                if cur in self._sort_keys and table.cursor_row != order.index(cur):
                    table.move_cursor(row=order.index(cur))
        if reorder or gone:
            self._bar()

    def current_card_id(self) -> str | None:
        table = self.query_one("#cards", LiveTable)
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
        self.sort_col = (self.sort_col + 1) % len(SORTS)
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
