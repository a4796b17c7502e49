"""Engine side of an evaluation: make sure the card is loaded, hand the lane a compiled candidate.

Compiling is the caller's: a candidate is compiled once, and its Evaluation reports that compile."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.cards import CardRef
from engine.compile import CompileResult
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


def compile_rejection(compiled: CompileResult) -> Evaluation:
    """The Evaluation of a candidate that did not compile (no lane is asked)."""
    return Evaluation("rejected", "compile", compiled.summary(), compiled.seconds, compiled.log, compiled.cached)


async def ensure_loaded(lane: GpuLane, card: CardRef) -> None:
    """Load the card's samples in the lane's worker (sticky: loaded again in a replacement worker)."""
    r = await lane.request("load_card", {"card_id": card.card_id, "op": card.op, "signature": card.signature,
                                         "outputs": card.outputs, "bytes": card.bytes, "samples": card.samples},
                           sticky_key=f"card:{card.card_id}")
    if not r.ok:
        raise RuntimeError(f"card {card.card_id} could not be loaded in {lane.name}: {r.category}: {r.message}")


async def evaluate(lane: GpuLane, card: CardRef, compiled: CompileResult, spec: str | dict, *,
                   timing: dict[str, Any] | None = None, do_time: bool = True,
                   timeout_s: float | None = None) -> Evaluation:
    """Verify (and time) the compiled candidate on the card in the lane; one that did not compile is rejected."""
    if not compiled.ok:
        return compile_rejection(compiled)
    t0 = time.perf_counter()
    await ensure_loaded(lane, card)
    payload = {"card_id": card.card_id, "cubin": b64(compiled.cubin) if compiled.cubin else None,
               "ptx": compiled.ptx, "spec": spec, "time": do_time, "timing": timing or {}}
    r = await lane.request("evaluate", payload, timeout_s=timeout_s)
    status = "verified" if r.ok else "rejected"
    return Evaluation(status, r.category, r.message, compiled.seconds, compiled.log, compiled.cached, r.payload,
                      time.perf_counter() - t0, r.restarted)
