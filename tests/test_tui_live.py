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
