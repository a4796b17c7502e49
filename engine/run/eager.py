"""The run's eager baselines: a lane measures each card's eager latency, the run writes it on the card."""

from __future__ import annotations

from collections.abc import Iterable

from engine.cards import CardRef
from engine.lane.client import GpuLane
from engine.lane.eager import measure_eager
from engine.store import Store


async def measure_and_store_eager(lane: GpuLane, store: Store, capture_id: str,
                                  cards: Iterable[CardRef]) -> dict[str, dict]:
    """Measure eager for `cards` in `lane`; store eager_us, roofline_us and the stats of each one measured.

    Returns measure_eager's {card_id: lane payload or {'error': …}}; cards with an error keep what they had.
    """
    results = await measure_eager(lane, cards)
    for card_id, r in results.items():
        if "error" in r:
            continue
        eager = r["eager"]
        await store.update_card_eager(capture_id, card_id, eager["median"], r.get("roofline_us"),
                                      {**eager, "throttled": r.get("throttled", 0)})
    return results
