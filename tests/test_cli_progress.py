"""Headless progress (issue 25): in place on a terminal, one JSON line per event otherwise, "compiled N" in
a dry run; --wall-time counts the whole run."""

from __future__ import annotations

import io
import json
from pathlib import Path

from engine.progress import StageProgress

ROOT = Path(__file__).resolve().parents[1]
MY_MODEL = str(ROOT / "configs/examples/my_model.toml")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_lines_off_a_terminal_and_no_repeats():
    out = io.StringIO()
    p = StageProgress(out)
    assert p.json_lines
    p.stage("capture", "warm-up forward")
    p.stage("capture", "warm-up forward")  # nothing new: no new line
    p.update("search", completed=3, total=10, compiled=3)
    p.done("capture")
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["stage", "progress", "stage_done"]
    assert lines[0]["stage"] == "capture" and lines[1]["compiled"] == 3


def test_a_terminal_gets_bars_not_json():
    out = _Terminal()
    p = StageProgress(out)
    assert not p.json_lines
    p.stage("capture", "warm-up forward")
    p.done("capture", "my_model: captured")
    p.update("search", completed=2, total=4, message="compiled 2 · verified 0 · failed 0")
    p.close()
    text = out.getvalue()
    assert "capture" in text and "search" in text and "compiled 2" in text and "2/4" in text
    assert '"event"' not in text


def test_a_dry_run_says_compiled_n_as_it_goes(cli, tmp_path):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--device", "cpu",
                         "--iterations", "2", "--json", "--workspace", tmp_path)
    assert code == 0, err
    events = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    stages = [e["stage"] for e in events if e["event"] == "stage"]
    assert "capture" in stages
    evaluated = [e for e in events if e["event"] == "evaluated"]
    assert evaluated and evaluated[-1]["counts"]["compiled"] == len(evaluated)
    assert [e["counts"]["compiled"] for e in evaluated] == list(range(1, len(evaluated) + 1))


def test_wall_time_counts_the_capture_too(cli, tmp_path):
    # The capture alone takes longer than a millisecond, so no time is left for the search.
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--device", "cpu",
                         "--wall-time", "0.001", "--json", "--workspace", tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["stopped_by"] == "wall_time" and doc["proposals"] == 0
    # ... and the run says so, with a wall time that would leave a search (run_examples_gpu.sh's 45 s default
    # searched nothing on an H200 and said only "nothing proposed: of 41 card(s), 23 declined, 18 open").
    said = doc["nothing_proposed"]
    assert "the --wall-time of 0.001 s was spent before the search began" in said, said
    assert "give it more, e.g. --wall-time " in said and f"kforge: {said}" in err
    # The same sentence is a run event, which the TUI's overview shows (an attached user sees no stderr).
    import sqlite3

    from engine.store import db_path

    conn = sqlite3.connect(db_path(tmp_path))
    try:
        notes = [json.loads(p)["message"] for (p,) in conn.execute("SELECT payload FROM events WHERE kind = 'run_note'")]
    finally:
        conn.close()
    assert notes == [said]


def test_the_overview_shows_a_run_note_whole_in_lines_that_fit():
    from kforge_tui.readmodel import EventRow
    from kforge_tui.screens.overview import _note_lines

    said = ("nothing proposed: of 41 card(s), 23 declined, 18 open; the --wall-time of 45 s was spent before the "
            "search began (80 s on capture, eager and reference timing): give it more, e.g. --wall-time 200")
    e = EventRow(7, 1796218861.0, "run_note", None, {"message": said})
    lines = [ln.plain for ln in _note_lines(e, 76)]
    assert len(lines) > 1 and all(len(ln) <= 76 for ln in lines)
    assert " ".join(ln[9:].strip() for ln in lines) == said and lines[0].startswith("13:41:01 ")


def test_help_says_what_wall_time_counts():
    from engine.cli import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "run" in a.choices)
    text = " ".join(sub.choices["run"].format_help().split())
    assert "whole run" in text and "capture and eager timing count" in text and "references" in text


# ---- the final table on an 80-column terminal ---------------------------------------------------------------


def _final_table(doc: dict, width: int) -> str:
    from rich.console import Console

    from engine.run.report import print_final_table

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    print_final_table(doc, console)
    return console.export_text()


def _timed_doc() -> dict:
    card = {"op": "aten::native_layer_norm", "id": "0cb9f661090757de", "calls": 1200, "eager_us": 1234.5,
            "best_us": 876.25, "speedup": 1.41, "speedup_ci": [1.38, 1.44], "candidates": 14, "compiled": 13,
            "verified": 12, "failures": {"cheating": 1, "nan": 1}, "stopped": "iterations"}
    other = {**card, "op": "aten::convolution_backward", "id": "1111e29faa46b29a", "best_us": None,
             "speedup": None, "speedup_ci": None, "verified": 0, "failures": {"compile": 1}}
    return {"run": "run-0123456789ab", "status": "done", "stopped_by": "iterations", "cards": [card, other],
            "tokens": 0, "cost_usd": 0.0, "proposals": 28, "evaluations": 28}


def test_the_cards_left_on_eager_say_why_in_words():
    # It said "cards left on eager: 3 declined, 1 noise": what noise meant was nowhere on the screen.
    doc = _timed_doc()
    skipped = {"candidates": 0, "compiled": 0, "verified": 0, "failures": {}, "best_us": None, "speedup": None,
               "speedup_ci": None, "eager_us": None, "calls": 1}
    doc["cards"] += [{**skipped, "op": "aten::addmm", "id": "2" * 16, "stopped": "declined"},
                     {**skipped, "op": "aten::relu", "id": "3" * 16, "stopped": "noise"}]
    # One line also in a log 160 columns wide (a terminal wraps it where it must).
    line = next(ln for ln in _final_table(doc, 160).splitlines() if ln.startswith("cards left on eager"))
    assert line == ("cards left on eager: 1 declined (the proposer has nothing for this op), 1 noise (too small "
                    "to matter: below the noise floor or the minimum share of the model's time)")


def test_the_title_of_a_dry_runs_table_is_one_line_in_a_log():
    # Off a terminal (160 columns) it was the table's title, centred and wrapped at the five narrow columns:
    # "run run-…: done (every card finished before its iterations: 3" / "declined, 3 exhausted, 1 noise)".
    card = {"op": "aten::gelu", "id": "749b69d5ee82bb88", "calls": 24, "eager_us": None, "best_us": None,
            "speedup": None, "speedup_ci": None, "candidates": 14, "compiled": 14, "verified": 0, "failures": {},
            "stopped": "exhausted"}
    doc = {"run": "run-3827ffdcec23", "status": "done", "stopped_by": "iterations",
           "cards": [card, {**card, "id": "9d706e29faa46b29"}, {**card, "id": "0cb9f661090757de"}],
           "tokens": 0, "cost_usd": 0.0, "proposals": 38, "evaluations": 35}
    lines = _final_table(doc, 160).splitlines()
    assert lines[0] == "run run-3827ffdcec23: done (every card finished before its iterations: 3 exhausted)"
    assert lines[1].startswith("┏") and sum("aten::gelu" in ln for ln in lines) == 3


def test_the_final_table_shows_every_number_whole_at_80_columns():
    text = _final_table(_timed_doc(), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if line.startswith("op "))
    for col in ("card", "calls", "eager", "best", "speedup (95% CI)", "cand", "comp", "ver"):
        assert col in header, header
    row = next(line for line in text.splitlines() if line.startswith("native_layer_norm"))
    for cell in ("0cb9f661", "1200", "1234.5", "876.2", "1.41× (1.38–1.44)", "14", "13", "12"):
        assert cell in row, row
    assert "…" not in text
    assert "native_layer_norm 0cb9f661: cheating 1, nan 1" in text  # failures by category, below the table
    assert "convolution_backward 1111e29f: compile 1" in text


def test_a_dry_runs_final_table_says_compiled_at_80_columns(cli, tmp_path):
    code, out, err = cli("run", MY_MODEL, "--small", "--dry-run", "--no-tui", "--device", "cpu",
                         "--iterations", "2", "--json", "--workspace", tmp_path)
    assert code == 0, err
    text = _final_table(json.loads(out), 80)
    header = next(line for line in text.splitlines() if line.startswith("op "))
    # Nothing was timed: no columns of dashes; what a dry run did is in words a user reads.
    assert header.split() == ["op", "card", "calls", "cand", "compiled"], header
    row = next(line for line in text.splitlines() if line.startswith("gelu "))
    assert row.split()[-1] == "2", row
    assert "…" not in text


def test_at_80_columns_a_long_message_leaves_the_stage_bar_and_counts(monkeypatch):
    # The message took the line: 'sea… 12 evaluated, …' with the stage's name cut and no bar or counts.
    import re

    monkeypatch.setenv("COLUMNS", "80")
    out = _Terminal()
    p = StageProgress(out)
    p.update("search", completed=12, total=120, message="12 evaluated, 3 verified, best 14.1x on kforge::chain "
             "bf16[1,128,1024,1024] (group_norm + silu), 2 in flight")
    p.close()
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue().split("\r")[-1])
    line = next(x for x in frame.splitlines() if "evaluated" in x)
    assert "search" in line and "12/120" in line and "━" in line, line
    assert line.rstrip().endswith("…") and len(line.rstrip()) <= 80, line

SLOW_BUILD = '''
import time
import torch


def build(device, dtype):
    time.sleep(1.5)  # a builder that says nothing for a while (importing a library, filling weights)
    return torch.nn.Linear(8, 8).to(dtype), (torch.randn(2, 8, dtype=dtype),)
'''


def test_capture_on_a_terminal_moves_while_a_step_is_silent(tmp_path, monkeypatch, capsys):
    """`kforge-tui capture` on a terminal is a stage redrawn in place (spinner, elapsed time) several times a
    second, so a user sees it move while a step says nothing; the last line says what was captured."""
    import sys

    from engine.cli import main

    (tmp_path / "slow.py").write_text(SLOW_BUILD)
    (tmp_path / "slow.toml").write_text('name = "slow"\nbuilder = "slow.py:build"\n')
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["capture", str(tmp_path / "slow.toml"), "--device", "cpu", "--workspace", str(tmp_path)]) == 0
    text = term.getvalue()
    assert text.count("building slow on cpu") >= 2  # redrawn during the silent build
    import re

    last = " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).split("\r")[-1].split())  # the last frame
    # whole, though an 80-column line wraps it
    assert "slow: 1 cards and 0 chain cards, captured in" in last and '"event"' not in text
    assert "aten::addmm" in capsys.readouterr().out  # the cards table, on stdout as before


def test_capture_off_a_terminal_keeps_stderr_for_errors(cli, tmp_path):
    code, out, err = cli("capture", MY_MODEL, "--small", "--device", "cpu", "--workspace", tmp_path)
    assert code == 0 and err == "" and "aten::" in out


def test_progress_lines_reach_a_log_only_when_asked(monkeypatch, capsys):
    """Off a terminal stderr keeps to errors (a failure is one line there), unless KFORGE_PROGRESS=1 asks
    for progress lines in the log: reproduce.py does, so an export its time limit stopped (the SD3.5 VAE's,
    H200 2026-12-02, after 270 s with nothing in its log) says how far it got."""
    from engine.progress import PROGRESS_ENV, stderr_progress

    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stderr_progress()("confirming 13 variant(s) in a fresh process")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(PROGRESS_ENV, "1")
    show = stderr_progress()
    show("confirming 13 variant(s) in a fresh process")
    assert capsys.readouterr().err == "kforge: +0s confirming 13 variant(s) in a fresh process\n"
    # each line in a log says when it came: where a long export's time went
    import re
    import time
    time.sleep(1.1)
    show("whole-model check")
    m = re.fullmatch(r"kforge: \+(\d+)s whole-model check\n", capsys.readouterr().err)
    assert m and int(m.group(1)) >= 1


def test_reproduce_asks_its_steps_for_progress_lines(tmp_path, monkeypatch):
    import subprocess

    from conftest import load_script

    rp = load_script("reproduce")
    seen = {}

    class Proc:
        def __init__(self, argv, **kw):
            seen.update(kw.get("env") or {})

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Proc)
    assert rp.step("export", None, ["true"], tmp_path / "log") == 0
    assert seen.get("KFORGE_PROGRESS") == "1"


async def test_the_steps_before_the_search_reach_the_runs_log_card_by_card(tmp_path):
    """Eager timing and the references take minutes on a large model (the SD3.5 VAE: 152 s for 13 cards) with
    no candidate to show yet: each card's progress is a 'stage' event of the run, which the TUI's log shows."""
    from types import SimpleNamespace

    from engine.progress import StageProgress
    from engine.run.command import _card_progress, _stage
    from engine.store import Store
    from kforge_tui.readmodel import EventRow
    from kforge_tui.screens.overview import _event_line

    out = io.StringIO()
    stages = StageProgress(out, json_lines=True)
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "bfloat16"}, [], [])
        run = await store.create_run("cap-1", "m", "builtin", {})
        await _stage(stages, store, run["id"], "eager", "timing eager PyTorch for 13 card(s)")
        report = _card_progress(stages, "eager", "eager timed", store, run["id"])
        await report(2, 13, SimpleNamespace(op="aten::native_group_norm"), {"load": 1.25, "measure": 4.5})
        events = [e for e in await store.events_since(run["id"], 0) if e["kind"] == "stage"]
    assert [e["payload"]["message"] for e in events] == [
        "timing eager PyTorch for 13 card(s)",
        "eager timed for 2/13 card(s); native_group_norm: load 1.2 s, measure 4.5 s"]
    assert events[1]["payload"]["completed"] == 2 and events[1]["payload"]["total"] == 13
    line = _event_line(EventRow(9, 1796218861.0, "stage", None, events[1]["payload"])).plain
    assert line == "13:41:01 eager: eager timed for 2/13 card(s); native_group_norm: load 1.2 s, measure 4.5 s"
    assert '"completed": 2' in out.getvalue()  # the terminal's JSON lines carry the counts too


async def test_the_search_bar_takes_a_card_that_ends_early_off_its_total():
    # The bar counted evaluations against cards × iterations: a card that ran out of revisions to try kept
    # its unused iterations in the total, the bar sat part of the way, then jumped to the end with the run.
    import re

    from test_orchestrator import ProgressRecorder, StandInLane, ThreeThenNothing, card, orchestrator

    from engine.run.orchestrator import Budgets
    from engine.run.report import Progress

    bars: list[tuple[int, int]] = []

    class Stages(StageProgress):
        def update(self, name, *, completed=None, total=None, message=None, **counts):
            bars.append((completed, total))
            super().update(name, completed=completed, total=total, message=message, **counts)

    out = _Terminal()
    progress = Progress(Stages(out))

    rec = ProgressRecorder(progress)
    o = rec.orchestrator = orchestrator([card("x"), card("y", 0.2)], ThreeThenNothing(), StandInLane(0.0), rec,
                                        budgets=Budgets(iterations_per_card=12), max_proposals=1)
    assert await o.run() == "iterations"
    progress.stages.close()
    used = o.cards["x"].iterations + o.cards["y"].iterations
    assert o.cards["x"].iterations < 12 and used < 24
    assert all(c <= t for c, t in bars) and [t for _, t in bars] == sorted((t for _, t in bars), reverse=True)
    assert any(t == used and c < used for c, t in bars), bars  # x's unused iterations left the total early
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue().split("\r")[-1])
    assert f"{used}/{used}" in next(x for x in frame.splitlines() if "search" in x), frame


async def test_a_search_stopped_by_its_budget_keeps_its_bar_where_it_stopped():
    # run_finished filled the bar whatever stopped the run: a search cut short by --max-tokens read as done.
    import re

    from test_orchestrator import ProgressRecorder, ScriptedProposer, StandInLane, card, orchestrator

    from engine.run.orchestrator import Budgets
    from engine.run.report import Progress

    out = _Terminal()
    progress = Progress(StageProgress(out))

    rec = ProgressRecorder(progress)
    o = rec.orchestrator = orchestrator([card("a")], ScriptedProposer(0.0, tokens=500), StandInLane(0.0), rec,
                                        budgets=Budgets(iterations_per_card=100, tokens=5_000), max_proposals=1)
    assert await o.run() == "tokens"
    progress.stages.close()
    used = o.cards["a"].iterations
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue().split("\r")[-1])
    assert 0 < used < 100 and f"{used}/100" in next(x for x in frame.splitlines() if "search" in x), frame


async def test_a_dry_runs_search_line_says_nothing_is_verified():
    # A dry run's line read 'verified 0 · failed 0' throughout: as if every candidate had yet to pass.
    import re

    from test_orchestrator import ProgressRecorder, ScriptedProposer, card, orchestrator

    from engine.lane.evaluate import Evaluation
    from engine.run.orchestrator import Budgets
    from engine.run.report import Progress

    async def compile_only(card_, proposal):
        return Evaluation("compiled", None, "", 0.01)

    out = _Terminal()
    progress = Progress(StageProgress(out), dry=True)

    rec = ProgressRecorder(progress)
    o = rec.orchestrator = orchestrator([card("a")], ScriptedProposer(0.0), compile_only, rec,
                                        budgets=Budgets(iterations_per_card=3), max_proposals=1)
    await o.run()
    progress.stages.close()
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue().split("\r")[-1])
    line = " ".join(x.strip() for x in frame[frame.rindex("search"):].splitlines())   # wrapped at the width
    assert "compiled 3" in line and "nothing verified" in line and "verified 0" not in line, line


def test_capture_json_on_a_terminal_keeps_prints_off_stdout_and_gives_stdout_back(tmp_path, monkeypatch, capsys):
    """The model's prints go to stderr while `capture --json` works, and stdout is stdout again after it, also
    where the progress display (which redirects stdout itself) started during the capture: a redirect inside the
    capture once left stdout pointing at stderr, and the cards table after it went there."""
    import sys

    from engine.cli import main

    (tmp_path / "chatty.py").write_text(SLOW_BUILD.replace("time.sleep(1.5)", "print('loading weights')"))
    (tmp_path / "chatty.toml").write_text('name = "chatty"\nbuilder = "chatty.py:build"\n')
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    stdout = sys.stdout
    assert main(["capture", str(tmp_path / "chatty.toml"), "--device", "cpu", "--workspace", str(tmp_path),
                 "--json"]) == 0
    assert sys.stdout is stdout
    assert json.loads(capsys.readouterr().out)["model"] == "chatty"
    assert "loading weights" in term.getvalue()


def test_a_card_none_of_whose_candidates_verified_says_why_in_the_lanes_words():
    # An H100 run's largest GroupNorm card failed 9 of 9 candidates as "launch"; the table said "launch 9" and the
    # reason was only in the workspace database (2026-12-06).
    doc = _timed_doc()
    doc["cards"][1]["failure_messages"] = {"compile": "error: identifier \"foo\" is undefined\nmore lines"}
    doc["cards"][0]["failure_messages"] = {"nan": "output 0 holds NaN where eager's does not"}
    text = " ".join(_final_table(doc, 160).split())
    assert 'no candidate of convolution_backward 1111e29f verified: compile: error: identifier "foo" is ' \
           "undefined" in text
    assert "more lines" not in text
    assert "no candidate of native_layer_norm" not in text  # it has verified kernels: its failures are counted


def test_first_line_is_cut_to_its_width():
    from engine.run.report import first_line

    assert first_line("  out of GPU memory: tried 2 GiB\n  at frame 3") == "out of GPU memory: tried 2 GiB"
    assert first_line("x" * 300, width=10) == "x" * 9 + "…"
    assert first_line("") == ""
