"""Eager latency per card, measured in a lane with the same protocol as candidates, stored on the card."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from engine.cards import CardRef, card_from_row
from engine.lane.client import GpuLane
from engine.lane.evaluate import ensure_loaded
from engine.store import Store


async def card_refs(store: Store, workspace: Path, capture_id: str) -> list[CardRef]:
    """The capture's cards as the lane needs them (signature, outputs, bytes, sample paths)."""
    refs = []
    for c in await store.get_cards(capture_id):
        samples = [str(workspace / s["path"]) for s in await store.get_samples(capture_id, c["card_id"])]
        refs.append(card_from_row(c).ref(samples))
    return refs


async def measure_eager(lane: GpuLane, store: Store, capture_id: str, cards: Iterable[CardRef]) -> dict[str, dict]:
    """Time eager for each card (L2 flushed, adaptive repetitions) and store eager_us and roofline_us.

    Cards without samples are skipped. Returns {card_id: lane payload or {'error': …}}.
    """
    results: dict[str, dict] = {}
    for card in cards:
        if not card.samples:
            results[card.card_id] = {"error": "no samples"}
            continue
        await ensure_loaded(lane, card)
        r = await lane.request("time_eager", {"card_id": card.card_id})
        if not r.ok:
            results[card.card_id] = {"error": f"{r.category}: {r.message}"}
            continue
        eager = r.payload["eager"]
        await store.update_card_eager(capture_id, card.card_id, eager["median"], r.payload.get("roofline_us"),
                                      {**eager, "throttled": r.payload.get("throttled", 0)})
        results[card.card_id] = r.payload
    return results
