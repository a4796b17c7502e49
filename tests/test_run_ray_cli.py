"""`run --ray`: a dry run whose compiles are spread over Ray actors, through the CLI (skipped without Ray)."""

import json
import sqlite3
import subprocess
import sys

import pytest
from conftest import ROOT, run_cli

ray = pytest.importorskip("ray")


def test_dry_run_on_ray_compile_lanes(tmp_path, capfd, monkeypatch):
    # The CLI's main in this process (a fresh one spent ~7 s importing torch and Dynamo again): with no Ray running
    # here, `--ray` starts a local instance of its own and ends it with the run. Captured at the file descriptors,
    # so that anything Ray writes to this process's stdout would break --json's document.
    assert not ray.is_initialized()
    monkeypatch.setenv("RAY_DISABLE_USAGE_STATS", "1")
    cfg = ROOT / "configs" / "examples" / "my_model.toml"
    code, out, err = run_cli(["run", cfg, "--small", "--dry-run", "--no-tui", "--device", "cpu", "--iterations", "2",
                              "--ray", "--json", "--workspace", tmp_path / "ws"], capfd)
    assert code == 0, err[-2000:]
    assert not ray.is_initialized()  # the instance the run started ended with it
    doc = json.loads(out)
    assert doc["evaluations"] > 0, doc
    # --json names the lanes per host (Ray's compile actors here, named host/cpuN).
    assert doc["lanes"]["ray"] is True and doc["lanes"]["hosts"], doc["lanes"]
    assert all("/cpu" in n for names in doc["lanes"]["hosts"].values() for n in names), doc["lanes"]
    # The lanes the run used are the Ray actors: named by host, compile lanes.
    db = sqlite3.connect(tmp_path / "ws" / "kforge.db")
    (payload,), = db.execute("SELECT payload FROM events WHERE kind = 'lanes'").fetchall()
    lanes = json.loads(payload)
    assert lanes["lanes"] and all("/cpu" in name for name in lanes["lanes"]), lanes
    assert lanes["hosts"]


def test_ray_address_without_ray_is_refused(tmp_path):
    cfg = ROOT / "configs" / "examples" / "my_model.toml"
    r = subprocess.run([sys.executable, "-m", "kforge_tui", "run", str(cfg), "--dry-run", "--no-tui",
                        "--ray-address", "10.0.0.1:6379", "--workspace", str(tmp_path / "ws")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "add --ray" in r.stderr
