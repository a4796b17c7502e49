"""The run's eager baselines: a lane measures each card's eager latency, the run writes it on the card;
then the card's two references beside eager, timed the same way: the lane's copy of its bytes, and its
eager under torch.compile."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from engine.cards import CardRef
from engine.lane.client import GpuLane
from engine.lane.eager import CardProgress, measure_compiled, measure_copy, measure_eager, tell
from engine.store import Store

COMPILE_TIMEOUT_S = 120.0      # one card's torch.compile (max-autotune included), compile and timing
COMPILE_BUDGET_S = 900.0       # all cards' together: past it the rest say so instead of compiling


async def measure_and_store_eager(lane: GpuLane, store: Store, capture_id: str, cards: Iterable[CardRef],
                                  progress: CardProgress | None = None) -> dict[str, dict]:
    """Measure eager for `cards` in `lane`; store eager_us, roofline_us and the stats of each one measured
    (with the seconds its loading and timing took). `progress` hears of each card as it is done.

    Returns measure_eager's {card_id: lane payload or {'error': …}}; cards with an error keep what they had.
    """
    results = await measure_eager(lane, cards, progress)
    for card_id, r in results.items():
        if "error" in r:
            continue
        eager = r["eager"]
        await store.update_card_eager(capture_id, card_id, eager["median"], r.get("roofline_us"),
                                      {**eager, "throttled": r.get("throttled", 0), "seconds": r.get("seconds")})
    return results


async def measure_and_store_references(lane: GpuLane, store: Store, capture_id: str, cards: Iterable[CardRef], *,
                                       compile: bool = True, mode: str | None = None,
                                       timeout_s: float = COMPILE_TIMEOUT_S,
                                       budget_s: float = COMPILE_BUDGET_S,
                                       progress: CardProgress | None = None) -> dict[str, dict[str, Any]]:
    """Time each card's references in `lane` and store them: copy_us always (where the card has floor
    bytes), compile_us when `compile` (each compile bounded by `timeout_s`, all by `budget_s`). A card
    torch.compile cannot take keeps the reason in its ref_stats ("no compile reference (reason)").

    Returns {card_id: {'copy': payload or {'error'}, 'compile': payload or {'error'} (when asked)}}.
    `progress` hears of each card as its references are done, with the seconds of each part."""
    cards = list(cards)
    copies = await measure_copy(lane, cards)  # the worker knows the bytes (a chain card's are its own count)
    out: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    for i, card in enumerate(cards, 1):
        stats: dict[str, Any] = {}
        copy = copies[card.card_id]
        seconds = {"copy": (copy.get("seconds") or {}).get("measure", 0.0)}
        stats["copy"] = ({**copy["copy"], "bytes": copy["bytes"], "throttled": copy.get("throttled", 0),
                          "seconds": copy.get("seconds")} if "copy" in copy else {"error": copy["error"]})
        if compile:
            t1 = time.monotonic()
            if t1 - t0 > budget_s:
                got: dict[str, Any] = {"error": f"the run's {budget_s:.0f} s for compile references was spent",
                                       "untried": True}
            else:
                got = await measure_compiled(lane, card, mode=mode, timeout_s=timeout_s)
            seconds["compile"] = round(time.monotonic() - t1, 3)
            stats["compile"] = ({**got["compiled"], "mode": got.get("mode"), "compile_s": got.get("compile_s"),
                                 "throttled": got.get("throttled", 0), "seconds": seconds["compile"]}
                                if "compiled" in got else {"error": got["error"], "seconds": seconds["compile"],
                                                           **({"untried": True} if got.get("untried") else {})})
        await tell(progress, i, len(cards), card, seconds)
        out[card.card_id] = stats
        await store.update_card_refs(capture_id, card.card_id,
                                     compile_us=(stats.get("compile") or {}).get("median"),
                                     copy_us=stats["copy"].get("median"), ref_stats=stats)
    return out
