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


# ---- the exporter's builtin kernels render for the GPU at hand (issue 24: export/direct, hostcost) ----

GB10_PROPS = SimpleNamespace(name="NVIDIA GB10", major=12, minor=1, multi_processor_count=48,
                             L2_cache_size=24 << 20, shared_memory_per_block_optin=99 << 10,
                             shared_memory_per_multiprocessor=100 << 10, max_threads_per_multi_processor=1536,
                             is_integrated=True, memory_clock_rate=4_266_000, memory_bus_width=256)


def test_the_exporter_takes_the_gpu_from_its_properties_not_an_h200():
    from engine.export.direct import hardware_of

    hw = hardware_of(GB10_PROPS)
    assert (hw.arch, hw.sms, hw.l2_bytes, hw.max_shared_per_block) == ("sm_121", 48, 24 << 20, 99 << 10)
    assert hw.integrated and not hw.clusters and not hw.measured
    assert hw.bandwidth_bps == pytest.approx(2 * 4_266_000e3 * 256 / 8)  # the DRAM peak, 273 GB/s


def test_the_exporter_passes_the_hardware_to_every_template_call():
    import re

    for name in ("direct.py", "hostcost.py"):
        src = (ROOT / "engine" / "export" / name).read_text()
        calls = re.findall(r"\.(template_for|default|mutate|render)\(([^()]*(?:\([^()]*\)[^()]*)*)\)", src)
        assert calls, name
        assert all("hw=hw" in args for _, args in calls), (name, calls)


@pytest.mark.gpu
def test_on_this_gpu_the_exporter_sees_what_the_lane_reports():
    """On the H200: the exporter's Hardware agrees with the lane's hello in everything a template reads."""
    import asyncio

    from engine.export.direct import current_hardware
    from engine.lane.client import GpuLane, worker_argv
    from engine.propose.base import Hardware

    async def hello():
        lane = GpuLane(worker_argv(0), timeout_s=120)
        await lane.start()
        try:
            return (await lane.request("hello")).payload
        finally:
            await lane.close()

    lane_hw, mine = Hardware.from_hello(asyncio.run(hello())), current_hardware()
    for field in ("arch", "sms", "l2_bytes", "max_shared_per_block", "shared_per_sm", "max_threads_per_sm",
                  "clusters", "integrated"):
        assert getattr(mine, field) == getattr(lane_hw, field), field
