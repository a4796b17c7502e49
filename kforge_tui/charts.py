"""Charts: the series the screens plot (pure functions over the read model's rows) and one plot widget
over textual-plotext that draws a titled, labelled chart and never crashes on a tiny pane."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from engine.cards import SharedCard, model_speedup
from engine.outcomes import FINISHED
from engine.store.read import CandidateHead

# Below this a plot is unreadable (and plotext can fail to lay out its axes): say so instead.
MIN_W, MIN_H = 24, 7
FAILURES_TITLE = "failures by category"


@dataclass(frozen=True)
class CardSeries:
    """One card's search, one point per verified candidate, in evaluation order."""

    evaluation: list[int]    # the candidate's number among the card's finished ones (1-based)
    each_us: list[float]     # its best µs
    best_us: list[float]     # best µs so far
    speedup: list[float]     # best speedup over eager so far
    finished: int            # finished candidates (verified, failed, compiled)


def card_series(nodes: Iterable[CandidateHead]) -> CardSeries:
    """Best µs and speedup so far over a card's finished candidates (proposal order)."""
    evaluation: list[int] = []
    each: list[float] = []
    best: list[float] = []
    speed: list[float] = []
    n = 0
    cur_us, cur_sp = float("inf"), 0.0
    for node in sorted(nodes, key=lambda r: r.order):
        if node.status not in FINISHED:
            continue
        n += 1
        if node.status != "verified" or not node.best_us:
            continue
        cur_us = min(cur_us, node.best_us)
        cur_sp = max(cur_sp, node.speedup or 0.0)
        evaluation.append(n)
        each.append(node.best_us)
        best.append(cur_us)
        speed.append(cur_sp)
    return CardSeries(evaluation, each, best, speed, n)


@dataclass(frozen=True)
class RunSeries:
    """The run over time: minutes since it started, at each finished candidate."""

    minutes: list[float]
    verified: list[int]        # verified so far (and dry-run compiled: they did not fail)
    failed: list[int]          # rejected so far
    model_speedup: list[float] # estimated whole-model speedup so far


def run_series(nodes: Iterable[CandidateHead], cards: Iterable[SharedCard], started_at: float) -> RunSeries:
    """Cumulative verified / failed candidates and the estimated whole-model speedup, by finish time.

    The estimate is Amdahl's law over the cards' shares of the captured model's time (`model_speedup`:
    a call inside a chain card counts once, at the better of the chain's speedup and its own card's): each
    card runs at its best verified speedup so far (never below 1×: a slower kernel is not kept), the rest
    as eager."""
    cards = list(cards)
    minutes: list[float] = []
    ok: list[int] = []
    bad: list[int] = []
    gain: list[float] = []
    best: dict[str, float] = {}
    now = 1.0
    n_ok = n_bad = 0
    for node in sorted((n for n in nodes if n.status in FINISHED), key=lambda r: (r.updated_at, r.order)):
        if node.status == "rejected":
            n_bad += 1
        else:
            n_ok += 1
        if node.status == "verified" and (node.speedup or 0) > best.get(node.card_id, 1.0):
            best[node.card_id] = node.speedup or 1.0
            now = model_speedup(cards, best)
        minutes.append(max(0.0, node.updated_at - started_at) / 60)
        ok.append(n_ok)
        bad.append(n_bad)
        gain.append(now)
    return RunSeries(minutes, ok, bad, gain)


Draw = Callable[[Any, int, int], str | None]  # (plt, width, height) -> a note instead of a plot


class Chart(PlotextPlot):
    """A plot redrawn from `draw(plt)` on every render; `draw` returns a line to show instead of a plot
    (no data yet) or None. `title` is kept for tests and the fallback text."""

    DEFAULT_CSS = "Chart { width: 1fr; height: 1fr; min-height: 5; }"

    def __init__(self, title: str, draw: Draw | None = None, *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self._draw = draw

    def set_draw(self, draw: Draw) -> None:
        self._draw = draw
        self.refresh()

    def render(self) -> RenderResult:
        w, h = self.size.width, self.size.height
        if w < MIN_W or h < MIN_H:
            return Text(f"{self.title}: too small to plot (widen the terminal)", style="dim")
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        note = self._draw(plt, w, h) if self._draw else "no data"
        if note:
            return Text(f"{self.title}\n\n{note}", style="dim")
        try:
            return super().render()
        except Exception as e:  # plotext cannot lay this size or data out: a line, not a crash
            return Text(f"{self.title}: cannot plot here ({type(e).__name__})", style="dim")


COMPILE_LABEL = "torch.compile"


def draw_card_us(series: CardSeries, eager_us: float | None, compile_us: float | None = None) -> Draw:
    """Best µs so far (and each verified candidate) over evaluations, with the eager line and, where the
    card has one, the torch.compile line (its op compiled alone, timed as eager is)."""
    def draw(plt, w: int, h: int) -> str | None:
        if not series.evaluation:
            return "no verified candidate yet"
        plt.plot(series.evaluation, series.best_us, label="best µs", marker="braille")
        plt.scatter(series.evaluation, series.each_us, label="each", marker="dot")
        if eager_us:
            _level(plt, series.evaluation, eager_us, "eager")
        if compile_us:
            _level(plt, series.evaluation, compile_us, COMPILE_LABEL, color="orange")
        plt.xlabel("evaluation")
        plt.ylabel("µs")
        levels = [u for u in (eager_us, compile_us) if u]
        _limits(plt, series.evaluation, [*series.best_us, *series.each_us, *levels])
        return None
    return draw


def draw_card_speedup(series: CardSeries, compile_speedup: float | None = None) -> Draw:
    """Best speedup over eager so far, over evaluations, with the 1× (eager) line and, where known,
    torch.compile's speedup over eager as a line."""
    def draw(plt, w: int, h: int) -> str | None:
        if not series.evaluation:
            return "no verified candidate yet"
        plt.plot(series.evaluation, series.speedup, label="best speedup", marker="braille")
        _level(plt, series.evaluation, 1.0, "eager 1×")
        if compile_speedup:
            _level(plt, series.evaluation, compile_speedup, COMPILE_LABEL, color="orange")
        plt.xlabel("evaluation")
        plt.ylabel("× vs eager")
        _limits(plt, series.evaluation, [*series.speedup, 1.0, *([compile_speedup] if compile_speedup else [])])
        return None
    return draw


def draw_progress(series: RunSeries, ok_label: str = "verified") -> Draw:
    def draw(plt, w: int, h: int) -> str | None:
        if not series.minutes:
            return "no finished candidate yet"
        plt.plot(series.minutes, series.verified, label=ok_label, color="green", marker="braille")
        plt.plot(series.minutes, series.failed, label="failed", color="red", marker="braille")
        plt.xlabel("minutes")
        plt.ylabel("candidates")
        _limits(plt, series.minutes, [0, *series.verified, *series.failed])
        return None
    return draw


def draw_gain(series: RunSeries, dry_run: bool = False) -> Draw:
    def draw(plt, w: int, h: int) -> str | None:
        if dry_run:
            return "a dry run compiles and stops: nothing was timed"
        if not series.minutes:
            return "no finished candidate yet"
        plt.plot(series.minutes, series.model_speedup, label="est. model speedup", marker="braille")
        plt.xlabel("minutes")
        plt.ylabel("× vs eager")
        _limits(plt, series.minutes, [1.0, *series.model_speedup])
        return None
    return draw


def draw_failures(counts: Mapping[str, int]) -> Draw:
    def draw(plt, w: int, h: int) -> str | None:
        if not counts:
            return "no failed candidate"
        # One row per bar at least (plotext overlaps bars in a short pane): the most frequent that fit.
        room = max(1, h - 5)
        names = list(counts)[:room]
        if len(counts) > room:
            plt.title(f"{FAILURES_TITLE} (top {room} of {len(counts)})")
        names.reverse()  # plotext draws the first bar at the bottom: the most frequent goes on top
        values = [counts[k] for k in names]
        plt.bar([f"{k} {counts[k]}" for k in names], values, orientation="horizontal", color="red", width=0.2)
        top = max(values)
        step = max(1, -(-top // 5))
        plt.xticks(list(range(0, top + step, step)))
        plt.xlabel("failed candidates")
        return None
    return draw


def _level(plt, xs: Sequence[float], y: float, label: str, color: str = "red") -> None:
    """A labelled horizontal reference line across the plotted range (eager, 1×, torch.compile)."""
    lo, hi = min(xs), max(xs)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    plt.plot([lo, hi], [y, y], label=label, color=color, marker="braille")


def _limits(plt, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Give a flat or single-point series some room (plotext divides by the span)."""
    lo, hi = min(xs), max(xs)
    if hi - lo < 1e-9:
        plt.xlim(lo - 1, hi + 1)
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-9 * max(1.0, abs(hi)):
        pad = max(abs(hi) * 0.1, 1e-3)
        plt.ylim(lo - pad, hi + pad)
