"""Evaluation for the orchestrator: compile once (pool, cache), then one free GPU lane (never two at once)."""

from __future__ import annotations

import asyncio
import time

from engine.compile import CompilePool, Compiler, CompileResult
from engine.lane.client import GpuLane
from engine.lane.evaluate import Evaluation, compile_rejection, evaluate
from engine.propose.base import Proposal
from engine.run.orchestrator import CURRENT_LANE_USE
from engine.run.plan import CardState


async def compile_candidate(compiler: Compiler, pool: CompilePool | None, source: str) -> CompileResult:
    """The candidate's one compile: in the pool when there is one, else in a thread (never on the loop)."""
    if pool is not None:
        return await compiler.compile_async(source, pool=pool)
    return await asyncio.to_thread(compiler.compile, source)


class LaneEvaluator:
    """Each lane runs one evaluation at a time; compiles overlap GPU work through the pool."""

    def __init__(self, lanes: list[GpuLane], compiler: Compiler, pool: CompilePool | None = None,
                 timing: dict | None = None):
        self.lanes = lanes
        self.compiler = compiler
        self.pool = pool
        self.timing = timing or {}
        self._free: asyncio.Queue[GpuLane] = asyncio.Queue()
        for lane in lanes:
            self._free.put_nowait(lane)

    async def __call__(self, card: CardState, proposal: Proposal) -> Evaluation:
        compiled = await compile_candidate(self.compiler, self.pool, proposal.source)
        if not compiled.ok:
            return compile_rejection(compiled)  # before taking a lane: a broken source costs no GPU time
        lane = await self._free.get()
        use = CURRENT_LANE_USE.get()
        status, category = "error", "internal"
        try:
            if use is not None:
                await use.busy(lane.name)
            ev = await evaluate(lane, card.ref, compiled, proposal.spec, timing=self.timing)
            status, category = ev.status, ev.category
            return ev
        except asyncio.CancelledError:   # Ctrl-C: not an error of ours; --resume evaluates it again
            status, category = "interrupted", None
            raise
        finally:
            self._free.put_nowait(lane)
            if use is not None:
                await use.free(status, category)


class CompileOnlyEvaluator:
    """`run --dry-run`: propose and compile, no GPU. Compiled candidates count as 'compiled'."""

    def __init__(self, compiler: Compiler, pool: CompilePool | None = None):
        self.compiler = compiler
        self.pool = pool

    async def __call__(self, card: CardState, proposal: Proposal) -> Evaluation:
        t0 = time.perf_counter()
        compiled = await compile_candidate(self.compiler, self.pool, proposal.source)
        if not compiled.ok:
            return compile_rejection(compiled)
        return Evaluation("compiled", None, "compiled (dry run: not verified, not timed)", compiled.seconds,
                          compiled.log, compiled.cached, seconds=time.perf_counter() - t0)


class RayLaneEvaluator:
    """`run --ray`: the same callable over Ray lanes (engine.lane.ray_lanes). GPU lanes take candidates
    compiled here (the pool, the cache); compile-only lanes (a dry run) compile in their actor."""

    def __init__(self, lanes, compiler: Compiler | None = None, pool: CompilePool | None = None,
                 timing: dict | None = None):
        self.lanes = lanes
        self.compiler = compiler
        self.pool = pool
        self.timing = timing or {}

    async def __call__(self, card: CardState, proposal: Proposal) -> Evaluation:
        use = CURRENT_LANE_USE.get()
        if self.lanes.compile_only_lanes:
            return await self.lanes.compile_only(proposal.source, lane_use=use)
        compiled = await compile_candidate(self.compiler, self.pool, proposal.source)
        if not compiled.ok:
            return compile_rejection(compiled)  # before taking a lane, as LaneEvaluator
        return await self.lanes.evaluate(card.ref, compiled, proposal.spec, timing=self.timing, lane_use=use)


async def start_ray_evaluator(address: str | None, *, dry: bool, arch: str, compiler: Compiler | None = None,
                              pool: CompilePool | None = None, cache_dir: str | None = None,
                              timing: dict | None = None, max_lanes: int | None = None,
                              **lane_options) -> RayLaneEvaluator:
    """Start Ray lanes (GPU lanes; compile-only CPU lanes with `dry`) and the evaluator over them.

    Raises UsageError (with the install command) when Ray is not installed, LaneUnavailable with no lane.
    The caller closes `evaluator.lanes` when the run ends."""
    from engine.lane.ray_lanes import RayLanes

    lanes = await RayLanes.start(address, compile_only=dry, arch=arch, cache_dir=cache_dir, max_lanes=max_lanes,
                                 **lane_options)
    return RayLaneEvaluator(lanes, compiler, pool, timing)
