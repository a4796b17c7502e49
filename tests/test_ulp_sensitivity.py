"""scripts/ulp_sensitivity.py: what rounding differences alone do to a model's output (CPU, small inputs)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/ulp_sensitivity.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_nudging_relu_outputs_by_one_ulp_moves_resnet50_and_eager_repeats_exactly(tmp_path):
    # ResNet-50's small build at 64x64 (at 224x224 its three float16 forwards took most of the test's ~20 s on
    # a CI core); every relu is still nudged and the output still moves
    config = tmp_path / "resnet50.toml"
    config.write_text((ROOT / "configs/models/resnet50.toml").read_text().replace("batch = 2", "batch = 2\nimage_size = 64"))
    p = _run(str(config), "--ops", "relu", "--fraction", "0.5", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["rel_l2_eager_vs_eager"] == 0.0  # eager is deterministic: any distance below is the nudge's
    assert r["elements_nudged"] > 0 and 0 < r["rel_l2_nudged"] < 0.5


def test_bad_fraction_and_empty_ops_are_bad_input():
    p = _run("resnet50", "--ops", "relu", "--fraction", "2")
    assert p.returncode == 2 and "--fraction 2.0" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _run("resnet50", "--ops", ",")
    assert p.returncode == 2 and "--ops is empty" in p.stderr
