"""kill -9 of a dry run through the real CLI, then --resume without a GPU: it stays a dry run and nothing
compiled before the kill is compiled again (local lanes, and Ray lanes of a cluster after the head process
died)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import ROOT

CONFIG = str(ROOT / "configs" / "examples" / "my_model.toml")


def _kill_then_resume(tmp_path, *extra, resume=None):
    """kill -9 of `run --dry-run` after six compiled candidates, then `run --resume`: in a fresh process, or with
    `resume` (the cli fixture) in this one."""
    ws = tmp_path / "ws"
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "kforge_tui", "run", CONFIG, "--small", "--dry-run", "--device", "cpu",
                              "--iterations", "30", "--no-tui", "--workspace", str(ws), *extra],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
    deadline = time.time() + 240
    n = 0
    while n < 6:
        assert time.time() < deadline and first.poll() is None, "the run never compiled six candidates"
        time.sleep(0.3)
        try:
            with sqlite3.connect(ws / "kforge.db") as db:
                n = db.execute("SELECT count(*) FROM candidates WHERE status = 'compiled'").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            pass
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    with sqlite3.connect(ws / "kforge.db") as db:
        (run_id,), = db.execute("SELECT id FROM runs").fetchall()
        before = {c for (c,) in db.execute("SELECT id FROM candidates WHERE status = 'compiled'")}
    argv = ["run", "--resume", run_id, "--no-tui", "--json", "--workspace", str(ws)]
    if resume is None:
        second = subprocess.run([sys.executable, "-m", "kforge_tui", *argv], capture_output=True, text=True,
                                timeout=400, cwd=ROOT, env=env)
        code, out, err = second.returncode, second.stdout, second.stderr
    else:
        code, out, err = resume(*argv)
    assert code == 0, err[-2000:]
    doc = json.loads(out)
    with sqlite3.connect(ws / "kforge.db") as db:
        evaluated = [json.loads(p)["candidate"] for (p,) in
                     db.execute("SELECT payload FROM events WHERE kind = 'evaluated'")]
        statuses = {s for (s,) in db.execute("SELECT status FROM candidates")}
        run = db.execute("SELECT status, stopped_by FROM runs").fetchone()
    assert len(evaluated) == len(set(evaluated)), "a candidate was compiled twice"
    assert before <= set(evaluated)
    assert statuses <= {"compiled", "rejected"} and run == ("done", "iterations"), (statuses, run)
    assert doc["status"] == "done"
    return doc


def test_dry_run_killed_and_resumed_compiles_each_candidate_once(tmp_path, cli):
    # resumed in this process (a fresh one spent ~8 s of its ~12 s importing torch and Dynamo again)
    _kill_then_resume(tmp_path, resume=cli)


@pytest.mark.xdist_group("ray")  # conftest.ray_cluster: one cluster per worker
def test_ray_dry_run_killed_and_resumed_compiles_each_candidate_once(tmp_path, cli, ray_cluster):
    # the run's lanes on a running cluster (--ray-address), which outlives the head process killed; resumed in this
    # process, which connects to the cluster named in the run's config (and disconnects at the end). Each local
    # Ray instance, the killed run's and the resume's, had cost ~8 s of a CI core to start.
    import builtins

    python_print = builtins.print
    doc = _kill_then_resume(tmp_path, "--ray", "--ray-address", ray_cluster.address, resume=cli)
    assert doc["lanes"]["ray"] is True and doc["lanes"]["hosts"], doc["lanes"]  # the resume's lanes were Ray's too
    # Ray's driver left Python's print alone (it replaces it on a worker's first log line unless told not to: a
    # side-effect test run after this one in the same worker then read Ray's print in a model's forward)
    assert builtins.print is python_print
