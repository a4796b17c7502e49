"""The run as charts: candidates verified and failed over time, the estimated whole-model speedup as
it grows, and failures by category."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Header, Static

from kforge_tui import format as fmt
from kforge_tui.charts import FAILURES_TITLE, Chart, draw_failures, draw_gain, draw_progress, run_series
from kforge_tui.readmodel import Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen

PROGRESS_TITLE = "candidates over time"
GAIN_TITLE = "estimated whole-model speedup"


class RunChartsScreen(KforgeScreen):
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="charts-bar", classes="bar")
        with Grid(id="run-charts"):
            yield Chart(PROGRESS_TITLE, id="chart-progress")
            yield Chart(GAIN_TITLE, id="chart-gain")
            yield Chart(FAILURES_TITLE, id="chart-failures")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.rebuild()

    def on_screen_resume(self) -> None:
        self.rebuild()

    def apply_snapshot(self, snap: Snapshot) -> None:
        if snap.changed_nodes or snap.changed_cards:
            self.rebuild()

    def rebuild(self) -> None:
        model = self.app.model
        run = self.app.snapshot.run if self.app.snapshot else None
        s = run_series(model.all_nodes(), model.cards.values(), run.created_at if run else 0.0)
        fails = model.failure_categories()
        # A dry run's candidates compile and stop: "87 verified" and an estimated 1.00x read as a measured run
        dry = bool(run and run.config.get("dry_run"))
        self.query_one("#chart-progress", Chart).set_draw(draw_progress(s, "compiled" if dry else "verified"))
        self.query_one("#chart-gain", Chart).set_draw(draw_gain(s, dry))
        self.query_one("#chart-failures", Chart).set_draw(draw_failures(fails))
        gain = fmt.speedup(s.model_speedup[-1]) if s.model_speedup else fmt.DASH
        ok = s.verified[-1] if s.verified else 0
        bad = s.failed[-1] if s.failed else 0
        self.query_one("#charts-bar", Static).update(
            f"dry run: {ok} compiled · {bad} failed · nothing timed" if dry else
            f"{ok} verified · {bad} failed · est. whole-model speedup {gain} "
            "(Amdahl over card shares, eager elsewhere)")
