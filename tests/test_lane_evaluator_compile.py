"""A candidate is compiled once: LaneEvaluator compiles it (in the pool, or a thread without one), the lane
is handed that result, and the Evaluation reports that compile. (When the lane compiled again, its cache hit
was what got reported, and the harness table's 'median compile ms (uncached)' was empty on the H200.)"""

import asyncio
import hashlib
import sys

import pytest
from conftest import ROOT

from engine.cards import OperatorCard
from engine.compile import Compiler, CompileResult
from engine.compile import cache as cache_mod
from engine.lane.client import GpuLane
from engine.propose.base import Proposal
from engine.run.evaluators import CompileOnlyEvaluator, LaneEvaluator
from engine.run.plan import CardState

STANDIN = [sys.executable, str(ROOT / "tests" / "lane_standin.py")]
CUBIN = b"\x7fELF a stand-in cubin"
COMPILE_S = 0.25


@pytest.fixture
def toolchain(monkeypatch):
    """A fake compiler behind the real cache: records each source it compiles; 'broken' sources fail."""
    calls = []

    def compile_source(source, *, arch, compiler="nvrtc", name="candidate.cu", options=(), want_ptx=True):
        calls.append(source)
        ok = "broken" not in source
        return CompileResult(ok=ok, cubin=CUBIN if ok else None, ptx=None, log="" if ok else "error: broken",
                             diagnostics=(), arch=arch, compiler=compiler, seconds=COMPILE_S,
                             source_hash=hashlib.sha256(source.encode()).hexdigest(), kernels=("k",),
                             options=tuple(options))

    monkeypatch.setattr(cache_mod, "compile_source", compile_source)
    monkeypatch.setattr(cache_mod, "compiler_version", lambda compiler: "fake 1.0")
    return calls


class CountingPool:
    """Stands in for CompilePool (anything with its `compile` coroutine): compiles in this process."""

    def __init__(self):
        self.compiles = 0

    async def compile(self, source, *, arch, compiler="nvrtc", options=(), name="candidate.cu"):
        self.compiles += 1
        return cache_mod.compile_source(source, arch=arch, compiler=compiler, options=options, name=name)


def _card() -> CardState:
    return CardState(OperatorCard("c1", "aten::relu", {}, bytes=100, eager_us=40.0, share=0.5), ["c1.safetensors"])


def _lookups(compiler: Compiler) -> int:
    return compiler.stats.memory_hits + compiler.stats.disk_hits + compiler.stats.misses


@pytest.mark.parametrize("use_pool", [False, True], ids=["thread", "pool"])
async def test_a_candidate_is_compiled_once_and_reports_that_compile(tmp_path, toolchain, use_pool):
    compiler = Compiler(tmp_path / "cache", "nvrtc", arch="sm_90")
    pool = CountingPool() if use_pool else None
    lane = GpuLane(STANDIN, timeout_s=10, start_timeout_s=30)
    await lane.start()
    try:
        evaluate = LaneEvaluator([lane], compiler, pool)
        first = await evaluate(_card(), Proposal("kernel one", "spec one"))
        assert toolchain == ["kernel one"] and _lookups(compiler) == 1  # one compile, no second cache lookup
        assert first.status == "verified" and first.compile_seconds == COMPILE_S and not first.cached_compile
        assert first.payload["cubin_sha256"] == hashlib.sha256(CUBIN).hexdigest()  # the lane got that binary
        assert first.payload["spec"] == "spec one"
        if pool is not None:
            assert pool.compiles == 1
        again = await evaluate(_card(), Proposal("kernel one", "spec one"))
        assert toolchain == ["kernel one"] and _lookups(compiler) == 2
        assert again.status == "verified" and again.cached_compile and again.compile_seconds == COMPILE_S
    finally:
        await lane.close()


class NoLane:
    """A lane that must not be asked anything."""

    name = "lane0"

    async def request(self, *a, **kw):
        raise AssertionError("a candidate that did not compile was sent to the lane")


def test_a_compile_failure_is_rejected_without_the_lane(tmp_path, toolchain):
    compiler = Compiler(tmp_path / "cache", "nvrtc", arch="sm_90")
    ev = asyncio.run(LaneEvaluator([NoLane()], compiler)(_card(), Proposal("broken kernel", "spec")))
    assert (ev.status, ev.category) == ("rejected", "compile") and ev.compile_log == "error: broken"
    assert toolchain == ["broken kernel"] and ev.compile_seconds == COMPILE_S


def test_a_dry_run_compiles_once(tmp_path, toolchain):
    compiler = Compiler(tmp_path / "cache", "nvrtc", arch="sm_90")
    pool = CountingPool()
    ev = asyncio.run(CompileOnlyEvaluator(compiler, pool)(_card(), Proposal("kernel two", "spec")))
    assert ev.status == "compiled" and ev.compile_seconds == COMPILE_S and not ev.cached_compile
    assert toolchain == ["kernel two"] and pool.compiles == 1 and _lookups(compiler) == 1


class HangingLane:
    name = "lane0"


class LaneUseLog:
    """Stands in for the orchestrator's LaneUse: records what the evaluator said when it let the lane go."""

    def __init__(self):
        self.freed = []

    async def busy(self, lane):
        pass

    async def free(self, status, category):
        self.freed.append((status, category))


async def test_an_evaluation_cut_off_by_ctrl_c_is_interrupted_not_an_internal_error(tmp_path, toolchain, monkeypatch):
    # 2026-12-06b (H100): a run stopped by SIGINT mid-evaluation left an evaluation row 'error' / 'internal'
    from engine.run import evaluators
    from engine.run.orchestrator import CURRENT_LANE_USE

    started = asyncio.Event()

    async def gpu_work(lane, card, compiled, spec, **kw):
        started.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(evaluators, "evaluate", gpu_work)
    use = LaneUseLog()
    CURRENT_LANE_USE.set(use)
    evaluate = LaneEvaluator([HangingLane()], Compiler(tmp_path / "cache", "nvrtc", arch="sm_90"))
    task = asyncio.ensure_future(evaluate(_card(), Proposal("kernel one", "spec")))
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert use.freed == [("interrupted", None)]
    assert evaluate._free.qsize() == 1   # the lane is free again
