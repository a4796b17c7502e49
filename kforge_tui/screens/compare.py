"""Runs (or providers) side by side: best speedup per card, failure rates, tokens, cost, time."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Header, Static

from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.widgets import KeyFooter, KforgeScreen, LiveTable

DEFAULT_RUNS = 3


class CompareScreen(KforgeScreen):
    BINDINGS = keys.COMPARE

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="compare-bar", classes="bar")
        yield LiveTable(id="compare", cursor_type="row", zebra_stripes=True)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.show_all = False
        self.rebuild()

    def on_screen_resume(self) -> None:
        self.rebuild()

    def run_ids(self) -> list[str]:
        if self.app.compare_runs and not self.show_all:
            return list(self.app.compare_runs)
        runs = [r.id for r in self.app.model.runs()]
        return runs if self.show_all else runs[:DEFAULT_RUNS]

    def action_all_runs(self) -> None:
        self.show_all = not self.show_all
        self.rebuild()

    def rebuild(self) -> None:
        data = self.app.model.compare(self.run_ids())
        table = self.query_one("#compare", DataTable)
        table.clear(columns=True)
        table.add_column("run", key="what", width=26)
        if not data:
            self.query_one("#compare-bar", Static).update("no runs to compare")
            return
        self.query_one("#compare-bar", Static).update(
            f"{len(data)} runs side by side · give RUN ids to `kforge-tui compare` to pick others")
        rows: list[tuple[Text, list]] = []

        def row(label: str, cells: list, style: str = "") -> None:
            rows.append((Text(label, style=style or "bold"), cells))

        row("provider", [d["run"].provider for d in data])
        # As `compare --plain` says it: a dry run compiles and stops, and without the mark reads as a run that
        # verified nothing.
        row("status", [d["run"].status + (", dry run" if d["run"].config.get("dry_run") else "") for d in data])
        row("wall time", [fmt.duration(d["wall_s"]) for d in data])
        row("tokens", [f"{fmt.tokens(d['run'].tokens_in)} in / {fmt.tokens(d['run'].tokens_out)} out" for d in data])
        row("cost", [f"${d['run'].cost_usd:.2f}" for d in data])
        totals = [sum(d["counts"].values()) for d in data]
        row("candidates", [str(t) for t in totals])
        row("verified", [_rate(d["counts"].get("verified", 0), t) for d, t in zip(data, totals)])
        cats = sorted({c for d in data for c in d["categories"]})
        for c in cats:
            row(f"  failed: {c}", [_rate(d["categories"].get(c, 0), t) for d, t in zip(data, totals)], "red")
        cards: dict[str, str] = {}
        known = self.app.model.cards  # this run's capture: a chain card by its ops, not `kforge::chain`
        for d in data:
            for cid, (_, op) in d["best"].items():
                cards.setdefault(cid, known[cid].label if cid in known else (op or cid).removeprefix("aten::"))
        for cid, op in sorted(cards.items(), key=lambda kv: kv[1]):
            cells = []
            best = max((d["best"].get(cid, (None,))[0] or 0 for d in data), default=0)
            for d in data:
                s = d["best"].get(cid, (None,))[0]
                cells.append(Text(fmt.speedup(s), style="bold green" if s and s == best else ""))
            row(f"best {op} ·{cid[-4:]}", cells, "")
        # Each run's column as wide as its widest cell: left to auto width after clear(columns=True), a column
        # kept its run id's width until the terminal was resized ("207.1k in /" for "207.1k in / 53.1k out").
        for i, d in enumerate(data):
            width = max([cell_len(d["run"].id), *(cell_len(str(cells[i])) for _, cells in rows)])
            table.add_column(d["run"].id, key=d["run"].id, width=width)
        for label, cells in rows:
            table.add_row(label, *cells)


def _rate(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.0f}%)" if total else "–"
