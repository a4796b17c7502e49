"""Replay: re-serve the answers an earlier run recorded, in order, per card — offline and deterministic.

The n-th `propose` call for a card gets the n-th candidate the source run stored for that card
(whatever proposed it), with the prompt and response of its LLM call when that is still stored. When a
card's recorded answers run out, the proposer declines. Duplicates the store refused to insert twice
were never recorded, so a replay serves each distinct answer once. Unusable answers are served unusable
again (same category and reason), so the repair loop takes the same steps as in the recorded run.

    proposer = ReplayProposer(store, "run-3f9c0a1b2c3d")   # `kforge-tui run --provider replay --replay-run RUN`
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from engine.cards import OperatorCard
from engine.propose.answer import UNUSABLE
from engine.propose.base import Proposal, ProposalRequest
from engine.store.store import Store

# Categories of answers that were never evaluated (the orchestrator stores them as rejected candidates).
UNUSABLE_ANSWERS = frozenset({*UNUSABLE, "provider"})


class ReplayProposer:
    """A Proposer that serves the recorded candidates of `source_run_id`; no tokens, no cost."""

    name = "replay"

    def __init__(self, store: Store, source_run_id: str, *, resumed_run: str | None = None) -> None:
        self.store = store
        self.source_run_id = source_run_id
        # The replay's own run when it is resumed: answers that run already stored are not served again.
        self.resumed_run = resumed_run
        self._served: dict[str, int] = {}
        self._recorded: dict[str, list[dict[str, Any]]] | None = None
        self._cards: set[str] | None = None          # cards with recordings (served or not)
        self._lock = asyncio.Lock()
        # Whether to take repair requests: as the recorded run did (known once loaded, see `load`).
        self.repairs = False

    def supports(self, card: OperatorCard) -> bool:
        # Cards the recorded run never proposed for stay on eager, as they did there. Before `load` this
        # is not known yet: every card is tried, and propose() declines those without recordings.
        return self._cards is None or card.card_id in self._cards

    async def propose(self, request: ProposalRequest) -> Proposal:
        card_id = request.card.card_id
        # Reserve the slot before any await, so the answers follow the order of the calls.
        k = self._served.get(card_id, 0)
        self._served[card_id] = k + 1
        recorded = (await self.load()).get(card_id, [])
        if k >= len(recorded):
            what = "no answers" if not recorded else f"{len(recorded)} answer(s), all served"
            return Proposal(declined=True, provider=self.name,
                            reason=f"replay of run {self.source_run_id}: {what} recorded for card {card_id}")
        row = recorded[k]
        call = await self.store.get_llm_call(row["llm_call_id"]) if row.get("llm_call_id") else None
        unusable = row.get("status") == "unusable" or (row.get("status") == "rejected"
                                                       and row.get("category") in UNUSABLE_ANSWERS)
        return Proposal(
            source=row["source"],
            spec=_spec_text(row.get("launch_spec")),
            intent=row.get("intent") or "",
            params=row.get("params"),
            provider=self.name,
            model=row.get("model_name") or row.get("proposer") or "",
            prompt=(call or {}).get("prompt") or "",
            response=(call or {}).get("response") or "",
            category=(row.get("category") or "no-code") if unusable else None,
            reason=(row.get("error") or "") if unusable else "",
        )

    async def load(self) -> dict[str, list[dict[str, Any]]]:
        """The recorded candidates by card, read once."""
        async with self._lock:
            if self._recorded is None:
                rows = await self.store.candidates(self.source_run_id)
                # By content, not by count: a session killed with proposals in flight stored some of
                # what it was served and not the rest; the rest is served again.
                stored = Counter(_answer_key(r) for r in await self.store.candidates(self.resumed_run)) \
                    if self.resumed_run else Counter()
                by_card: dict[str, list[dict[str, Any]]] = {}
                for row in rows:
                    key = _answer_key(row)
                    if stored[key] > 0:
                        stored[key] -= 1
                        continue
                    by_card.setdefault(row["card_id"], []).append(row)
                # Take repair requests when the recorded proposer did: an LLM (its answers have an LLM
                # call), or any proposer with a child of a failed candidate (the search never expands
                # one, so such a child is a repair).
                rejected = {r["id"] for r in rows if r["status"] == "rejected"}
                self.repairs = any(r.get("llm_call_id") or r["parent_id"] in rejected for r in rows)
                self._cards = {r["card_id"] for r in rows}
                self._recorded = by_card
        return self._recorded


def _answer_key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """What identifies one served answer in the run that stored it (an unusable one by its reason)."""
    source = " ".join(row["source"].split())
    return (row["card_id"], source, " ".join(_spec_text(row.get("launch_spec")).split()),
            "" if source else row.get("error") or "")


def _spec_text(spec: Any) -> str:
    """The stored spec as text: spec text is stored as is; a dict (parsed spec) is served as JSON."""
    if spec is None or spec == {}:
        return ""
    return spec if isinstance(spec, str) else json.dumps(spec)
