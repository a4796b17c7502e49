"""The orchestrator's Recorder over the workspace store: every step is one committed transaction,
so a run killed at any moment resumes from what is on disk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.propose.base import Proposal, Usage
from engine.run.orchestrator import CandidateRecord
from engine.store import Store

ProgressSink = Callable[[str, dict[str, Any], str | None, Any], None]


class StoreRecorder:
    def __init__(self, store: Store, run_id: str, progress: ProgressSink | None = None):
        self.store = store
        self.run_id = run_id
        self.progress = progress
        self.orchestrator = None  # set by the caller, for progress lines
        self._status: tuple[str, str | None] | None = None

    async def candidate_proposed(self, rec: CandidateRecord) -> str | None:
        p = rec.proposal
        llm_call_id = None
        if p.prompt or p.response:
            llm_call_id = await self.store.add_llm_call(
                self.run_id, rec.card_id, p.provider, p.model, p.prompt, p.response, p.usage.tokens_in,
                p.usage.tokens_out, p.usage.cost_usd, p.usage.latency_s,
                error=p.reason if p.category == "provider" else None)
        cid, created = await self.store.add_candidate(
            self.run_id, rec.card_id, candidate_id=rec.id, parent_id=rec.parent_id, source=p.source,
            launch_spec=p.spec, proposer=p.provider, model_name=p.model, llm_call_id=llm_call_id,
            status=rec.status, category=rec.category, intent=p.intent, params=p.params, focus=rec.focus)
        return cid if created else None

    async def candidate_evaluating(self, rec: CandidateRecord) -> None:
        await self.store.update_candidate(rec.id, status="evaluating")

    async def candidate_finished(self, rec: CandidateRecord) -> None:
        await self.store.update_candidate(rec.id, **self._finished_fields(rec))

    async def candidate_evaluated(self, rec: CandidateRecord, payload: dict[str, Any], card_id: str) -> None:
        """The candidate's result and its `evaluated` event, written together (one transaction)."""
        await self.store.finish_candidate(rec.id, self._finished_fields(rec), self.run_id, "evaluated", payload,
                                          card_id)
        if self.progress:
            self.progress("evaluated", payload, card_id, self.orchestrator)

    @staticmethod
    def _finished_fields(rec: CandidateRecord) -> dict[str, Any]:
        fields: dict[str, Any] = {"status": rec.status, "category": rec.category, "error": rec.message or None}
        if rec.compile_log:
            fields["compile_log"] = rec.compile_log
        verdict = rec.payload.get("verdict")
        if verdict:
            fields["verification"] = verdict
        if rec.payload.get("timing"):
            fields["timing"] = rec.payload["timing"]
        if rec.best_us is not None:
            fields.update(best_us=rec.best_us, eager_us=rec.eager_us, speedup=rec.speedup)
            if rec.speedup_ci:
                fields.update(speedup_low=rec.speedup_ci[0], speedup_high=rec.speedup_ci[1])
        return fields

    async def lane_busy(self, candidate_id: str, lane: str) -> int:
        return await self.store.start_evaluation(self.run_id, candidate_id, lane)

    async def lane_free(self, token: int, status: str, category: str | None) -> None:
        await self.store.finish_evaluation(token, status, category)

    async def search_nodes(self, card_id: str, nodes: list[dict[str, Any]]) -> None:
        await self.store.save_search_nodes(self.run_id, card_id, nodes)

    async def usage(self, tokens_in: int, tokens_out: int, cost_usd: float) -> None:
        t = self.orchestrator.totals if self.orchestrator else None
        if t is not None:
            await self.store.update_run(self.run_id, tokens_in=t.tokens_in, tokens_out=t.tokens_out,
                                        cost_usd=t.cost_usd)

    async def event(self, kind: str, payload: dict[str, Any], card_id: str | None = None) -> None:
        await self.store.add_event(self.run_id, kind, payload, card_id)
        if self.progress:
            self.progress(kind, payload, card_id, self.orchestrator)

    async def controls(self) -> list[dict[str, Any]]:
        return await self.store.pending_controls(self.run_id)

    async def consume(self, seq: int) -> None:
        await self.store.consume_control(seq)

    async def status(self, status: str, stopped_by: str | None = None) -> None:
        if self._status == (status, stopped_by):
            return
        if self._status is None:  # this process starts (or resumes) the run: lanes a killed one held are free
            await self.store.close_open_evaluations(self.run_id)
        self._status = (status, stopped_by)
        await self.store.update_run(self.run_id, status=status, stopped_by=stopped_by)


async def load_records(store: Store, run_id: str) -> list[CandidateRecord]:
    """The run's candidates as the orchestrator restores them (results included when finished)."""
    out = []
    for c in await store.candidates(run_id):
        p = Proposal(source=c["source"], spec=c["launch_spec"] if isinstance(c["launch_spec"], str) else "",
                     intent=c.get("intent") or "", params=c.get("params"), provider=c["proposer"],
                     model=c.get("model_name") or "", usage=Usage())
        rec = CandidateRecord(c["id"], c["card_id"], c["parent_id"], p, status=c["status"],
                              category=c["category"], message=c.get("error") or "", best_us=c["best_us"],
                              eager_us=c.get("eager_us"), speedup=c["speedup"], focus=c.get("focus"))
        if c.get("speedup_low") is not None:
            rec.speedup_ci = (c["speedup_low"], c["speedup_high"])
        if c.get("timing"):
            rec.payload["timing"] = c["timing"]
        if rec.status in ("proposed", "evaluating") and not p.source:
            rec.status, rec.category = "rejected", rec.category or "empty"
        out.append(rec)
    return out
