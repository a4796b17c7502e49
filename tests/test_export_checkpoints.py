"""An export keeps what it finished: the fresh-process confirmation and each target's whole-model check are
checkpointed in the workspace (export-checkpoints/), a later export with the same inputs reuses them and runs
only what is missing, `--fresh` reuses none, and an export interrupted after some targets writes the cast of
those (exit 75) with one line saying how to finish it.

No GPU here: the real exporter runs (store, NVRTC, packaging, the cast on disk) with the two GPU steps
replaced by stand-ins that count their calls (test_export_record.py does the same). The numbers are made up;
none is a measurement."""

from __future__ import annotations

import shlex
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cast_helpers import H200_ENV, relu_card
from conftest import ROOT
from test_export_record import (
    EAGER,
    GRAPHS,
    RUN,
    SLOWER,
    build_workspace,
    exports,
    injected_check,
    injected_confirm,
)

import engine.cast.compat
import engine.cli
from engine.cast.format import read_cast
from engine.errors import JobError
from engine.export import package as pkg
from engine.export.checkpoint import FOLDER
from engine.store import db_path


@pytest.fixture
def ws(tmp_path):
    return build_workspace(tmp_path / "ws", tmp_path / "toy.toml")


class Gpu:
    """The two GPU steps, answering with injected results and counting their calls: `model` maps a target
    to what its check returns for a set (or an exception to raise when that target is reached)."""

    def __init__(self) -> None:
        self.model: dict = {}
        self.confirms = 0
        self.checks: dict[str, int] = {}

    def confirm(self, cast_path, samples, timing, tmp, timeout_s=1800):
        self.confirms += 1
        return injected_confirm(samples)

    def check(self, cast_path, sets, config, small, graphs, tmp, timeout_s=1800, target=None):
        self.checks[target] = self.checks.get(target, 0) + 1
        return injected_check(self.model[target], target, sets)


@pytest.fixture
def gpu(monkeypatch):
    g = Gpu()
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(engine.cast.compat, "current_env", lambda: dict(H200_ENV))
    monkeypatch.setattr(pkg, "run_confirm", g.confirm)
    monkeypatch.setattr(pkg, "run_model_check", g.check)
    return g


def export(ws: Path, targets: str, fresh: bool = False) -> tuple[pkg.ExportResult, list[str]]:
    lines: list[str] = []
    result = pkg.export_run(ws, RUN, ws.parent / "toy.cast", targets=targets.split(","), progress=lines.append,
                            fresh=fresh)
    return result, lines


def test_a_second_export_reuses_the_finished_targets_and_checks_only_the_missing_one(ws, gpu):
    gpu.model.update(eager=lambda s: EAGER, **{"cuda-graphs": lambda s: GRAPHS})
    first, _ = export(ws, "eager")
    assert (gpu.confirms, gpu.checks) == (1, {"eager": 1})
    second, lines = export(ws, "eager,cuda-graphs")
    assert (gpu.confirms, gpu.checks) == (1, {"eager": 1, "cuda-graphs": 1})  # only the new target ran
    said = "\n".join(lines)
    # Each line names when its own checkpoint was written: the confirmation and the check can fall in
    # different seconds (on a loaded CI machine they did), so each stamp is read from its own line.
    assert f"the fresh-process confirmation of {_stamp(said, 'the fresh-process confirmation')} reused " \
           f"(checkpoint {FOLDER}/confirm-" in said
    assert (f"target eager: the whole-model check of {_stamp(said, 'target eager: the whole-model check')} reused "
            f"(checkpoint {FOLDER}/check-eager-" in said and "): kept 2 variant(s): 1.080x (95% CI 1.050-1.120)" in said)
    assert "confirming 2 variant(s) in a fresh process" not in said
    # The reused check is the one measured before: the same numbers in the cast, the same variants kept.
    assert second.model_checks["eager"] == first.model_check
    assert [v["targets"] for v in second.included] == [["eager", "cuda-graphs"]] * 2
    assert [v["speedup_ci"] for v in second.included] == [v["speedup_ci"] for v in first.included]


def test_a_refused_target_is_reused_as_refused(ws, gpu):
    gpu.model.update(eager=lambda s: EAGER, **{"cuda-graphs": lambda s: SLOWER})
    export(ws, "eager,cuda-graphs")
    result, lines = export(ws, "eager,cuda-graphs")
    assert gpu.checks == {"eager": 1, "cuda-graphs": 1}
    assert "refused" in result.model_checks["cuda-graphs"] and "slower" in result.model_checks["cuda-graphs"]["refused"]
    assert any(ln.startswith("target cuda-graphs: the whole-model check of ") and "refused (export:" in ln
               for ln in lines)
    assert all(v["targets"] == ["eager"] for v in result.included)
    gpu.model["eager"] = lambda s: SLOWER  # a refusal of the only target stays a refusal: nothing written
    with pytest.raises(JobError, match="slower"):
        export(ws, "cuda-graphs")
    assert gpu.checks["cuda-graphs"] == 1


def _edit_config(ws: Path) -> None:
    config = ws.parent / "toy.toml"
    config.write_text(config.read_text() + "# batch = 8\n")


def _edit_a_source(ws: Path) -> None:
    conn = sqlite3.connect(db_path(ws))
    with conn:
        conn.execute("UPDATE candidates SET source = source || '\n// edited' WHERE card_id = ?",
                     (relu_card()["card_id"],))
    conn.close()


@pytest.mark.parametrize("change, confirms_again", [(_edit_config, False), (_edit_a_source, True)])
def test_a_changed_input_is_measured_again(ws, gpu, change, confirms_again):
    gpu.model["eager"] = lambda s: EAGER
    export(ws, "eager")
    change(ws)
    _, lines = export(ws, "eager")
    assert gpu.checks == {"eager": 2}
    assert gpu.confirms == (2 if confirms_again else 1)  # the config is not the confirmation's input
    assert not any("whole-model check of" in ln and "reused" in ln for ln in lines)
    export(ws, "eager")  # the new inputs' checkpoints are reused in turn
    assert gpu.checks == {"eager": 2}


def test_fresh_reuses_no_checkpoint(ws, gpu, capsys):
    gpu.model["eager"] = lambda s: EAGER
    argv = ["export", RUN, "--out", str(ws.parent / "toy.cast"), "--workspace", str(ws)]
    assert engine.cli.main(argv) == 0
    assert engine.cli.main(argv + ["--fresh"]) == 0
    assert (gpu.confirms, gpu.checks) == (2, {"eager": 2})
    assert engine.cli.main(argv) == 0  # what --fresh measured is a checkpoint again
    assert (gpu.confirms, gpu.checks) == (2, {"eager": 2})
    assert exports(ws)[0]["options"]["fresh"] is False and exports(ws)[1]["options"]["fresh"] is True


def test_an_export_interrupted_after_one_of_two_targets_writes_that_target_and_says_how_to_finish(ws, gpu, capsys):
    gpu.model.update(eager=lambda s: EAGER, **{"cuda-graphs": KeyboardInterrupt()})
    out = ws.parent / "toy.cast"
    code = engine.cli.main(["export", "--out", str(out), "--target", "eager,cuda-graphs", "--workspace", str(ws)])
    stdout, stderr = capsys.readouterr()
    assert code == pkg.EXIT_PARTIAL == 75
    assert f"wrote {out}: 2 variant(s)" in stdout and "proven for: eager\n" in stdout
    [line] = [ln for ln in stderr.splitlines() if ln.startswith("interrupted")]
    assert line.startswith(f"interrupted: wrote a partial cast {out}, proven for eager only; not checked: "
                           "cuda-graphs; the same export again checks only those")
    command = line.split(": ", 1)[1].rsplit(": ", 1)[1]
    assert command == shlex.join(["kforge-tui", "export", RUN, "--workspace", str(ws), "--out", str(out),
                                  "--target", "eager,cuda-graphs"])
    cast = read_cast(out)
    assert [v["targets"] for v in cast.variants] == [["eager"], ["eager"]]
    assert list(cast.manifest["source"]["model_checks"]) == ["eager"]
    [row] = exports(ws)
    assert row["status"] == "written" and [c["mode"] for c in row["checks"]] == ["eager", "not reached"]
    # The command it names finishes the export: the eager check is reused, cuda-graphs runs.
    gpu.model["cuda-graphs"] = lambda s: GRAPHS
    assert engine.cli.main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    assert gpu.checks == {"eager": 1, "cuda-graphs": 2} and gpu.confirms == 1
    assert [v["targets"] for v in read_cast(out).variants] == [["eager", "cuda-graphs"]] * 2


def test_an_export_interrupted_before_any_target_kept_a_variant_writes_nothing_and_keeps_its_checkpoints(
        ws, gpu, capsys):
    gpu.model.update(eager=lambda s: SLOWER, **{"cuda-graphs": KeyboardInterrupt()})
    out = ws.parent / "toy.cast"
    argv = ["export", "--out", str(out), "--target", "eager,cuda-graphs", "--workspace", str(ws)]
    assert engine.cli.main(argv) == 130
    assert "interrupted; nothing half-written was kept" in capsys.readouterr().err and not out.exists()
    assert exports(ws)[0]["status"] == "interrupted"
    gpu.model["cuda-graphs"] = lambda s: GRAPHS
    assert engine.cli.main(argv) == 0
    assert gpu.confirms == 1 and gpu.checks == {"eager": 1, "cuda-graphs": 2}


def test_a_workspace_that_cannot_take_checkpoints_still_exports_and_warns(ws, gpu):
    (ws / FOLDER).write_text("a file in the way")
    gpu.model["eager"] = lambda s: EAGER
    result, _ = export(ws, "eager")
    assert (ws.parent / "toy.cast").exists()
    assert any(w.startswith(f"checkpoints not written to {ws / FOLDER}") for w in result.warnings)


def _stamp(text: str, line_start: str) -> str:
    """The UTC time the progress line starting with `line_start` gives its checkpoint."""
    import re

    found = re.search(re.escape(line_start) + r" of (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC) reused", text)
    assert found, f"no line {line_start!r} … reused in:\n{text}"
    return found.group(1)


# A separate process, since the signal is real: the whole-model check of cuda-graphs starts a child that starts
# a grandchild, writes both pids, and sends the export SIGTERM (what `timeout` sends).
SIGTERM_RUNNER = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
import engine.cast.compat, engine.cli
from engine.export import package as pkg
from cast_helpers import H200_ENV

torch.cuda.is_available = lambda: True
engine.cast.compat.current_env = lambda: dict(H200_ENV)
pkg.run_confirm = lambda cast, samples, timing, tmp, timeout_s=1800: {{"env": {{}}, "variants": {{
    v: {{"ok": True, "speedup": 1.5, "speedup_ci": [1.4, 1.6], "net_us": 1.0}} for v in samples}}}}
CHILD = '''
import os, signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open({pids!r}, "w") as f:
    f.write(f"{{os.getpid()}} {{grandchild.pid}}")
os.kill(os.getppid(), signal.SIGTERM)
time.sleep(120)
'''

def check(cast, sets, config, small, graphs, tmp, timeout_s=1800, target=None):
    if target == "cuda-graphs":
        pkg._run_child([sys.executable, "-c", CHILD], 120)
    return {{"mode": target, "tried": [], "chosen": {{"variants": sets[0], "speedup": 1.1, "speedup_ci": [1.05, 1.15],
                                                      "eager_ms": 4.0, "cast_ms": 3.6, "rel_l2_err": 2e-4}}}}

pkg.run_model_check = check
sys.exit(engine.cli.main(["export", "--out", {out!r}, "--target", "eager,cuda-graphs", "--workspace", {ws!r}]))
"""


def _gone(pid: int) -> bool:
    """Whether a process has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_sigterm_during_a_check_stops_its_processes_and_writes_the_finished_targets(ws, tmp_path):
    out, pids = tmp_path / "toy.cast", tmp_path / "pids"
    runner = tmp_path / "runner.py"
    runner.write_text(SIGTERM_RUNNER.format(root=str(ROOT), tests=str(ROOT / "tests"), pids=str(pids), out=str(out),
                                            ws=str(ws)))
    r = subprocess.run([sys.executable, str(runner)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 75, r.stderr
    assert f"interrupted: wrote a partial cast {out}, proven for eager only; not checked: cuda-graphs" in r.stderr
    assert all(v["targets"] == ["eager"] for v in read_cast(out).variants)
    child, grandchild = map(int, pids.read_text().split())
    assert _gone(child) and _gone(grandchild)


def test_sigterm_outside_an_export_is_left_as_it_was():
    from engine.run.interrupt import sigterm_raises

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_raises():
        pass
    assert signal.getsignal(signal.SIGTERM) == before


def test_after_a_sigterm_stopped_an_export_a_second_one_is_ignored():
    # The process is stopping: `timeout`'s second SIGTERM (to the process group) must not end it before the
    # line saying what was kept (engine.run.interrupt.ignore_further_sigterm).
    from engine.run.interrupt import Terminated, sigterm_raises

    before = signal.getsignal(signal.SIGTERM)
    try:
        with sigterm_raises(), pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # would end pytest with SIGTERM's default
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_check_made_under_an_earlier_rule_is_made_again(ws, gpu, monkeypatch):
    """A compile target's check kept a set measured in one process before ab162f2; such a checkpoint must not
    stand in for the check that now measures it in two."""
    gpu.model.update(eager=lambda s: EAGER)
    monkeypatch.setattr(pkg, "MODEL_CHECK_RULE", 1)
    export(ws, "eager")
    monkeypatch.setattr(pkg, "MODEL_CHECK_RULE", 2)
    _, lines = export(ws, "eager")
    assert gpu.checks == {"eager": 2}
    assert not any("the whole-model check of" in ln and "reused" in ln for ln in lines)
    export(ws, "eager")
    assert gpu.checks == {"eager": 2}  # the same rule: reused


def test_a_refused_target_is_said_when_it_is_refused_not_only_when_the_export_ends(ws, gpu):
    """Warnings are printed when the export ends; the SD3.5 VAE's export, stopped by its time limit after its
    reduce-overhead check (H100, 2026-12-05g), left no line saying how that check ended."""
    gpu.model.update(eager=lambda s: EAGER, **{"cuda-graphs": lambda s: SLOWER})
    result, lines = export(ws, "eager,cuda-graphs")
    said = [m for m in lines if m.startswith("target cuda-graphs: nothing kept: ")]
    assert len(said) == 1 and "slower" in said[0]
    assert any(w.startswith("target cuda-graphs: ") for w in result.warnings)


def test_a_whole_model_check_that_broke_is_said_as_it_happens(ws, gpu):
    from engine.errors import JobError

    def broke(s):
        raise JobError("export: the whole-model check failed (exit 1): CUDA out of memory")

    gpu.model.update(eager=lambda s: EAGER, **{"cuda-graphs": broke})
    result, lines = export(ws, "eager,cuda-graphs")
    assert "whole-model check (CUDA-graph replays) broke: export: the whole-model check failed (exit 1): CUDA out " \
           "of memory" in lines
    assert any("the cast is written without a whole-model check" in w for w in result.warnings)
