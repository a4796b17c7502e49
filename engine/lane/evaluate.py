"""Engine side of an evaluation: compile (pool, cache), make sure the card is loaded, ask the lane."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.cards import CardRef
from engine.compile import CompilePool, Compiler
from engine.lane.client import GpuLane
from engine.lane.protocol import b64


@dataclass(frozen=True)
class Evaluation:
    """A candidate's outcome: 'verified' (with timing) or 'rejected' with a category and report."""

    status: str
    category: str | None
    message: str
    compile_seconds: float
    compile_log: str = ""
    cached_compile: bool = False
    payload: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    worker_restarted: bool = False

    @property
    def speedup(self) -> float | None:
        t = self.payload.get("timing")
        return t["speedup"] if t else None


async def ensure_loaded(lane: GpuLane, card: CardRef) -> None:
    r = await lane.request("load_card", {"card_id": card.card_id, "op": card.op, "signature": card.signature,
                                         "outputs": card.outputs, "bytes": card.bytes, "samples": card.samples},
                           sticky_key=f"card:{card.card_id}")
    if not r.ok:
        raise RuntimeError(f"card {card.card_id} could not be loaded in {lane.name}: {r.category}: {r.message}")


async def evaluate(lane: GpuLane, compiler: Compiler, card: CardRef, source: str, spec: str | dict, *,
                   pool: CompilePool | None = None, timing: dict[str, Any] | None = None,
                   do_time: bool = True, timeout_s: float | None = None) -> Evaluation:
    """Compile `source`, then verify (and time) it on the card in the lane."""
    t0 = time.perf_counter()
    result = await compiler.compile_async(source, pool=pool) if pool else compiler.compile(source)
    if not result.ok:
        return Evaluation("rejected", "compile", result.summary(),
                          result.seconds, result.log, result.cached, seconds=time.perf_counter() - t0)
    await ensure_loaded(lane, card)
    payload = {"card_id": card.card_id, "cubin": b64(result.cubin) if result.cubin else None,
               "ptx": result.ptx, "spec": spec, "time": do_time, "timing": timing or {}}
    r = await lane.request("evaluate", payload, timeout_s=timeout_s)
    status = "verified" if r.ok else "rejected"
    return Evaluation(status, r.category, r.message, result.seconds, result.log, result.cached, r.payload,
                      time.perf_counter() - t0, r.restarted)
