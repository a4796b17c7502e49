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
            # What a live run's bar counts: the same run as if still running, its skipped cards known.
            live = app.model._budget(300, True)
            return overview, screen_text(app), live

    overview, cards, live_budget = asyncio.run(overview_and_cards())
    assert "100%" in overview, overview
    n = doc["evaluations"]
    assert f"done {n}/{n}:" in overview, overview
    skipped = {c["id"]: c["stopped"] for c in doc["cards"] if not c["candidates"]}
    assert sorted(skipped.values()) == ["declined"] * 3 + ["noise"], skipped
    # The cards the builtin declined say so, as the noise card does (they read 'untouched' before).
    assert cards.count("declined") == 3 and "untouched" not in cards, cards
    assert live_budget == n  # every card is done or skipped: nothing is left to count on
