"""Budgets on unified memory (issue 24, item 4): on an integrated GPU (DGX Spark's GB10, Jetson) the
memory a workspace may plan on is MemAvailable, not cudaMemGetInfo's free (which counts the page cache
as used there). These are tests of the rule, with a fake /proc/meminfo and fake device properties."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT

from engine.resources import available_device_bytes, mem_available_bytes

MEMINFO = """MemTotal:       128479516 kB
MemFree:         2104128 kB
MemAvailable:   101823400 kB
Buffers:          600000 kB
Cached:         95000000 kB
"""
FREE = 3 << 30  # what cudaMemGetInfo reports on a GB10 with a full page cache


def _free(device):
    return FREE, 128 << 30


@pytest.fixture
def meminfo(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    return path


def test_an_integrated_gpu_plans_on_mem_available(meminfo):
    spark = SimpleNamespace(is_integrated=True, name="NVIDIA GB10")
    assert available_device_bytes(0, props=spark, meminfo=meminfo, mem_get_info=_free) == 101823400 * 1024


def test_a_discrete_gpu_plans_on_free_device_memory(meminfo):
    h200 = SimpleNamespace(is_integrated=False, name="NVIDIA H200")
    assert available_device_bytes(0, props=h200, meminfo=meminfo, mem_get_info=_free) == FREE
    old_torch = SimpleNamespace(name="a GPU from a PyTorch without is_integrated")
    assert available_device_bytes(0, props=old_torch, meminfo=meminfo, mem_get_info=_free) == FREE


def test_without_mem_available_an_integrated_gpu_falls_back_to_free_memory(tmp_path):
    spark = SimpleNamespace(is_integrated=True)
    (tmp_path / "old").write_text("MemTotal: 1000 kB\nMemFree: 10 kB\n")
    assert available_device_bytes(0, props=spark, meminfo=tmp_path / "old", mem_get_info=_free) == FREE
    assert available_device_bytes(0, props=spark, meminfo=tmp_path / "missing", mem_get_info=_free) == FREE


def test_mem_available_reads_kilobytes():
    assert mem_available_bytes("/nonexistent/meminfo") is None
    if sys.platform.startswith("linux"):
        assert mem_available_bytes() > 0  # this machine's own


def test_resources_does_not_import_torch():
    """engine.resources is in the records layer: importing it must not pull in torch."""
    code = "import sys, engine.resources; assert 'torch' not in sys.modules, 'torch imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_the_lane_bounds_workspaces_by_the_available_bytes():
    """The worker's workspace bound goes through available_device_bytes (MemAvailable where integrated),
    never torch.cuda.mem_get_info directly."""
    src = (ROOT / "engine" / "lane" / "worker.py").read_text()
    assert "available_device_bytes(self.device, props=self.props)" in src
    assert "mem_get_info" not in src


@pytest.mark.gpu
def test_on_this_gpu_the_bound_is_the_rule_for_its_kind():
    import torch

    props = torch.cuda.get_device_properties(0)
    got = available_device_bytes(0)
    if props.is_integrated:
        assert got == mem_available_bytes()
    else:  # free memory moves with other processes: within 1 GiB of a reading taken just after
        assert abs(got - torch.cuda.mem_get_info(0)[0]) < (1 << 30)
