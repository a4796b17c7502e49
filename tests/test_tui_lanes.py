"""The overview's lane line: one host lists its lanes; lanes of several hosts (a Ray cluster) read per host."""

from types import SimpleNamespace

from kforge_tui.readmodel import LaneState
from kforge_tui.screens.overview import _lanes


def _stats(*lanes):
    return SimpleNamespace(lanes=tuple(lanes), evaluating=0)


def test_one_host_lists_its_lanes():
    st = _stats(LaneState("lane0", "cand-1", 96.0), LaneState("lane1"))
    assert _lanes(st, 100.0) == "lane0 busy cand-1 4s, idle lane1"


def test_lanes_of_several_hosts_read_per_host():
    st = _stats(LaneState("node-a/gpu0", "cand-7", 90.0), LaneState("node-a/gpu1"),
                LaneState("node-b/gpu0"), LaneState("node-b/gpu1"))
    assert _lanes(st, 100.0) == "node-a: gpu0 busy cand-7 10s, idle gpu1 · node-b 0/2 busy"
