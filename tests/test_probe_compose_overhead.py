"""scripts/probe_compose_overhead.py without a GPU: its arms separate the routes from the backend, and running it
says what it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


def test_the_arms_cross_the_backend_with_the_routes():
    probe = load_script("probe_compose_overhead")
    arms = probe.ARMS
    assert arms[0] == ("torch.compile", False, False, True)  # the base every arm is divided by
    assert sorted((backend, routes) for _, backend, routes, own in arms if own) == [
        (False, False), (False, True), (True, False), (True, True)]
    # bench_compose's pair, on one function as it compiles them
    assert sorted((backend, routes) for _, backend, routes, own in arms if not own) == [(False, False), (True, True)]


def test_each_arm_of_its_own_gets_its_own_code_object():
    probe = load_script("probe_compose_overhead")
    calls = []
    a, b = probe.own_code(lambda: calls.append(1), "a"), probe.own_code(lambda: calls.append(2), "b")
    a(), b()
    assert calls == [1, 2] and a.__code__ is not b.__code__


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_compose_overhead.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_a_missing_cast_is_named_with_exit_2(tmp_path):
    proc = _run("--model", "configs/models/gemma4_e2b.toml", "--cast", str(tmp_path / "x.cast"), "--out",
                str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --cast {tmp_path / 'x.cast'}: no such file; pass the .cast an export wrote"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where no GPU is visible")
def test_without_a_gpu_it_says_so_with_exit_2(tmp_path):
    cast = tmp_path / "x.cast"
    cast.write_bytes(b"")
    proc = _run("--model", "configs/models/gemma4_e2b.toml", "--cast", str(cast), "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: probe_compose_overhead: no CUDA GPU is visible"
