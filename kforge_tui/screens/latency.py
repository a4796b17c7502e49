"""A card's search as charts: best µs and best speedup over evaluations, against the eager line and,
where the card has one, the torch.compile line."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Header, Static

from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.charts import Chart, card_series, draw_card_speedup, draw_card_us
from kforge_tui.readmodel import CardRow, Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen, literal

US_TITLE = "best µs so far (lower is faster)"
SPEEDUP_TITLE = "best speedup over eager"


class LatencyScreen(KforgeScreen):
    BINDINGS = keys.LATENCY

    def __init__(self, card_id: str) -> None:
        super().__init__()
        self.card_id = card_id

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="lat-title", classes="bar")
        with Horizontal(id="lat-charts"):
            yield Chart(US_TITLE, id="chart-us")
            yield Chart(SPEEDUP_TITLE, id="chart-speedup")
        yield Static(id="lat-summary", classes="bar")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        if any(n.card_id == self.card_id for n in snap.changed_nodes):
            self.rebuild()

    def rebuild(self) -> None:
        card = self.app.model.cards.get(self.card_id)
        s = card_series(self.app.model.nodes_of(self.card_id))
        title = (card.label if card.chain is not None else f"{card.op} {card.signature[:50]}") if card else self.card_id
        self.query_one("#lat-title", Static).update(literal(f"latency · {title}"))
        eager = card.eager_us if card else None
        compiled = card.compile_us if card else None
        self.query_one("#chart-us", Chart).set_draw(draw_card_us(s, eager, compiled))
        self.query_one("#chart-speedup", Chart).set_draw(
            draw_card_speedup(s, eager / compiled if eager and compiled else None))
        refs = references(card, self.app.model.compile_context(self.card_id) if card else ())
        if not s.evaluation:
            self.query_one("#lat-summary", Static).update(
                f"no verified candidate{fmt.still(card)} ({s.finished} finished) · eager {fmt.us(eager)} µs{refs}")
            return
        self.query_one("#lat-summary", Static).update(
            f"{len(s.evaluation)} verified of {s.finished} · first {fmt.us(s.best_us[0])} µs → best "
            f"{fmt.us(s.best_us[-1])} µs {fmt.speedup(s.speedup[-1])} · eager {fmt.us(eager)} µs{refs}")

    def action_back(self) -> None:
        self.app.pop_screen()


def references(card: CardRow | None, context: Sequence[dict] = ()) -> str:
    """` · torch.compile 9.80 µs · copy 4.10 µs (best 120% of it)`: a card's references, where measured; with
    `context` (engine.cards.compile_in_context), also the chain torch.compile fuses the op into."""
    if card is None:
        return ""
    out = ""
    if card.compile_us:
        out += f" · torch.compile {fmt.us(card.compile_us)} µs alone"
    elif card.compile_note:
        out += f" · {card.compile_note}"
    if context:
        c = context[0]
        out += (f" · in context fused into chain {' → '.join(c['ops'][:4])}{' …' if len(c['ops']) > 4 else ''}"
                f" ({fmt.pct(100 * c['held'])} of its calls): torch.compile {fmt.us(c['compile_us'])} µs for the chain")
    if card.copy_us:
        who = "best" if card.best_us else "eager"
        out += f" · copy {fmt.us(card.copy_us)} µs ({who} {fmt.pct(card.copy_pct)} of it)"
    return out
