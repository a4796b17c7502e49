"""Spread launches (engine/launch/launcher.py): in verification's busy runs the candidate's blocks run one per SM at
most, padded with dynamic shared memory they do not use, so a grid larger than the SMs runs in waves. On an H100
and an H200 the lane's contention blocks on another stream never ran beside the candidate (its streams took turns,
docs/results/reproduce-h200/2026-12-05d and 2026-12-05e), and a leader block that read its helper's partial after
a fixed wait (tests/adversarial_kernels.py, class 7) was verified in every run: its helpers are later blocks, and
with all blocks resident at once they were always done in time. The driver is emulated here: which launches are
spread, with what, and what is put back; whether the race shows is the adversarial suite's, on the GPU."""

import pytest
import torch

from engine.launch import ResolvedSpec
from engine.launch import cuda_driver as drv
from engine.launch import launcher as L
from engine.launch.spec import ResolvedArg, ResolvedLaunch

H100_SM, H100_BLOCK = 233_472, 232_448  # shared memory per SM, and the most one block may opt in to


@pytest.mark.parametrize("static", [0, 2048, 40_000])
@pytest.mark.parametrize("per_sm,per_block", [(H100_SM, H100_BLOCK), (102_400, 101_376), (167_936, 166_912)])
def test_a_spread_launch_leaves_room_for_one_block_per_sm(static, per_sm, per_block):
    dyn = L.spread_shared(0, static, per_sm, per_block)
    assert (dyn + static) % 128 == 0 or static % 128   # the share is whole 128 B lines
    assert static + dyn <= per_block                    # the launch is one the GPU takes
    assert 2 * (static + dyn + 1024) > per_sm           # and a second block of it does not fit beside it
    two = L.spread_shared(0, static, per_sm, per_block, blocks_per_sm=2)
    assert 2 * (static + two + 1024) <= per_sm < 3 * (static + two + 1024)


def test_a_launch_that_asks_for_more_keeps_what_it_asked_for():
    assert L.spread_shared(60_000, 40_000, 100_000, 99_000) == 60_000


class _Driver:
    """cuFuncGetAttribute / cuFuncSetAttribute / cuLaunch* on host state: the dynamic shared memory limit per
    function, and each launch's function and dynamic shared memory."""

    def __init__(self, monkeypatch, refuse_spread=False, cluster=None):
        self.limit = {}
        self.launches = []
        self.refuse_spread = refuse_spread
        self.cluster = cluster or {}
        monkeypatch.setattr(drv, "function_attribute", self.get)
        monkeypatch.setattr(drv, "set_max_dynamic_shared", self.set_limit)
        monkeypatch.setattr(drv, "set_function_attribute", lambda f, attr, v: None)
        monkeypatch.setattr(drv, "launch", self.launch)
        monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)

    def get(self, fn, attr):
        if attr == "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK":
            return 1024
        if attr == "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES":
            return 1024
        if attr == "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES":
            return self.limit.setdefault(fn, 48 * 1024 - 1024)
        if attr.startswith("CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_"):
            return self.cluster.get(fn, 0) if attr.endswith("WIDTH") else 0
        raise AssertionError(attr)

    def set_limit(self, fn, nbytes):
        if self.refuse_spread and nbytes > 100_000:
            e = drv.DriverError.__new__(drv.DriverError)  # as cuFuncSetAttribute reports it, without a driver
            RuntimeError.__init__(e, "cuFuncSetAttribute: CUDA_ERROR_INVALID_VALUE")
            e.name, e.text, e.code = "CUDA_ERROR_INVALID_VALUE", "invalid argument", 1
            raise e
        self.limit[fn] = nbytes

    def launch(self, fn, grid, block, shared, stream, params, cooperative=False):
        assert shared <= max(self.limit.get(fn, 48 * 1024 - 1024), 48 * 1024 - 1024), "over the function's limit"
        self.launches.append((fn, shared, cooperative))


class _Module:
    def function(self, name):
        return name


def _launcher(kernels):
    launches = tuple(ResolvedLaunch(name, (512, 1, 1), (256, 1, 1), shared, (ResolvedArg("i32", 1),), coop)
                     for name, shared, coop in kernels)
    out = {"shape": [4], "stride": [1], "dtype": "float32"}
    return L.CandidateLauncher(_Module(), ResolvedSpec(launches, ()), "aten::relu", [out], torch.device("cpu"),
                               max_shared=H100_BLOCK, shared_per_sm=H100_SM)


def test_busy_runs_spread_the_blocks_and_put_the_limit_back(monkeypatch):
    dev = _Driver(monkeypatch, cluster={"clustered": 2})
    la = _launcher([("plain", 0, False), ("coop", 4096, True), ("clustered", 0, False), ("big", 200_000, False),
                    ("twice", 60_000, False), ("twice", 0, False)])
    dev.limit["twice"] = 60_000  # as the launcher's set-up left it: the larger of the two launches'
    limits = {f: dev.get(f, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")
              for f in ("plain", "coop", "clustered", "big", "twice")}
    la.spread = True
    la._launch({}, [], {})
    spread = L.spread_shared(0, 1024, H100_SM, H100_BLOCK)
    assert dev.launches == [("plain", spread, False),
                            ("coop", 4096, True),         # a cooperative launch's blocks are resident together
                            ("clustered", 0, False),      # and a cluster's: as asked
                            ("big", 200_000, False),      # already one per SM: as asked
                            ("twice", spread, False), ("twice", spread, False)]
    assert dev.limit == limits                          # the limit each kernel had, for the timed runs
    la.spread = False
    dev.launches.clear()
    la._launch({}, [], {})
    assert [s for _, s, _ in dev.launches] == [0, 4096, 0, 200_000, 60_000, 0]   # the second under 60 KB's limit


def test_a_spread_launch_the_driver_refuses_runs_as_asked(monkeypatch):
    """A spread run must never reject a kernel the GPU runs: where the larger limit is refused, the launch goes
    as the spec asked."""
    dev = _Driver(monkeypatch, refuse_spread=True)
    la = _launcher([("plain", 0, False)])
    la.spread = True
    la._launch({}, [], {})
    assert dev.launches == [("plain", 0, False)]


def test_only_the_busy_runs_are_spread(monkeypatch):
    """The worker spreads the candidate inside `_contend` (the four busy runs of verification) and nowhere else:
    timed and audited calls, which share the launcher, run as asked, also after a run that raised."""
    from engine.lane.worker import Worker

    seen = []
    w = object.__new__(Worker)
    w._contended = w._hog_running = False
    w.contention = False
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    class Canaries:
        def forget(self):
            pass

        def violations(self):
            return []

    class Launcher:
        spread = False
        fail = False

        def prepare(self, bound, prefill):
            def go():
                seen.append(self.spread)
                if self.fail:
                    raise RuntimeError("launch refused")
                return []
            return go

    la = Launcher()
    w._run_candidate(la, Canaries(), None, None)
    with w._contend():
        w._run_candidate(la, Canaries(), None, None)
        la.fail = True
        with pytest.raises(RuntimeError):
            w._run_candidate(la, Canaries(), None, None)
    la.fail = False
    w._run_candidate(la, Canaries(), None, None)
    assert seen == [False, True, True, False] and la.spread is False
