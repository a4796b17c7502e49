"""`run --dry-run --gpu NAME`: kernels prepared on a laptop for a named GPU (issue: other GPUs)."""

import json
import sqlite3

import pytest

BUILDER = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(32, 512)
        self.conv = nn.Conv2d(512, 64, 1)

    def forward(self, x):
        return self.conv(torch.nn.functional.silu(self.norm(x)))


def build(device="cpu", dtype=torch.float32):
    m = Block().to(device=device, dtype=dtype)
    return m, (torch.randn(1, 512, 64, 64, device=device, dtype=dtype),)
'''


class Ran:
    """What `kforge-tui ARGV` gave: exit code, stdout, stderr."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def kforge(cli):
    """`kforge-tui ARGV` run in this process, as the other CLI tests do: a fresh process per run spent ~4 s of
    each importing torch and Dynamo again (five runs here, 17 s of the file's 33 s on CI)."""
    return lambda *argv: Ran(*cli(*argv))


def _run(kforge, tmp_path, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "gn.py").write_text(BUILDER)
    (tmp_path / "gn.toml").write_text('name = "gn"\nbuilder = "gn.py:build"\n')
    ws = tmp_path / "ws"
    r = kforge("run", tmp_path / "gn.toml", "--dry-run", "--no-tui", "--device", "cpu", "--iterations", "4", "--json",
               "--workspace", ws, *extra)
    return r, ws


def _sources(ws, op_fragment):
    with sqlite3.connect(ws / "kforge.db") as db:
        return [s for (s,) in db.execute(
            "SELECT c.source FROM candidates c JOIN cards k ON k.card_id = c.card_id WHERE k.op LIKE ?",
            (f"%{op_fragment}%",))]


def test_dry_run_for_a_dgx_spark_names_sm_121_and_compiles_for_it(kforge, tmp_path):
    r, ws = _run(kforge, tmp_path, "--gpu", "dgx-spark")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["arch"] == "sm_121" and ("GB10" in doc["gpu"] or "Spark" in doc["gpu"]), doc["gpu"]
    srcs = _sources(ws, "group_norm")
    assert srcs, "no group_norm candidate was proposed"
    assert not any("cluster" in s for s in srcs)
    with sqlite3.connect(ws / "kforge.db") as db:
        statuses = {s for (s,) in db.execute("SELECT status FROM candidates")}
    assert "compiled" in statuses, statuses  # compiled for sm_121 by NVRTC


def test_dry_run_for_an_a100_offers_no_cluster_kernel(kforge, tmp_path):
    r, ws = _run(kforge, tmp_path / "h200", "--gpu", "h200")
    assert r.returncode == 0, r.stderr[-2000:]
    assert any("cluster" in s for s in _sources(ws, "group_norm")), "the H200 run should try a cluster kernel"
    r, ws = _run(kforge, tmp_path / "a100", "--gpu", "a100")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["arch"] == "sm_80"
    srcs = _sources(ws, "group_norm")
    assert srcs and not any("cluster" in s for s in srcs)


def test_unknown_gpu_and_gpu_without_dry_run_are_refused(kforge, tmp_path):
    (tmp_path / "gn.py").write_text(BUILDER)
    (tmp_path / "gn.toml").write_text('name = "gn"\nbuilder = "gn.py:build"\n')
    for extra, needle in ((["--dry-run", "--gpu", "h900"], "h200"), (["--gpu", "a100"], "--dry-run")):
        r = kforge("run", tmp_path / "gn.toml", "--no-tui", "--workspace", tmp_path / "ws", *extra)
        assert r.returncode == 2, (extra, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
