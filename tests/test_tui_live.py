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
                               "--delay", "0.15", "--iterations", "10"], stdout=subprocess.PIPE, text=True)
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
