"""Named GPU profiles for dry runs, and the Hardware a lane's `hello` describes."""

from __future__ import annotations

import pytest
import torch

from engine.errors import UsageError
from engine.propose.base import Hardware, arch_has_clusters, capability_of
from engine.propose.hardware_profiles import PROFILES, profile, profile_names

NAMES = ["h200", "h100", "a100", "l40s", "rtx-4090", "rtx-5090", "b200", "dgx-spark"]


def test_every_named_gpu_has_a_profile_and_others_are_refused_by_name():
    assert profile_names() == NAMES
    assert profile("DGX-Spark") is PROFILES["dgx-spark"]
    with pytest.raises(UsageError) as e:
        profile("gb200")
    assert "--gpu gb200" in str(e.value) and all(n in str(e.value) for n in NAMES)


def test_the_dgx_spark_profile_is_a_gb10():
    hw = profile("dgx-spark")
    assert (hw.name, hw.arch, hw.capability, hw.sms) == ("NVIDIA GB10", "sm_121", (12, 1), 48)
    assert hw.bandwidth_bps == 273e9 and not hw.measured
    assert hw.max_shared_per_block == 99 * 1024 and hw.shared_per_sm == 100 * 1024
    assert hw.integrated and not hw.clusters and hw.max_threads_per_sm == 1536


@pytest.mark.parametrize("name", NAMES)
def test_profile_figures_are_consistent(name):
    hw = profile(name)
    major, minor = hw.capability
    assert hw.arch == f"sm_{major}{minor}"
    assert hw.max_shared_per_block < hw.shared_per_sm <= 228 * 1024  # 1 KB per block is the system's
    assert hw.clusters == (major in (9, 10))  # cluster kernels: Hopper and datacenter Blackwell only
    assert 40 <= hw.sms <= 200 and 1 << 20 <= hw.l2_bytes <= 128 << 20 and 1e11 < hw.bandwidth_bps < 1e13
    assert hw.integrated == (name == "dgx-spark")


def test_capability_and_cluster_rule_from_the_arch():
    assert capability_of("sm_90a") == (9, 0) and capability_of("sm_121") == (12, 1)
    assert capability_of("compute_100") == (10, 0) and capability_of("gfx90a") is None
    assert [arch_has_clusters(a) for a in ("sm_80", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120", "sm_121")] \
        == [False, False, True, True, True, False, False]
    assert Hardware(arch="sm_80").clusters is False and Hardware().clusters is True
    assert Hardware(arch="sm_90", clusters=False).clusters is False
    assert Hardware(arch="sm_121", clusters=True).clusters is False  # reported, but never offered on 12.x


# The hello an H200 lane sends (docs/results/lane-h200: its figures), with the fields Hardware reads.
H200_HELLO = {"name": "NVIDIA H200", "arch": "sm_90", "capability": [9, 0], "sms": 132, "l2_bytes": 62914560,
              "max_shared_per_block": 232448, "shared_per_sm": 233472, "max_threads_per_sm": 2048,
              "cluster_launch": True, "integrated": False, "copy_bw": 4175410290807.85, "spec_bw": 4.8e12,
              "physics_bw": 4.8e12, "launch_floor_us": 2.1, "torch": "2.11.0+cu130", "memory_bytes": 150 << 30}


def test_hardware_from_a_lanes_hello():
    hw = Hardware.from_hello(H200_HELLO)
    assert (hw.name, hw.arch, hw.sms, hw.l2_bytes, hw.max_shared_per_block) == \
        ("NVIDIA H200", "sm_90", 132, 62914560, 232448)
    assert hw.bandwidth_bps == H200_HELLO["copy_bw"] and hw.measured
    assert (hw.shared_per_sm, hw.max_threads_per_sm, hw.clusters, hw.integrated) == (233472, 2048, True, False)
    gb10 = Hardware.from_hello({**H200_HELLO, "name": "NVIDIA GB10", "arch": "sm_121", "capability": [12, 1],
                                "sms": 48, "max_shared_per_block": 101376, "shared_per_sm": 102400,
                                "integrated": True})
    assert gb10.capability == (12, 1) and gb10.integrated and not gb10.clusters  # cluster_launch is True
    no_clusters = Hardware.from_hello({**H200_HELLO, "cluster_launch": False})
    assert not no_clusters.clusters


def test_hardware_from_an_older_lanes_hello():
    """A hello without the newer fields: they take the H200's defaults, clusters from the arch."""
    old = {k: H200_HELLO[k] for k in ("name", "arch", "sms", "l2_bytes", "max_shared_per_block", "copy_bw")}
    assert Hardware.from_hello(old) == Hardware("NVIDIA H200", "sm_90", 132, 62914560, H200_HELLO["copy_bw"])
    assert not Hardware.from_hello({**old, "arch": "sm_80"}).clusters


@pytest.mark.gpu
def test_the_lanes_hello_describes_this_gpu():
    """Written for the GPU machine (not run here): the worker's hello, read as Hardware, is this device."""
    from engine.lane.worker import Worker

    hello = Worker(0).hello({})
    props = torch.cuda.get_device_properties(0)
    hw = Hardware.from_hello(hello)
    assert hw.capability == (props.major, props.minor) == tuple(hello["capability"])
    assert hw.sms == props.multi_processor_count and hw.l2_bytes == props.L2_cache_size
    assert hw.max_shared_per_block == props.shared_memory_per_block_optin
    assert hw.max_shared_per_block < hw.shared_per_sm
    assert hw.max_threads_per_sm == props.max_threads_per_multi_processor
    assert hw.integrated == bool(props.is_integrated)
    assert hw.clusters == (props.major in (9, 10))
    assert 1e11 < hw.bandwidth_bps < 1.5 * hello["spec_bw"]
