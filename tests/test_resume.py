"""kill -9 of a running engine, then --resume: nothing lost, nothing evaluated twice."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import ROOT

SCRIPT = str(ROOT / "tests" / "run_standin.py")


def test_kill_9_then_resume_loses_and_repeats_nothing(tmp_path):
    ws = tmp_path / "ws"
    first = subprocess.Popen([sys.executable, SCRIPT, str(ws), "new", "--hang-at", "5"], stdout=subprocess.PIPE,
                             text=True)
    run_id = first.stdout.readline().strip()
    deadline = time.time() + 60
    while not (ws / "hanging").exists():
        assert time.time() < deadline and first.poll() is None, "the run never reached its 5th evaluation"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    db = sqlite3.connect(ws / "kforge.db")
    before = dict(db.execute("SELECT id, status FROM candidates").fetchall())
    assert "evaluating" in before.values(), "the kill landed during an evaluation"
    done_before = (ws / "evaluations.log").read_text().splitlines()
    assert len(done_before) == 4

    second = subprocess.run([sys.executable, SCRIPT, str(ws), "resume", run_id], capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr
    assert "stopped: iterations" in second.stdout
    log = (ws / "evaluations.log").read_text().splitlines()
    assert len(log) == len(set(log)), "a candidate was evaluated twice"
    rows = db.execute("SELECT id, card_id, status FROM candidates").fetchall()
    assert all(status == "verified" for _, _, status in rows), "every stored candidate was evaluated"
    assert len(rows) == len(log) == 2 * 6  # both cards reached their budget of 6
    for cid in before:  # nothing stored before the kill was lost
        assert cid in {r[0] for r in rows}
    status = db.execute("SELECT status, stopped_by FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert status == ("done", "iterations")
    # The search tree on disk is whole too: each card's root counts all 6 evaluations, across both processes.
    roots = db.execute("SELECT card_id, visits FROM search_nodes WHERE run_id = ? AND parent_node_id IS NULL",
                       (run_id,)).fetchall()
    assert sorted(roots) == [("card-a", 6), ("card-b", 6)]
    assert db.execute("SELECT count(*) FROM search_nodes WHERE run_id = ? AND candidate_id IS NOT NULL",
                      (run_id,)).fetchone()[0] == 12
