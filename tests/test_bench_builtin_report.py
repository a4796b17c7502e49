"""scripts/bench_builtin.py's bandwidth column, without a GPU: a kernel's bytes per second against the lane's own
copy of the same bytes (issue 21), and --report-only re-judging a recorded run by today's target."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, load_script


def _row(**kw):
    row = {"label": "relu fp16 [32,256,56,56]", "op": "aten::relu", "bytes": 100, "clone_bytes": 100,
           "clone_us": 30.0, "best_us": 30.0, "eager_us": 31.0, "speedup": 1.03, "speedup_ci": [1.0, 1.05],
           "bandwidth_frac": 0.81, "compile_us_baseline": None, "evaluations": 11, "min_speedup": None,
           "target": "≥ 75 % of copy bandwidth (moves ≥ 32 MB)", "intent": "relu", "failures": {}, "stopped": "x"}
    row.update(kw)
    return row


def test_of_copy_compares_bytes_per_second_with_the_clones():
    bench = load_script("bench_builtin")
    assert bench.of_copy(_row()) == 1.0  # as fast as the copy of its own bytes
    # add reads two inputs: 1.5x the clone's bytes in 42.3 us against 30.1 us for the clone: faster per byte
    assert round(bench.of_copy(_row(bytes=150, clone_bytes=100, best_us=42.3, clone_us=30.1)), 3) == 1.067
    # group_norm reads its input twice where the clone reads it once: 61 % of the copy's bandwidth
    assert round(bench.of_copy(_row(best_us=111.3, clone_us=68.3)), 2) == 0.61
    assert bench.of_copy(_row(clone_us=None)) is None


def test_the_verdict_holds_a_recorded_run_to_todays_target():
    bench = load_script("bench_builtin")
    assert bench.verdict(_row(best_us=111.3, clone_us=68.3)) == "bw MISSED"
    assert bench.verdict(_row(best_us=32.0)) == "bw met"        # 94 %
    assert bench.verdict(_row(best_us=34.0)) == "bw MISSED"     # 88 %: met under the old 75 % of a fixed bandwidth
    assert "≥ 90 % of the copy's bandwidth" in bench.current_target(_row()["target"])


def test_report_only_rewrites_the_table_from_the_json(tmp_path):
    doc = {"gpu": "NVIDIA H200", "torch": "2.11", "strategy": "mcts", "budget": 50, "stopped_by": "iterations",
           "wall_s": 281.0, "launch_floor_us": 5.1, "evaluations": 11, "cards": [_row(best_us=111.3, clone_us=68.3)]}
    (tmp_path / "bench_builtin.json").write_text(json.dumps(doc))
    r = subprocess.run([sys.executable, str(ROOT / "scripts/bench_builtin.py"), "--out", str(tmp_path), "--report-only"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "bench_builtin.md").read_text()
    assert "| 61 % | 81 % |" in md and "bw MISSED" in md


def test_report_only_without_a_recorded_run_says_what_to_run(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts/bench_builtin.py"), "--out", str(tmp_path), "--report-only"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bench_builtin.json does not exist" in r.stderr
