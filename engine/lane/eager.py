"""Eager latency per card, measured in a lane with the same protocol as candidates (the run stores it)."""

from __future__ import annotations

from collections.abc import Iterable

from engine.cards import CardRef
from engine.lane.client import GpuLane
from engine.lane.evaluate import ensure_loaded


async def measure_eager(lane: GpuLane, cards: Iterable[CardRef]) -> dict[str, dict]:
    """Time eager for each card (L2 flushed, adaptive repetitions): {card_id: lane payload or {'error': …}}.

    A payload has 'eager' (TimingStats fields), 'throttled' and 'roofline_us'. Cards without samples are skipped.
    """
    return await _per_card(lane, cards, "time_eager")


async def _per_card(lane: GpuLane, cards: Iterable[CardRef], request: str) -> dict[str, dict]:
    """One lane request per card with samples (loaded first): {card_id: payload or {'error': …}}."""
    results: dict[str, dict] = {}
    for card in cards:
        if not card.samples:
            results[card.card_id] = {"error": "no samples"}
            continue
        await ensure_loaded(lane, card)
        r = await lane.request(request, {"card_id": card.card_id})
        results[card.card_id] = r.payload if r.ok else {"error": f"{r.category}: {r.message}"}
    return results


async def measure_copy(lane: GpuLane, cards: Iterable[CardRef]) -> dict[str, dict]:
    """Time the lane's own copy of each card's floor bytes: {card_id: lane payload or {'error': …}}.

    A payload has 'copy' (TimingStats fields), 'bytes' and 'throttled'."""
    return await _per_card(lane, cards, "time_copy")


async def measure_compiled(lane: GpuLane, card: CardRef, *, mode: str | None = None,
                           timeout_s: float = 120.0) -> dict:
    """Time the card's eager under torch.compile in the lane: its payload ('compiled' TimingStats fields,
    'mode', 'compile_s', 'throttled') or {'error': reason}. A compile that outlasts `timeout_s` costs the
    worker (killed and replaced), never the run."""
    if not card.samples:
        return {"error": "no samples"}
    await ensure_loaded(lane, card)
    r = await lane.request("time_compiled", {"card_id": card.card_id, "mode": mode}, timeout_s=timeout_s)
    if r.ok:
        return r.payload
    if r.category == "timeout":
        return {"error": f"torch.compile did not finish in {timeout_s:.0f} s"}
    return {"error": r.message if r.category in ("compile", "mismatch") else f"{r.category}: {r.message}"}
