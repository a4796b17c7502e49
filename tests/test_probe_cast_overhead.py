"""scripts/probe_cast_overhead.py without a GPU: the arms it times, and running it says what it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


def _probe():
    return load_script("probe_cast_overhead")


def test_arms_cover_eager_the_cast_its_routes_alone_and_the_cast_without_each_op():
    variants = [{"id": "mul-a", "op": "aten::mul.Tensor"}, {"id": "mul-b", "op": "aten::mul.Tensor"},
                {"id": "add-a", "op": "aten::add.Tensor"}]
    arms = _probe().arms_of(variants)
    assert arms == [("eager", None, True), ("cast", {"mul-a", "mul-b", "add-a"}, True),
                    ("routes off", {"mul-a", "mul-b", "add-a"}, False),
                    ("cast without aten::add.Tensor", {"mul-a", "mul-b"}, True),
                    ("cast without aten::mul.Tensor", {"add-a"}, True)]
    # a cast of one op has no "without" arm: it would be eager again
    assert [a[0] for a in _probe().arms_of(variants[:2])] == ["eager", "cast", "routes off"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where no GPU is visible")
def test_without_a_gpu_it_says_so_with_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_cast_overhead.py"), "--config",
                           "configs/models/qwen35_a3b.toml", "--cast", "x.cast", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: probe_cast_overhead: no CUDA GPU is visible"
