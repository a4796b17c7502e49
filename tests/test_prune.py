"""`kforge-tui prune`: what a workspace holds on disk, and removing the capture samples no run needs.

One small workspace is built once on the CPU (my_model --small, builtin proposer, dry run): a capture a run
used, an older capture no run used, the newest capture, a sample folder left by a capture killed long ago and
one written a moment ago. Each test works on its own copy."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import CONFIGS
from test_bad_input import assert_one_line_error

MY_MODEL = CONFIGS / "examples" / "my_model.toml"
HOUR_AGO = time.time() - 3600


def _main(*argv) -> tuple[int, str, str]:
    from kforge_tui.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _capture(ws: Path) -> str:
    code, out, err = _main("capture", MY_MODEL, "--small", "--device", "cpu", "--json", "--workspace", ws)
    assert code == 0, err
    return json.loads(out)["capture"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    ws = tmp_path_factory.mktemp("prune") / "ws"
    used = _capture(ws)
    code, out, err = _main("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--device", "cpu",
                           "--iterations", "1", "--json", "--workspace", ws)
    assert code == 0, err
    run = json.loads(out)["run"]
    older, newest = _capture(ws), _capture(ws)
    killed = ws / "samples" / ".partial-my_model-killed"
    killed.mkdir()
    (killed / "a.0.safetensors").write_bytes(os.urandom(200_000))
    for p in (killed / "a.0.safetensors", killed):
        os.utime(p, (HOUR_AGO, HOUR_AGO))
    writing = ws / "samples" / ".partial-my_model-writing"
    writing.mkdir()
    (writing / "b.0.safetensors").write_bytes(os.urandom(10_000))
    return {"ws": ws, "run": run, "used": used, "older": older, "newest": newest}


@pytest.fixture
def ws(built, tmp_path) -> Path:
    """A copy of the built workspace (mtimes kept: the killed capture's folder stays an hour old)."""
    copy = tmp_path / "ws"
    shutil.copytree(built["ws"], copy)
    return copy


def du(path: Path) -> int:
    """Bytes on disk as `du` counts them: every file and folder's allocated blocks."""
    total = path.lstat().st_blocks * 512
    for root, dirs, files in os.walk(path):
        total += sum((Path(root) / n).lstat().st_blocks * 512 for n in dirs + files)
    return total


def files_of(ws: Path) -> dict[str, int]:
    return {str(p.relative_to(ws)): p.stat().st_size for p in ws.rglob("*") if p.is_file()
            and not p.name.startswith("kforge.db")}


def sample_rows(ws: Path) -> dict[str, int]:
    db = sqlite3.connect(ws / "kforge.db")
    try:
        return dict(db.execute("SELECT capture_id, COUNT(*) FROM samples GROUP BY capture_id"))
    finally:
        db.close()


def prune(cli, ws: Path, *flags) -> dict:
    code, out, err = cli("prune", "--json", "--workspace", ws, *flags)
    assert code == 0, err
    return json.loads(out)


def test_listing_shows_sizes_newest_first_and_removes_nothing(cli, built, ws):
    before, rows = files_of(ws), sample_rows(ws)
    doc = prune(cli, ws)
    assert doc["deleted"] is False and doc["removed"] is None
    assert files_of(ws) == before and sample_rows(ws) == rows        # only shown

    caps = {c["id"]: c for c in doc["captures"]}
    assert [c["id"] for c in doc["captures"]] == [built["newest"], built["older"], built["used"]]
    for c in doc["captures"]:
        assert c["bytes"] == du(ws / c["folder"]) > 0 and c["sample_files"] > 0 and c["missing_files"] == 0
    parts = {p["path"]: p["bytes"] for p in doc["parts"]}
    assert parts["samples/"] == du(ws / "samples") and parts["cache/"] == du(ws / "cache")
    assert parts["kforge.db"] >= (ws / "kforge.db").stat().st_size > 0
    assert doc["bytes"] == sum(parts.values())
    assert doc["models"]["my_model"] == {"captures": 3, "bytes": sum(c["bytes"] for c in caps.values())}

    # the rule: the newest is kept for the next run, the run's capture for the run, an older unused one goes
    assert caps[built["newest"]]["remove"] is False
    assert [h["flag"] for h in caps[built["newest"]]["kept_because"]] == ["--newest"]
    assert caps[built["used"]]["remove"] is False
    assert [h["flag"] for h in caps[built["used"]]["kept_because"]] == ["--run-captures"]
    assert caps[built["used"]]["runs"] == [{"id": built["run"], "status": "done", "live": False,
                                           "process_gone": False}]
    assert caps[built["older"]]["remove"] is True and caps[built["older"]]["kept_because"] == []
    left = {x["path"]: x for x in doc["leftovers"]}
    killed, writing = left["samples/.partial-my_model-killed"], left["samples/.partial-my_model-writing"]
    assert killed["remove"] is True and killed["bytes"] == du(ws / killed["path"])
    assert writing["remove"] is False and "a capture may be writing it" in writing["kept_because"][0]["why"]
    assert doc["removable_bytes"] == caps[built["older"]]["bytes"] + killed["bytes"]
    assert doc["more_with"] == {"--run-captures": caps[built["used"]]["bytes"],
                                "--newest": caps[built["newest"]]["bytes"],
                                "--run-captures --newest": caps[built["used"]]["bytes"] + caps[built["newest"]]["bytes"]}

    code, out, err = cli("prune", "--workspace", ws)
    assert code == 0, err
    assert out.index(built["newest"]) < out.index(built["older"]) < out.index(built["used"])
    assert "nothing was removed" in out and "would free" in out
    assert "--run-captures would free" in out and built["run"] in out and "cannot be resumed" in out
    assert files_of(ws) == before


def test_delete_removes_what_the_listing_said_and_runs_are_unchanged(cli, built, ws):
    runs_before = cli("runs", "--json", "--workspace", ws)[1]
    compare_before = cli("compare", built["run"], "--json", "--workspace", ws)[1]
    listed = prune(cli, ws)
    to_remove = {c["folder"] for c in listed["captures"] if c["remove"]} | \
        {x["path"] for x in listed["leftovers"] if x["remove"]}
    assert to_remove == {f"samples/{built['older']}", "samples/.partial-my_model-killed"}
    kept_files = {f: s for f, s in files_of(ws).items() if not any(f.startswith(p + "/") for p in to_remove)}

    doc = prune(cli, ws, "--delete")
    assert doc["deleted"] is True
    assert {r["path"] for r in doc["removed"] if r["error"] is None} == to_remove
    assert doc["freed_bytes"] == listed["removable_bytes"]
    assert not any((ws / p).exists() for p in to_remove)
    assert files_of(ws) == kept_files                     # nothing else touched
    assert built["older"] not in sample_rows(ws)          # the database names no file that is gone
    assert {built["used"], built["newest"]} <= set(sample_rows(ws))

    # the run lists and compares as it did; a new run reuses the newest capture (no capture again)
    assert cli("runs", "--json", "--workspace", ws)[1] == runs_before
    assert cli("compare", built["run"], "--json", "--workspace", ws)[1] == compare_before
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--device", "cpu", "--iterations",
                         "1", "--json", "--workspace", ws)
    assert code == 0, err
    db = sqlite3.connect(ws / "kforge.db")
    assert db.execute("SELECT capture_id FROM runs WHERE id = ?", (json.loads(out)["run"],)).fetchone()[0] == \
        built["newest"]
    assert db.execute("SELECT COUNT(*) FROM captures").fetchone()[0] == 3
    db.close()
    assert prune(cli, ws)["removable_bytes"] == 0         # a second prune finds nothing more


def test_run_captures_removes_a_finished_runs_samples_and_the_run_says_so(cli, built, ws):
    run = built["run"]
    code, out, err = cli("export", run, "--out", ws / "m.cast", "--workspace", ws)
    export_before = (code, err)
    doc = prune(cli, ws, "--delete", "--run-captures")
    assert f"samples/{built['used']}" in {r["path"] for r in doc["removed"] if r["error"] is None}
    assert not (ws / "samples" / built["used"]).exists() and built["used"] not in sample_rows(ws)
    assert (ws / "samples" / built["newest"]).is_dir()    # --newest was not given
    assert any(run in c and "cannot be resumed" in c for c in doc["consequences"])

    # runs and compare still show the run, and say its samples are gone
    code, out, err = cli("runs", "--json", "--workspace", ws)
    (row,) = json.loads(out)["runs"]
    assert row["id"] == run and row["status"] == "done"
    assert row["samples_removed"].startswith("removed by 'kforge-tui prune' on ")
    code, out, _ = cli("runs", "--workspace", ws)
    assert "done, dry run, samples removed" in out
    code, out, _ = cli("compare", run, "--plain", "--workspace", ws)
    assert code == 0 and any(x.startswith("capture samples") and "removed by" in x for x in out.splitlines())
    code, out, _ = cli("prune", "--workspace", ws)
    assert "removed by 'kforge-tui prune' on" in out

    # resume is refused in one line that says why and what to run instead
    code, out, err = cli("run", "--resume", run, "--dry-run", "--no-tui", "--workspace", ws)
    assert_one_line_error(code, out, err, f"--resume {run}", "removed by 'kforge-tui prune'",
                          f"kforge-tui run {MY_MODEL} --small")
    # export refuses this dry run exactly as before
    code, out, err = cli("export", run, "--out", ws / "m.cast", "--workspace", ws)
    assert (code, err) == export_before and "dry run" in err


def test_export_after_run_captures_says_its_inputs_are_synthesised(cli, built, ws, monkeypatch):
    # No GPU here: the export is let past its GPU check with a made-up environment and ends where the run has
    # no verified candidate; its `exports` row keeps the warnings it had gathered by then.
    import torch

    import engine.cast.compat

    prune(cli, ws, "--delete", "--run-captures")
    db = sqlite3.connect(ws / "kforge.db")
    db.execute("UPDATE runs SET config = json_set(config, '$.dry_run', json('false')) WHERE id = ?", (built["run"],))
    db.commit()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engine.cast.compat, "current_env", lambda *a, **k: {"gpu": "fake", "arch": "sm_90"})
    code, out, err = cli("export", built["run"], "--out", ws / "m.cast", "--workspace", ws)
    assert code == 1 and "no verified candidate" in err
    (warnings,) = db.execute("SELECT warnings FROM exports WHERE run_id = ?", (built["run"],)).fetchone()
    db.close()
    assert any(f"samples of capture {built['used']} were removed by 'kforge-tui prune'" in w and "synthesised" in w
               for w in json.loads(warnings))


def test_a_run_still_going_keeps_its_capture_whatever_the_flags(cli, built, ws):
    db = sqlite3.connect(ws / "kforge.db")
    db.execute("UPDATE runs SET status = 'running', pid = ? WHERE id = ?", (os.getpid(), built["run"]))
    db.commit()
    db.close()
    doc = prune(cli, ws, "--delete", "--run-captures", "--newest")
    caps = {c["id"]: c for c in doc["captures"]}
    assert caps[built["used"]]["remove"] is False
    assert caps[built["used"]]["kept_because"] == [{"why": f"{built['run']} is running: it reads these samples",
                                                   "flag": None}]
    assert (ws / "samples" / built["used"]).is_dir() and built["used"] in sample_rows(ws)
    # --newest took the newest capture: the next run reuses the one the running run holds (same config)
    assert not (ws / "samples" / built["newest"]).exists() and built["newest"] not in sample_rows(ws)
    assert any("the next 'kforge-tui run' of my_model (--small, cpu) reuses the newest older capture" in c
               for c in doc["consequences"])
    # once that run is over, nothing holds it: the next run captures again
    db = sqlite3.connect(ws / "kforge.db")
    db.execute("UPDATE runs SET status = 'stopped' WHERE id = ?", (built["run"],))
    db.commit()
    db.close()
    doc = prune(cli, ws, "--run-captures", "--newest")
    assert doc["removable_bytes"] == du(ws / "samples" / built["used"])
    assert any("the next 'kforge-tui run' of my_model (--small, cpu) captures again" in c for c in doc["consequences"])


def test_capture_names_the_only_samples_removed(cli, built, ws):
    doc = prune(cli, ws, "--capture", built["older"][:-2], "--delete")
    assert [r["path"] for r in doc["removed"]] == [f"samples/{built['older']}"]
    assert (ws / "samples" / ".partial-my_model-killed").is_dir()     # not named: kept
    # naming the newest is not enough: it is kept until --newest says so
    doc = prune(cli, ws, "--capture", built["newest"])
    assert doc["removable_bytes"] == 0
    assert doc["more_with"]["--newest"] > 0


def test_bad_input_is_one_line(cli, built, ws, tmp_path):
    code, out, err = cli("prune", "--capture", "nope", "--workspace", ws)
    assert_one_line_error(code, out, err, "prune --capture nope: no such capture", built["newest"])
    code, out, err = cli("prune", "--capture", "my_model", "--workspace", ws)
    assert_one_line_error(code, out, err, "prune --capture my_model: 3 captures start so")
    code, out, err = cli("prune", "--workspace", tmp_path / "none")
    assert_one_line_error(code, out, err, "no Kernel Forge workspace")
    code, out, err = cli("prune", "--keep", "--workspace", ws)
    assert_one_line_error(code, out, err, "--keep")


def test_a_run_that_starts_after_the_listing_keeps_its_capture(built, ws):
    # The listing and the removal are apart in time: a run made on a capture in between keeps it.
    from engine.run.prune import decide, freed, remove, survey
    from engine.store import Store, db_path

    s = survey(ws)
    chosen = [e for e in freed(decide(s), {"--run-captures", "--newest"})[1] if e.capture is not None]
    assert {e.capture.id for e in chosen} == {built["used"], built["older"], built["newest"]}

    async def start_run():
        async with await Store.open(db_path(ws)) as store:
            await store.create_run(built["older"], "my_model", "builtin", status="running", pid=os.getpid())

    asyncio.run(start_run())
    done = {r.path: r for r in remove(s, chosen)}
    assert "a run started or resumed on it" in done[f"samples/{built['older']}"].error
    assert (ws / "samples" / built["older"]).is_dir() and built["older"] in sample_rows(ws)
    assert done[f"samples/{built['used']}"].error is None and not (ws / "samples" / built["used"]).exists()


def test_leftovers_and_empty_captures(built, ws):
    # A file under samples/ is removed like a folder; a capture with no samples (capture --samples 0) has
    # nothing to free, and is not the "newest" that holds another capture.
    from engine.run.prune import decide, freed, remove, survey
    from engine.store import Store, db_path

    async def empty_capture():
        async with await Store.open(db_path(ws)) as store:
            await store.save_capture({"id": "my_model-empty", "model": "my_model", "device": "cpu",
                                      "dtype": "float32", "small": True, "sample_dir": "samples/my_model-empty"},
                                     [], [])

    asyncio.run(empty_capture())
    (ws / "samples" / "my_model-empty").mkdir()
    stray = ws / "samples" / "stray.bin"
    stray.write_bytes(b"x" * 5000)
    os.utime(stray, (HOUR_AGO, HOUR_AGO))
    s = survey(ws)
    entries = {e.path: e for e in decide(s)}
    assert entries["samples/stray.bin"].removable(()) and entries["samples/stray.bin"].leftover.what() == "in no capture"
    assert entries["samples/.partial-my_model-killed"].leftover.what() == "a capture that never finished"
    assert entries["samples/my_model-empty"].bytes == 0 and entries["samples/my_model-empty"].holds == ()
    assert [h.flag for h in entries[f"samples/{built['newest']}"].holds] == ["--newest"]
    _, gone = freed(list(entries.values()), ())
    assert entries["samples/my_model-empty"] not in gone
    done = {r.path: r for r in remove(s, [e for e in gone if e.leftover is not None])}
    assert done["samples/stray.bin"].error is None and not stray.exists()
    assert not (ws / "samples" / ".partial-my_model-killed").exists()
