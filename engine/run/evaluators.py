"""Evaluation for the orchestrator: compile in the pool, then one free GPU lane (never two at once)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from engine.compile import CompilePool, Compiler
from engine.lane.client import GpuLane
from engine.lane.evaluate import Evaluation, evaluate
from engine.propose.base import Proposal
from engine.run.orchestrator import CURRENT_LANE_USE
from engine.run.plan import CardState


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
        result = await (self.compiler.compile_async(proposal.source, pool=self.pool) if self.pool
                        else asyncio.to_thread(self.compiler.compile, proposal.source))
        if not result.ok:
            return Evaluation("rejected", "compile", result.summary(), result.seconds, result.log, result.cached)
        lane = await self._free.get()
        use = CURRENT_LANE_USE.get()
        status, category = "error", "internal"
        try:
            if use is not None:
                await use.busy(lane.name)
            ev = await evaluate(lane, self.compiler, card.ref, proposal.source, proposal.spec,
                                timing=self.timing)
            # evaluate() finds the binary the pool just built in the compile cache: the compile this
            # candidate cost is the pool's, cached only if the pool's was.
            ev = dataclasses.replace(ev, compile_seconds=result.seconds, cached_compile=result.cached)
            status, category = ev.status, ev.category
            return ev
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
        result = await (self.compiler.compile_async(proposal.source, pool=self.pool) if self.pool
                        else asyncio.to_thread(self.compiler.compile, proposal.source))
        if not result.ok:
            return Evaluation("rejected", "compile", result.summary(), result.seconds, result.log, result.cached)
        return Evaluation("compiled", None, "compiled (dry run: not verified, not timed)", result.seconds,
                          result.log, result.cached, seconds=time.perf_counter() - t0)
