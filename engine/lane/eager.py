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
    results: dict[str, dict] = {}
    for card in cards:
        if not card.samples:
            results[card.card_id] = {"error": "no samples"}
            continue
        await ensure_loaded(lane, card)
        r = await lane.request("time_eager", {"card_id": card.card_id})
        results[card.card_id] = r.payload if r.ok else {"error": f"{r.category}: {r.message}"}
    return results
