"""Live refresh: an engine process writes candidates while the TUI is open; they appear, in batches."""

import subprocess
import sys
import time

from conftest import ROOT
from tui_helpers import screen_text

from kforge_tui.app import KforgeApp

SCRIPT = ROOT / "scripts" / "make_demo_db.py"


async def test_nodes_written_by_another_process_appear(tmp_path):
    ws = tmp_path / "ws"
    writer = subprocess.Popen([sys.executable, str(SCRIPT), "--standin", "--out", str(ws), "--announce",
                               "--hold", "--delay", "0.15", "--iterations", "10"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        run_id = writer.stdout.readline().strip()
        assert run_id.startswith("run-"), run_id
        app = KforgeApp(ws / "kforge.db", run_id, refresh_s=0.2)
        t0 = time.time()
        async with app.run_test(size=(100, 40)) as pilot:
            await pilot.pause(0.1)
            app.open_tree("standin-gn")
            await pilot.pause(0.2)
            tree = app.screen
            first = set(tree.rows)
            # The engine starts writing only now: on a loaded machine it could otherwise finish all its
            # candidates before the tree opens, and nothing would be new (a CI failure, once).
            writer.stdin.write("go\n")
            writer.stdin.flush()
            deadline = time.time() + 30
            while time.time() < deadline and len(tree.rows) < len(first) + 3:
                await pilot.pause(0.2)
            new = set(tree.rows) - first
            assert len(new) >= 3, "candidates written by the engine process never reached the tree"
            await pilot.pause(0.3)
            text = screen_text(app)
            roots = [n for n in new if tree.rows[n].parent_id is None]
            assert all(n in text for n in roots), "new top-level nodes are on screen"
            # Refresh is per tick, never per engine event: at most one applied snapshot per 0.2 s tick.
            assert app.ticks <= (time.time() - t0) / 0.2 + 2
            assert len(app.events) > 0
    finally:
        writer.kill()
        writer.wait()


async def test_resume_from_the_tui_shows_the_run_running_again(tmp_path):
    # The stand-in engine (real orchestrator and store) in this process; pause and resume go through the
    # TUI's control writer and the status is read back through its read model, as the overview shows it.
    import asyncio

    from run_standin import CARDS, Proposer, StandInLane

    from engine.cards import OperatorCard
    from engine.run.orchestrator import Budgets, Orchestrator
    from engine.run.plan import CardState
    from engine.run.store_recorder import StoreRecorder
    from engine.store import Store, db_path, new_id
    from kforge_tui.controls import ControlWriter
    from kforge_tui.readmodel import ReadModel

    db = db_path(tmp_path)
    async with await Store.open(db) as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"}, [
            {"card_id": c, "op": "aten::gelu", "signature": {"op": "aten::gelu", "args": [], "aliases": []},
             "signature_text": "", "calls": 1, "share": 0.5, "bytes": 100} for c in CARDS], [])
        run = await store.create_run("cap-1", "m", "scripted", {"iterations": 1000})
        cards = [CardState(OperatorCard(c, "aten::gelu", {}, bytes=100, eager_us=40.0, roofline_us=1.0,
                                        share=0.5), ["s"]) for c in CARDS]
        o = Orchestrator(cards=cards, proposer=Proposer(), evaluate=StandInLane(tmp_path / "evals.log", None),
                         recorder=StoreRecorder(store, run["id"]), new_id=lambda: new_id("cand"),
                         budgets=Budgets(iterations_per_card=1000), max_proposals=1, poll_s=0.01)
        engine = asyncio.create_task(o.run())
        tui, model = ControlWriter(db), ReadModel(db)

        async def status_becomes(want):
            for _ in range(1000):  # a wait, not a timing assertion
                if model.run(run["id"]).status == want:
                    return True
                await asyncio.sleep(0.01)
            return False

        async def send(command):  # in a thread, as the TUI's own process would: the engine's loop keeps going
            await asyncio.to_thread(tui.send, run["id"], command)

        try:
            assert await status_becomes("running")
            await send("pause")
            assert await status_becomes("paused")
            await send("resume")
            assert await status_becomes("running"), "after resume the run still reads 'paused'"
            await send("stop")
            assert await asyncio.wait_for(engine, 30) == "user"
        finally:
            engine.cancel()
            model.close()


def test_a_finished_dry_run_reads_done_on_the_progress_bar(tmp_path):
    # my_model: 7 cards, of which the builtin skips 4 (noise, declined) and exhausts its templates on the
    # others long before 300 iterations. The bar said 1% ('done 23/2100') for the finished run.
    import asyncio
    import json

    from engine.store import db_path

    r = subprocess.run([sys.executable, "-m", "kforge_tui", "run", str(ROOT / "configs/examples/my_model.toml"),
                        "--small", "--dry-run", "--no-tui", "--device", "cpu", "--iterations", "300", "--json",
                        "--workspace", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["status"] == "done" and 0 < doc["evaluations"] < 300

    async def overview_and_cards() -> tuple[str, str, int | None]:
        app = KforgeApp(db_path(tmp_path), doc["run"], refresh_s=0)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.5)
            overview = screen_text(app)
            await pilot.press("c")
            await pilot.pause(0.3)
            # What the bar counts: every card is done or skipped, so nothing is left to count on.
            bar = app.model._search_bar(300)
            return overview, screen_text(app), bar

    overview, cards, bar = asyncio.run(overview_and_cards())
    assert "100%" in overview, overview
    n = doc["evaluations"]
    assert f"done {n}/{n}:" in overview, overview
    skipped = {c["id"]: c["stopped"] for c in doc["cards"] if not c["candidates"]}
    assert sorted(skipped.values()) == ["declined"] * 3 + ["noise"], skipped
    # The cards the builtin declined say so, as the noise card does (they read 'untouched' before).
    assert cards.count("declined") == 3 and "untouched" not in cards, cards
    assert bar == (n, n)  # every card is done or skipped: nothing is left to count on


async def test_the_overview_bar_counts_as_the_headless_bar_and_never_jumps(tmp_path):
    # The overview counted a card's whole budget until the card was done, and a card that ran out of revisions
    # to try is said done ('exhausted') only when the run ends: its unused iterations stayed in the total, the
    # bar sat part of the way, then jumped to the end with the run. `run --no-tui`'s bar was fixed in 0c67845;
    # the overview now counts with the same function (engine.progress.search_bar).

    from test_orchestrator import StandInLane, ThreeThenNothing, card, orchestrator

    from engine.run.orchestrator import Budgets
    from engine.run.report import search_progress
    from engine.run.store_recorder import StoreRecorder
    from engine.store import Store, db_path
    from kforge_tui.readmodel import ReadModel
    from kforge_tui.screens.overview import progress_of

    db = db_path(tmp_path)
    seen: list[tuple[str, tuple[int, int], tuple[int, int]]] = []  # event, overview bar, headless bar
    async with await Store.open(db) as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"}, [
            {"card_id": c, "op": "aten::gelu", "signature": {"op": "aten::gelu", "args": [], "aliases": []},
             "signature_text": "", "calls": 1, "share": 0.3, "bytes": 1000} for c in ("x", "y")], [])
        run = await store.create_run("cap-1", "m", "three", {"iterations": 12})
        model = ReadModel(db)

        def after(kind, payload, card_id, o):  # the overview's values as a tick right after this event reads them
            seen.append((kind, progress_of(model.poll(run["id"]).stats), search_progress(o)))

        recorder = StoreRecorder(store, run["id"], progress=after)
        o = orchestrator([card("x"), card("y", 0.2)], ThreeThenNothing(), StandInLane(0.0), recorder,
                         budgets=Budgets(iterations_per_card=12), max_proposals=1)
        recorder.orchestrator = o
        try:
            assert await o.run() == "iterations"
        finally:
            model.close()
    used = o.cards["x"].iterations + o.cards["y"].iterations
    assert o.cards["x"].iterations < 12 and used < 24
    bars = [bar for _, bar, _ in seen if bar != (0, 1)]  # (0, 1): before the run has a card counted
    assert all(d <= t for d, t in bars) and [t for _, t in bars] == sorted((t for _, t in bars), reverse=True), seen
    assert bars[0] == (0, 24) and bars[-1] == (used, used), seen
    assert any(t == used and d < used for d, t in bars), seen  # x's unused iterations left the total early
    # The same count as the headless bar, except at the event that changes it: the engine writes 'evaluated'
    # before it counts the iteration, and sees that x has nothing left to try at its last 'declined', before it
    # writes 'card_exhausted'.
    assert [x for x in seen if x[1] != x[2] and x[0] not in ("evaluated", "declined")] == [], seen
    # x left the total (its used iterations stay; y may still use its 12) as soon as it had nothing left to try.
    assert [t for kind, (_, t), _ in seen if kind == "card_exhausted"] == [o.cards["x"].iterations + 12], seen
