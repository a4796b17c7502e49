"""scripts/probe_softmax_sync.py on a machine without a GPU: its kernels compile for sm_90 in every
configuration it times, and running it says what it needs (exit 2, one line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


def _probe():
    return load_script("probe_softmax_sync")


@pytest.mark.parametrize("c,b", [(32, 256), (16, 512), (64, 256)])
def test_probe_kernels_compile_for_sm90(c, b):
    from engine.compile import compile_source

    p = _probe()
    src = p._SOURCE.replace("$N", str(p.N)).replace("$C", str(c)).replace("$B", str(b)).replace("$MAGIC", hex(p.MAGIC))
    r = compile_source(src, arch="sm_90", options=("-std=c++17",), contract=False)  # a probe: %gridid
    assert r.ok, r.log[:2000]
    assert set(r.kernels) == {"pr_partial", "pr_finish", "pr_partial_pdl", "pr_finish_pdl", "pr_coop", "pr_tag",
                              "pr_gridid"}
    # The tag barrier reads the launch's %gridid; the PDL pair waits on its primary.
    assert "%gridid" in r.ptx and "griddepcontrol.wait" in r.ptx


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
def test_probe_without_a_gpu_says_what_it_needs(tmp_path):
    p = subprocess.run([sys.executable, "scripts/probe_softmax_sync.py", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: probe_softmax_sync needs a CUDA GPU of compute capability 9.0 or newer"]
