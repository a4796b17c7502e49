"""scripts/ulp_sensitivity.py: what rounding differences alone do to a model's output (CPU, small inputs)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/ulp_sensitivity.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_nudging_relu_outputs_by_one_ulp_moves_resnet50_and_eager_repeats_exactly():
    p = _run("resnet50", "--ops", "relu", "--fraction", "0.5", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["rel_l2_eager_vs_eager"] == 0.0  # eager is deterministic: any distance below is the nudge's
    assert r["elements_nudged"] > 0 and 0 < r["rel_l2_nudged"] < 0.5


def test_bad_fraction_and_empty_ops_are_bad_input():
    p = _run("resnet50", "--ops", "relu", "--fraction", "2")
    assert p.returncode == 2 and "--fraction 2.0" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _run("resnet50", "--ops", ",")
    assert p.returncode == 2 and "--ops is empty" in p.stderr
