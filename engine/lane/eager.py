"""Eager latency per card, measured in a lane with the same protocol as candidates (the run stores it)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable
from typing import Any

from engine.cards import CardRef
from engine.lane.client import GpuLane
from engine.lane.evaluate import ensure_loaded

# Called after each card of a per-card request: (cards done, cards in all, the card, its seconds: 'load' for
# loading its samples into the worker, 'measure' for the request itself).
CardProgress = Callable[[int, int, CardRef, dict[str, float]], Any]  # may return an awaitable


async def measure_eager(lane: GpuLane, cards: Iterable[CardRef],
                        progress: CardProgress | None = None) -> dict[str, dict]:
    """Time eager for each card (L2 flushed, adaptive repetitions): {card_id: lane payload or {'error': …}}.

    A payload has 'eager' (TimingStats fields), 'throttled', 'roofline_us' and 'seconds' (what loading the
    card and timing it took). Cards without samples are skipped.
    """
    return await _per_card(lane, cards, "time_eager", progress)


async def _per_card(lane: GpuLane, cards: Iterable[CardRef], request: str,
                    progress: CardProgress | None = None) -> dict[str, dict]:
    """One lane request per card with samples (loaded first): {card_id: payload or {'error': …}}; a payload
    also has 'seconds': {'load', 'measure'} (a card's samples can be gigabytes: where a run's time before
    its search goes)."""
    results: dict[str, dict] = {}
    cards = list(cards)
    for i, card in enumerate(cards, 1):
        if not card.samples:
            results[card.card_id] = {"error": "no samples"}
            continue
        t0 = time.monotonic()
        await ensure_loaded(lane, card)
        t1 = time.monotonic()
        r = await lane.request(request, {"card_id": card.card_id})
        seconds = {"load": round(t1 - t0, 3), "measure": round(time.monotonic() - t1, 3)}
        results[card.card_id] = ({**r.payload, "seconds": seconds} if r.ok
                                 else {"error": f"{r.category}: {r.message}"})
        await tell(progress, i, len(cards), card, seconds)
    return results


async def tell(progress: CardProgress | None, i: int, n: int, card: CardRef, seconds: dict[str, float]) -> None:
    """Call `progress` for the i-th of n cards, awaiting what it returns where that is awaitable."""
    if progress is not None:
        said = progress(i, n, card, seconds)
        if inspect.isawaitable(said):
            await said


async def measure_copy(lane: GpuLane, cards: Iterable[CardRef],
                       progress: CardProgress | None = None) -> dict[str, dict]:
    """Time the lane's own copy of each card's floor bytes: {card_id: lane payload or {'error': …}}.

    A payload has 'copy' (TimingStats fields), 'bytes', 'throttled' and 'seconds'."""
    return await _per_card(lane, cards, "time_copy", progress)


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
