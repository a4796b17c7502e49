"""The second Ctrl-C exits at once but first marks the run stopped. The store holds its write lock across
awaits; a second Ctrl-C landing inside such a transaction must still get the row written (CI caught the
run left 'running' with a dead pid: the handler blocked the very loop that would have released the lock)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from engine.store import Store, db_path
    from engine.run.command import mark_stopped_now
    from engine.run.interrupt import exit_now, on_exit_now

    CAPTURE = {"id": "cap-1", "model": "m", "config_path": "m.toml", "config_sha256": "ab" * 32,
               "device": "cpu", "dtype": "float32", "small": True, "torch_version": "2", "created_at": 1.0,
               "wall_s": 1.0, "total_calls": 1.0, "notes": {}}

    async def main(ws):
        store = await Store.open(db_path(ws))
        await store.save_capture(CAPTURE, [], [])
        run = await store.create_run("cap-1", "m", "builtin", status="running")
        on_exit_now(lambda: mark_stopped_now(db_path(ws), run["id"]))
        async with store._transaction() as conn:  # the write lock, held across awaits as the store does
            await conn.execute("UPDATE runs SET updated_at = 2 WHERE id = ?", (run["id"],))
            asyncio.get_running_loop().call_soon(exit_now)  # the second Ctrl-C arrives now
            await asyncio.sleep(1.0)
            await conn.execute("UPDATE runs SET updated_at = 3 WHERE id = ?", (run["id"],))
        await asyncio.sleep(30)  # never reached in time: exit_now has ended the process
        sys.exit(0)

    asyncio.run(main(sys.argv[1]))
""")


def test_second_ctrl_c_inside_a_store_transaction_still_marks_the_run_stopped(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(ws)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 130, proc.stderr
    with sqlite3.connect(ws / "kforge.db") as db:
        rows = db.execute("SELECT status, stopped_by FROM runs").fetchall()
    assert rows == [("stopped", "interrupted")], rows
