"""A card's latency over iterations: every verified candidate and the best so far, as sparklines."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer, Header, Sparkline, Static

from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.readmodel import Snapshot
from kforge_tui.widgets import KforgeScreen


class LatencyScreen(KforgeScreen):
    BINDINGS = keys.LATENCY

    def __init__(self, card_id: str) -> None:
        super().__init__()
        self.card_id = card_id

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="lat-title", classes="bar")
        yield Static("µs of each verified candidate, in proposal order (lower is faster)", classes="muted")
        yield Sparkline([], id="each")
        yield Static("best µs so far", classes="muted")
        yield Sparkline([], id="best-so-far")
        yield Static(id="lat-summary")
        yield Footer()

    def on_mount(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        if any(n.card_id == self.card_id for n in snap.changed_nodes):
            self.rebuild()

    def series(self) -> tuple[list[float], list[float]]:
        each = [n.best_us for n in self.app.model.nodes_of(self.card_id) if n.status == "verified" and n.best_us]
        best, cur = [], float("inf")
        for v in each:
            cur = min(cur, v)
            best.append(cur)
        return each, best

    def rebuild(self) -> None:
        card = self.app.model.cards.get(self.card_id)
        each, best = self.series()
        title = f"{card.op} {card.signature[:50]}" if card else self.card_id
        self.query_one("#lat-title", Static).update(f"latency · {title}")
        self.query_one("#each", Sparkline).data = each
        self.query_one("#best-so-far", Sparkline).data = best
        if not each:
            self.query_one("#lat-summary", Static).update("no verified candidate yet")
            return
        eager = card.eager_us if card else None
        first, last = best[0], best[-1]
        self.query_one("#lat-summary", Static).update(
            f"{len(each)} verified · first {fmt.us(first)} µs → best {fmt.us(last)} µs"
            f" · eager {fmt.us(eager)} µs · worst {fmt.us(max(each))} µs")

    def action_back(self) -> None:
        self.app.pop_screen()
