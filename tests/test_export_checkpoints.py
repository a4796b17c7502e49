"""An export keeps what it finished: the fresh-process confirmation and each target's whole-model check are
checkpointed in the workspace (export-checkpoints/), a later export with the same inputs reuses them and runs
only what is missing, `--fresh` reuses none, and an export interrupted after some targets writes the cast of
those (exit 75) with one line saying how to finish it.

No GPU here: the real exporter runs (store, NVRTC, packaging, the cast on disk) with the two GPU steps
replaced by stand-ins that count their calls (test_export_record.py does the same), and the graph-route check
(on by default from the CLI; test_export_graph_routes.py tests it) by one that finds no class: its fresh
process, with no GPU to find, took 5 s of every CLI export here. The numbers are made up; none is a
measurement."""

from __future__ import annotations

import re
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
        self.confirmed: list[list[str]] = []   # the variants each confirmation was asked for
        self.checks: dict[str, int] = {}

    def confirm(self, cast_path, samples, timing, tmp, timeout_s=1800, only=None, on_variant=None):
        self.confirms += 1
        self.confirmed.append(sorted(samples))
        return injected_confirm(samples)

    def check(self, cast_path, sets, config, small, graphs, tmp, timeout_s=1800, target=None):
        self.checks[target] = self.checks.get(target, 0) + 1
        return injected_check(self.model[target], target, sets)

    def graphs(self, cast_path, config, small, tmp, timeout_s=1800):
        return {"tried": [], "chosen": None}


@pytest.fixture
def gpu(monkeypatch):
    g = Gpu()
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(engine.cast.compat, "current_env", lambda: dict(H200_ENV))
    monkeypatch.setattr(pkg, "run_confirm", g.confirm)
    monkeypatch.setattr(pkg, "run_model_check", g.check)
    monkeypatch.setattr(pkg, "run_graph_check", g.graphs)
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
    assert re.search(r"the fresh-process confirmation of 2 of 2 variant\(s\) reused \(checkpoints of "
                     rf"{STAMP}( to {STAMP})? in {FOLDER}\)", said), said
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


def test_an_export_stopped_during_the_confirmation_keeps_the_variants_it_confirmed(ws, gpu, monkeypatch):
    # 2026-12-06b (H100): an export cut off by its time limit after 146 s of confirming 27 variants kept nothing of
    # it, and the next one confirmed all 27 again (190 s)
    def stopped_after_one(cast_path, samples, timing, tmp, timeout_s=1800, only=None, on_variant=None):
        gpu.confirms += 1
        gpu.confirmed.append(sorted(samples))
        first = sorted(samples)[0]
        on_variant(first, {"ok": True, "speedup": 1.5, "speedup_ci": [1.4, 1.6], "net_us": 2.0}, {"gpu": "stand-in"})
        raise KeyboardInterrupt

    monkeypatch.setattr(pkg, "run_confirm", stopped_after_one)
    gpu.model["eager"] = lambda s: EAGER
    out = ws.parent / "toy.cast"
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        pkg.export_run(ws, RUN, out, targets=["eager"], progress=lines.append)
    both = gpu.confirmed[0]
    assert f"confirmed 1/2: {both[0]} (1.50x)" in lines and not out.exists()
    monkeypatch.setattr(pkg, "run_confirm", gpu.confirm)
    argv = ["export", "--out", str(out), "--target", "eager", "--workspace", str(ws)]
    _, lines = export(ws, "eager")
    assert gpu.confirmed == [both, both[1:]]   # only the variant not yet confirmed ran again
    said = "\n".join(lines)
    assert "the fresh-process confirmation of 1 of 2 variant(s) reused" in said
    assert "confirming 1 variant(s) in a fresh process" in said
    assert sorted(v["id"] for v in read_cast(out).variants) == both
    assert engine.cli.main(argv) == 0 and len(gpu.confirmed) == 2   # all confirmed now: nothing runs again


def test_the_wait_for_a_fresh_process_reads_what_it_finished_as_it_goes(tmp_path, monkeypatch):
    # the exporter polls while it waits (progress, checkpoints), once more after the child ended or was stopped
    log = tmp_path / "log"
    child = ("import sys, time\n"
             f"for i in range(3):\n    open({str(log)!r}, 'a').write(str(i)); time.sleep(0.3)\n"
             "time.sleep(60)\n")
    seen = []
    monkeypatch.setattr(pkg, "POLL_S", 0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        pkg._run_child([sys.executable, "-c", child], 3, on_poll=lambda: seen.append(log.read_text()
                                                                                   if log.exists() else ""))
    assert seen[-1] == "012" and any(s and s != "012" for s in seen), seen   # before the end, and after
    proc = pkg._run_child([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], 60,
                          on_poll=lambda: None)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "out\n", "err\n")


def test_run_confirm_hands_each_finished_variant_over_once(tmp_path, monkeypatch):
    from engine.export.confirm import partial_path

    def child(argv, timeout_s, env=None, on_poll=None):
        out = Path(argv[argv.index("--out") + 1])
        partial = partial_path(out)
        for done in ({"a": {"ok": True}}, {"a": {"ok": True}, "b": {"ok": False, "reason": "slower"}}):
            partial.write_text(__import__("json").dumps({"env": {"gpu": "g"}, "variants": done}))
            on_poll()
            on_poll()
        out.write_text('{"env": {"gpu": "g"}, "variants": {}}')
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(pkg, "_run_child", child)
    got = []
    pkg.run_confirm(tmp_path / "x.cast", {}, {}, tmp_path, on_variant=lambda *a: got.append(a))
    assert got == [("a", {"ok": True}, {"gpu": "g"}), ("b", {"ok": False, "reason": "slower"}, {"gpu": "g"})]


def test_the_confirmation_process_writes_each_variant_as_it_is_final(tmp_path, monkeypatch):
    from engine.export import confirm as confirm_mod

    def fake(cast, samples, timing, gate_host=True, only=None, on_variant=None):
        assert only == ["b"]
        on_variant("b", {"ok": True}, {"gpu": "g"})
        assert confirm_mod.partial_path(tmp_path / "r.json").read_text() == \
            '{"env": {"gpu": "g"}, "variants": {"b": {"ok": true}}}'
        return {"env": {"gpu": "g"}, "variants": {"b": {"ok": True}}}

    monkeypatch.setattr(confirm_mod, "confirm", fake)
    (tmp_path / "job.json").write_text('{"samples": {}, "timing": {}, "only": ["b"]}')
    assert confirm_mod.main(["--cast", "c", "--job", str(tmp_path / "job.json"), "--out", str(tmp_path / "r.json")]) == 0


def test_a_workspace_that_cannot_take_checkpoints_still_exports_and_warns(ws, gpu):
    (ws / FOLDER).write_text("a file in the way")
    gpu.model["eager"] = lambda s: EAGER
    result, _ = export(ws, "eager")
    assert (ws.parent / "toy.cast").exists()
    assert any(w.startswith(f"checkpoints not written to {ws / FOLDER}") for w in result.warnings)


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"   # a checkpoint's time as progress shows it


def _stamp(text: str, line_start: str) -> str:
    """The UTC time the progress line starting with `line_start` gives its checkpoint."""
    found = re.search(re.escape(line_start) + rf" of ({STAMP}) reused", text)
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
pkg.run_confirm = lambda cast, samples, timing, tmp, timeout_s=1800, **kw: {{"env": {{}}, "variants": {{
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


def test_a_child_that_prints_bytes_no_codec_reads_is_still_read(tmp_path):
    proc = pkg._run_child([sys.executable, "-c", "import sys; sys.stderr.buffer.write(b'bad \\xff byte\\n')"], 60)
    assert proc.returncode == 0 and proc.stderr.startswith("bad ") and proc.stderr.endswith(" byte\n")
