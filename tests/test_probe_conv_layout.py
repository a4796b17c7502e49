"""scripts/probe_conv_layout.py's input checks on the CPU (the probe itself runs on the GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args, tmp_path):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_conv_layout.py"), *args,
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    got = _run("--config", "no_such_model", tmp_path=tmp_path)
    assert got.returncode == 2 and got.stderr.startswith("error: --config:"), got.stderr
    got = _run("--config", "configs/examples/sd35_vae.toml", "--iters", "1", tmp_path=tmp_path)
    assert got.returncode == 2 and got.stderr.strip() == "error: --iters: at least 3 timed forwards per arm"


def test_without_a_gpu_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        return
    got = _run("--config", "configs/examples/sd35_vae.toml", tmp_path=tmp_path)
    assert got.returncode == 2 and got.stderr.strip() == "error: probe_conv_layout needs a CUDA GPU"
