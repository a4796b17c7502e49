"""`run --ray`: a dry run whose compiles are spread over Ray actors, through the CLI (skipped without Ray)."""

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("ray")


def test_dry_run_on_ray_compile_lanes(tmp_path):
    # A fresh process, which starts a local Ray instance of its own. Not the CLI's main in this process (it saved
    # ~7 s of importing torch and Dynamo): a new local instance turns Ray's token authentication on for the whole
    # process (RAY_AUTH_MODE=token, Ray 2.60), and this worker could then place no actor on the shared cluster of
    # conftest.ray_cluster, which runs without it.
    cfg = ROOT / "configs" / "examples" / "my_model.toml"
    r = subprocess.run([sys.executable, "-m", "kforge_tui", "run", str(cfg), "--small", "--dry-run", "--no-tui",
                        "--device", "cpu", "--iterations", "2", "--ray", "--json", "--workspace", str(tmp_path / "ws")],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "RAY_DISABLE_USAGE_STATS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
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


def test_ray_address_without_ray_is_refused_before_the_tui_attaches(tmp_path, monkeypatch, capsys):
    # From a terminal the TUI attached at once, and the detached engine exited 2 into its log
    from engine import cli as cli_mod

    opened = []
    monkeypatch.setattr(cli_mod, "terminal_attached", lambda: True)
    code = cli_mod.main(["run", str(ROOT / "configs" / "examples" / "my_model.toml"), "--dry-run",
                         "--ray-address", "10.0.0.1:6379", "--workspace", str(tmp_path / "ws")],
                        open_tui=lambda args: opened.append(args) or 0)
    out, err = capsys.readouterr()
    assert opened == [] and code == 2 and out == ""
    assert err.strip() == "error: --ray-address 10.0.0.1:6379: it names the cluster for --ray; add --ray", err
