"""Replay: re-serve the answers an earlier run recorded, in order, per card — offline and deterministic.

The n-th `propose` call for a card gets the n-th candidate the source run stored for that card
(whatever proposed it), with the prompt and response of its LLM call when that is still stored. When a
card's recorded answers run out, the proposer declines. Duplicates the store refused to insert twice
were never recorded, so a replay serves each distinct answer once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Proposal, ProposalRequest
from engine.store.store import Store


class ReplayProposer:
    """A Proposer that serves the recorded candidates of `source_run_id`; no tokens, no cost."""

    name = "replay"

    def __init__(self, store: Store, source_run_id: str) -> None:
        self.store = store
        self.source_run_id = source_run_id
        self._served: dict[str, int] = {}
        self._recorded: dict[str, list[dict[str, Any]]] | None = None
        self._lock = asyncio.Lock()

    def supports(self, card: OperatorCard) -> bool:
        # Whether a card has recordings is only known after an async load; propose() declines if not.
        return True

    async def propose(self, request: ProposalRequest) -> Proposal:
        card_id = request.card.card_id
        # Reserve the slot before any await, so the answers follow the order of the calls.
        k = self._served.get(card_id, 0)
        self._served[card_id] = k + 1
        recorded = (await self._load()).get(card_id, [])
        if k >= len(recorded):
            what = "no answers" if not recorded else f"{len(recorded)} answer(s), all served"
            return Proposal(declined=True, provider=self.name,
                            reason=f"replay of run {self.source_run_id}: {what} recorded for card {card_id}")
        row = recorded[k]
        call = await self.store.get_llm_call(row["llm_call_id"]) if row.get("llm_call_id") else None
        unusable = row.get("status") == "unusable"
        return Proposal(
            source=row["source"],
            spec=_spec_text(row.get("launch_spec")),
            provider=self.name,
            model=row.get("model_name") or row.get("proposer") or "",
            prompt=(call or {}).get("prompt") or "",
            response=(call or {}).get("response") or "",
            category=(row.get("category") or "no-code") if unusable else None,
            reason=(row.get("error") or "") if unusable else "",
        )

    async def _load(self) -> dict[str, list[dict[str, Any]]]:
        async with self._lock:
            if self._recorded is None:
                by_card: dict[str, list[dict[str, Any]]] = {}
                for row in await self.store.candidates(self.source_run_id):
                    by_card.setdefault(row["card_id"], []).append(row)
                self._recorded = by_card
        return self._recorded


def _spec_text(spec: Any) -> str:
    """The stored spec as text: spec text is stored as is; a dict (parsed spec) is served as JSON."""
    if spec is None or spec == {}:
        return ""
    return spec if isinstance(spec, str) else json.dumps(spec)
