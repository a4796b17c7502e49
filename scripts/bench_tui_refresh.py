"""Check that one TUI refresh tick stays under a budget on a big run: a 10,000-node search tree and
500 cards, with an engine finishing and starting candidates between ticks.

    python scripts/bench_tui_refresh.py [--nodes 10000] [--cards 500] [--ticks 30] [--budget-ms 50]
                                        [--screens overview,cards,tree,failures] [--per-tick 25]

A tick is what the user waits for: poll the store (incremental) + apply the snapshot to the open
screen inside batch_update + the layout and compositor pass that follows + rendering the update to
the bytes a terminal would receive (Textual's headless driver skips that last step, so it is done
here). Between ticks, outside the measurement, a writer finishes the previous `--per-tick` candidates
(half in the big tree, half spread over other cards, so a handful of card rows change) and starts as
many new ones. Per screen it prints p50/p95 of the tick and the median bytes sent to the terminal;
it exits 1 when any screen's p95 reaches the budget. Synthetic data, never a measurement of a run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from textual._compositor import CompositorUpdate  # noqa: E402
from tui_fixture import T0, build_store  # noqa: E402

from engine.store import Store  # noqa: E402
from kforge_tui.app import KforgeApp  # noqa: E402

SCREENS = ("overview", "cards", "tree", "failures")
BIG_CARD = "card-0000"


async def write_batch(store: Store, run_id: str, tick: int, per_tick: int, first_tick: int) -> None:
    """What an engine does between two ticks: the previous batch finishes, a new batch starts evaluating."""
    for i in range(per_tick):
        nid = f"cand-live-{tick:05d}-{i:03d}"
        big = i % 2 == 1
        await store.add_candidate(run_id, BIG_CARD if big else f"card-{(tick * 5 + i) % 499 + 1:04d}",
                                  parent_id="cand-r0c000n00001" if big else None, source=f"// {nid}",
                                  launch_spec=None, proposer="bench", status="evaluating", candidate_id=nid)
        if tick > first_tick:  # the batch the previous tick started finishes now
            prev = f"cand-live-{tick - 1:05d}-{i:03d}"
            if i % 5 == 4:  # one in five fails, as a real search does
                await store.update_candidate(prev, status="rejected", category="mismatch",
                                             error="mismatch: 12 of 4096 elements differ")
            else:
                await store.update_candidate(prev, status="verified", best_us=100.0 - tick % 50, eager_us=412.0,
                                             speedup=4.0 + tick % 50 / 100)
        await store.add_event(run_id, "evaluated", {"status": "verified"}, BIG_CARD)


class TerminalMeter:
    """Renders every compositor update to terminal bytes, as Textual does for a real terminal."""

    def __init__(self, app: KforgeApp) -> None:
        self.app = app
        self.bytes = 0
        self._display = app._display

        def display(screen, renderable) -> None:
            if isinstance(renderable, CompositorUpdate) and not app._batch_count:
                self.bytes += len(renderable.render_segments(app.console).encode())
            self._display(screen, renderable)
        app._display = display


async def settle(pilot) -> None:
    """Process every pending message, then run the screen's layout/compositor pass until nothing is dirty."""
    for _ in range(6):
        await pilot.pause(0)  # drains the screen's message queues, then runs the compositor update
        screen = pilot.app.screen
        if not (screen._layout_required or screen._scroll_required or screen._repaint_required
                or screen._dirty_widgets):
            break


async def open_screen(app: KforgeApp, pilot, screen: str) -> None:
    if screen == "tree":
        app.open_tree(BIG_CARD)
        await pilot.pause(0.3)
        await pilot.press("b")  # expand the path to the best node of the big tree
        await pilot.pause(0.2)
        app.screen.reveal("cand-r0c000n00001")  # the node the writer adds children to, expanded
        await pilot.pause(0.2)
        await pilot.press("space")
    elif screen == "cards":
        await pilot.press("c")
    elif screen == "failures":
        await pilot.press("f")
    await pilot.pause(0.3)


async def measure(db: Path, run_id: str, screen: str, ticks: int, per_tick: int, first_tick: int
                  ) -> tuple[list[float], list[float], list[int]]:
    app = KforgeApp(db, run_id, refresh_s=0, clock=lambda: T0)
    app.animation_level = "none"
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.1)
        await open_screen(app, pilot, screen)
        await settle(pilot)
        meter = TerminalMeter(app)
        poll, total, sent = [], [], []
        store = await Store.open(db)
        try:
            for t in range(first_tick, first_tick + ticks):
                await write_batch(store, run_id, t, per_tick, first_tick)
                meter.bytes = 0
                t0 = time.perf_counter()
                app.poll_now()  # poll + apply in one batch_update (a worker thread polls in the live app)
                t1 = time.perf_counter()
                await settle(pilot)
                t2 = time.perf_counter()
                poll.append((t1 - t0) * 1000)
                total.append((t2 - t0) * 1000)
                sent.append(meter.bytes)
        finally:
            await store.close()
        if screen == "tree":
            assert len(app.screen.rows) >= 10_000, "the big tree is the one measured"
    return poll, total, sent


def _p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(len(xs) * 0.95) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--cards", type=int, default=500)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--per-tick", type=int, default=25, help="candidates finished (and started) between two ticks")
    ap.add_argument("--budget-ms", type=float, default=50.0)
    ap.add_argument("--screens", default=",".join(SCREENS))
    args = ap.parse_args()
    screens = [s for s in args.screens.split(",") if s]
    worst: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "kforge.db"
        t0 = time.perf_counter()
        ids = build_store(db, cards=args.cards, per_card=1, runs=1, big_card_nodes=args.nodes)
        print(f"store: {args.cards} cards, {args.nodes}-node tree, built in {time.perf_counter() - t0:.1f}s; "
              f"{args.per_tick} candidates finish per tick")
        for k, screen in enumerate(screens):
            poll, total, sent = asyncio.run(measure(db, ids["runs"][0], screen, args.ticks, args.per_tick,
                                                    1 + k * (args.ticks + 1)))
            worst[screen] = _p95(total)
            print(f"{screen:9s} tick p50 {statistics.median(total):5.1f} ms  p95 {_p95(total):5.1f} ms │ "
                  f"of which poll+apply p50 {statistics.median(poll):5.1f} ms  p95 {_p95(poll):5.1f} ms │ "
                  f"terminal bytes p50 {statistics.median(sent):,.0f}")
    over = [s for s, v in worst.items() if v >= args.budget_ms]
    if over:
        print(f"TOO SLOW: p95 at or over {args.budget_ms:.0f} ms on {', '.join(over)}")
        return 1
    print(f"OK: every screen's p95 tick is under {args.budget_ms:.0f} ms (worst {max(worst.values()):.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
