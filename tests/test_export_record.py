"""Each export of a run is recorded in the workspace (`exports`, schema v6): written, failed or interrupted,
with the targets asked and, per target, the whole-model check and the variants it kept and dropped.

No GPU here: the real exporter runs (store, NVRTC, packaging, the cast on disk) with the two GPU steps
replaced, the fresh-process confirmation and the whole-model check, whose results are injected. The
numbers in these tests are made up to check what is recorded; none is a measurement."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from cast_helpers import H200_ENV, group_norm_card, relu_card
from conftest import ROOT

import engine.cast.compat
import engine.cli
from engine.cards import card_from_row
from engine.export import package as pkg
from engine.propose.builtin import BuiltinProposer
from engine.store import Store, db_path, latest_version, open_readonly, read

RUN = "run-exportrec"
# Made-up whole-model results per target (injected; nothing is measured in this file).
EAGER = {"speedup": 1.08, "speedup_ci": [1.05, 1.12], "eager_ms": 4.0, "cast_ms": 3.7, "rel_l2_err": 2e-4}
GRAPHS = {"speedup": 1.21, "speedup_ci": [1.18, 1.25], "eager_ms": 2.0, "cast_ms": 1.65, "rel_l2_err": 2e-4}
SLOWER = {"speedup": 0.95, "speedup_ci": [0.93, 0.97], "eager_ms": 2.5, "cast_ms": 2.63, "rel_l2_err": 3e-4}


def _candidate(card: dict) -> dict:
    brief = card_from_row(card)
    template, why = BuiltinProposer().template_for(brief)
    assert template is not None, why
    r = template.render(brief, template.default(brief))
    return {"source": r.source, "launch_spec": r.spec}


@pytest.fixture
def workspace(tmp_path):
    return build_workspace(tmp_path / "ws", tmp_path / "toy.toml")


def build_workspace(ws: Path, config: Path) -> Path:
    """A workspace with one run of two cards (group norm, relu), each with a verified candidate faster with
    confidence (the lane's numbers are made up); `config` is the run's config (a stand-in file)."""
    ws.mkdir()
    config.write_text("# the whole-model check is injected; the exporter only needs the file to exist\n")
    cards = [group_norm_card(), relu_card()]

    async def build():
        async with await Store.open(db_path(ws)) as s:
            await s.save_capture({"id": "cap-x", "model": "toy", "device": "cuda", "dtype": "float16",
                                  "config_path": str(config)}, cards, [])
            await s.create_run("cap-x", "toy", "builtin", run_id=RUN, status="done")
            for card in cards:
                cid, _ = await s.add_candidate(RUN, card["card_id"], parent_id=None, proposer="builtin",
                                               status="verified", best_us=5.0, speedup=1.5, **_candidate(card))
                await s.update_candidate(cid, speedup_low=1.4, speedup_high=1.6, eager_us=7.5)
    asyncio.run(build())
    return ws


def vid(card: dict) -> str:
    return f"{pkg._short_op(card['op'])}-{card['card_id'][:8]}"


def injected_confirm(samples: dict) -> dict:
    """The fresh-process confirmation, injected: every variant kept, net gains in the order given."""
    return {"env": {"gpu": "stand-in (injected)"},
            "variants": {v: {"ok": True, "speedup": 1.5, "speedup_ci": [1.4, 1.6], "net_us": 2.0 - i}
                         for i, v in enumerate(samples)}}


def injected_check(answer, target: str, sets: list) -> dict:
    """The whole-model check, injected: `answer(set)` is each set's result (or `answer` an exception to
    raise); the first set that is not slower is chosen, as the check does."""
    if isinstance(answer, BaseException):
        raise answer
    tried = []
    for s in sets:
        result = answer(s)
        tried.append({"variants": s, **result})
        if result["speedup_ci"][1] >= 1.0:
            return {"mode": target, "tried": tried, "chosen": {"variants": s, **result}}
    return {"mode": target, "tried": tried, "chosen": None}


@pytest.fixture
def no_gpu_steps(monkeypatch):
    """The two steps that need a GPU answer with injected results; `model` maps a target to what its
    whole-model check returns for the sets it is given (or an exception to raise)."""
    model: dict = {}
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(engine.cast.compat, "current_env", lambda: dict(H200_ENV))

    def confirm(cast_path, samples, timing, tmp, timeout_s=1800, **kw):
        return injected_confirm(samples)

    def check(cast_path, sets, config, small, graphs, tmp, timeout_s=1800, target=None):
        return injected_check(model[target], target, sets)

    monkeypatch.setattr(pkg, "run_confirm", confirm)
    monkeypatch.setattr(pkg, "run_model_check", check)
    return model


def exports(ws: Path) -> list[dict]:
    conn = open_readonly(db_path(ws))
    try:
        return read.exports(conn, RUN)
    finally:
        conn.close()


def test_a_written_export_records_each_targets_numbers_and_which_variants_serve_it(workspace, no_gpu_steps,
                                                                                    capsys):
    gn, relu = vid(group_norm_card()), vid(relu_card())
    no_gpu_steps["eager"] = lambda s: EAGER
    no_gpu_steps["cuda-graphs"] = lambda s: GRAPHS if len(s) == 1 else SLOWER  # only the set of one holds
    out = workspace.parent / "toy.cast"
    code = engine.cli.main(["export", RUN, "--out", str(out), "--target", "eager,cuda-graphs",
                            "--workspace", str(workspace)])
    assert code == 0, capsys.readouterr().err
    [row] = exports(workspace)
    assert row["status"] == "written" and row["error"] is None
    assert row["out_path"] == str(out.absolute())
    assert row["cast_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert row["targets"] == ["eager", "cuda-graphs"]
    eager, graphs = row["checks"]
    assert eager["target"] == "eager" and eager["speedup"] == 1.08 and eager["speedup_ci"] == [1.05, 1.12]
    assert eager["eager_ms"] == 4.0 and eager["cast_ms"] == 3.7 and eager["rel_l2_err"] == 2e-4
    assert sorted(eager["kept"]) == sorted([gn, relu]) and eager["dropped"] == []
    [one] = graphs["kept"]  # the variant with the most net gain (confirmation ranks relu first)
    assert graphs["speedup"] == 1.21 and one == relu
    [dropped] = graphs["dropped"]
    assert dropped["id"] == gn and "slower" in dropped["reason"] and "0.950x" in dropped["reason"]
    served = {v["id"]: v["targets"] for v in row["variants"]}
    assert served == {relu: ["eager", "cuda-graphs"], gn: ["eager"]}
    assert row["env"]["gpu"] == "NVIDIA H200" and row["options"]["model_check"] is True
    assert row["started_at"] <= row["finished_at"]


def test_a_failed_export_says_so_and_what_each_target_refused(workspace, no_gpu_steps, capsys):
    no_gpu_steps["eager"] = lambda s: SLOWER
    out = workspace.parent / "slow.cast"
    code = engine.cli.main(["export", RUN, "--out", str(out), "--workspace", str(workspace)])
    assert code != 0 and not out.exists()
    [row] = exports(workspace)
    assert row["status"] == "failed" and "slower with the cast" in row["error"]
    assert row["cast_sha256"] is None and row["variants"] == []
    [eager] = row["checks"]
    assert "slower" in eager["refused"] and eager["kept"] == [] and len(eager["dropped"]) == 2
    assert eager["tried"][0]["speedup"] == 0.95  # the sets it tried, as the check returned them


def test_ctrl_c_during_the_export_leaves_one_whole_row_that_says_interrupted(workspace, no_gpu_steps):
    no_gpu_steps["eager"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        pkg.export_run(workspace, RUN, workspace.parent / "x.cast")
    [row] = exports(workspace)
    assert row["status"] == "interrupted" and row["cast_sha256"] is None and row["variants"] == []
    assert "Ctrl-C" in row["error"] and row["checks"][0]["kept"] == []
    assert not (workspace.parent / "x.cast").exists()


def test_no_model_check_is_recorded_as_not_measured(workspace, no_gpu_steps):
    result = pkg.export_run(workspace, RUN, workspace.parent / "n.cast", model_check=False)
    assert len(result.included) == 2
    [row] = exports(workspace)
    [check] = row["checks"]
    assert row["status"] == "written" and check["mode"] == "none" and "--no-model-check" in check["reason"]
    assert "speedup" not in check and all(v["targets"] is None for v in row["variants"])


def test_an_export_refused_before_it_found_its_run_writes_no_row(workspace, no_gpu_steps):
    with pytest.raises(Exception, match="no run"):
        pkg.export_run(workspace, "run-nosuch", workspace.parent / "x.cast")
    assert exports(workspace) == []


def test_a_workspace_that_cannot_take_the_row_keeps_the_cast_and_warns(workspace, no_gpu_steps, monkeypatch):
    no_gpu_steps["eager"] = lambda s: EAGER

    async def refuse(self, export):
        raise sqlite3.OperationalError("attempt to write a readonly database")
    monkeypatch.setattr(Store, "add_export", refuse)
    result = pkg.export_run(workspace, RUN, workspace.parent / "ro.cast")
    assert (workspace.parent / "ro.cast").exists()
    assert any("not recorded" in w for w in result.warnings)


def test_the_record_of_a_check_that_broke_keeps_every_variant_for_that_target():
    class V:
        def __init__(self, name):
            self.vid, self.card, self.targets, self.confirmed = name, {"op": "aten::relu", "card_id": name}, \
                ["eager"], {"speedup": 1.3}
    log = pkg.ExportLog(Path("m.cast"), ["eager"], {"model_check": True}, run_id="run-1")
    log.source["model_checks"] = {"eager": {"mode": "failed", "reason": "export: the check failed: OOM"}}
    log.checked, log.kept, log.cast_sha256 = ["a"], [V("a")], "ab" * 32
    row = pkg.export_record(log, "written", None)
    assert row["checks"] == [{"target": "eager", "mode": "failed", "reason": "export: the check failed: OOM",
                              "kept": ["a"], "dropped": []}]


@pytest.mark.parametrize("fixture", ["tests/fixtures/resnet50-h200-run.db"])  # the demo is at the latest schema now
def test_an_old_workspace_opens_takes_an_export_and_its_reader_sees_none_before(tmp_path, fixture):
    ws = tmp_path / "old"
    ws.mkdir()
    shutil.copy(ROOT / fixture, db_path(ws))
    conn = open_readonly(db_path(ws))  # a viewer never migrates: no table yet, and no error
    run_id = read.latest_run(conn)["id"]
    assert conn.execute("PRAGMA user_version").fetchone()[0] < latest_version()
    assert read.exports(conn, run_id) == [] and read.latest_export(conn, run_id) is None
    conn.close()

    async def write():
        async with await Store.open(db_path(ws)) as s:
            await s.add_export({"run_id": run_id, "started_at": 1.0, "finished_at": 2.0, "status": "failed",
                                "out_path": "/x.cast", "targets": ["eager"], "error": "test row"})
            return await s.exports(run_id)
    [row] = asyncio.run(write())
    assert row["status"] == "failed" and row["targets"] == ["eager"] and row["checks"] == []
    conn = open_readonly(db_path(ws))
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == latest_version()
        assert read.latest_export(conn, run_id)["error"] == "test row"
        assert read.candidates(conn, run_id)  # what the run held is still there
    finally:
        conn.close()


_EXPORT_READ_ONLY = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import pytest
import test_export_record as t
from engine.cli import main

patch = pytest.MonkeyPatch()
t.no_gpu_steps.__wrapped__(patch)["eager"] = lambda s: t.EAGER
sys.exit(main(["export", t.RUN, "--workspace", sys.argv[1], "--out", sys.argv[2], "--no-graph-routes",
               "--no-layout-routes"]))
"""


def test_a_read_only_workspace_exports_with_a_warning(tmp_path):
    # Export refused it ("workspace ... is not writable") before looking its run up, while docs/cast.md says the
    # cast is written and export warns that the workspace could not take its row. The GPU steps are injected.
    from test_tui_readonly_workspace import _read_only

    ws = build_workspace(tmp_path / "ws", tmp_path / "toy.toml")
    with sqlite3.connect(db_path(ws)) as conn:  # as an engine leaves it: the WAL folded in, no -wal / -shm
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    script = tmp_path / "export.py"
    script.write_text(_EXPORT_READ_ONLY.format(root=str(ROOT), tests=str(ROOT / "tests")))
    r = _read_only(ws, [sys.executable, str(script), str(ws), str(tmp_path / "ro.cast")])
    assert r.returncode == 0, r.stderr
    assert "wrote " in r.stdout and (tmp_path / "ro.cast").is_file()
    assert "warning: the export was not recorded in the workspace" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert exports(ws) == []
