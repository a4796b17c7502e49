"""The orchestrator end to end with a scripted proposer and StandInLane (a test double: a CPU stand-in
for the GPU lane whose latencies and speedups come from a deterministic cost model)."""

import asyncio
import dataclasses
import hashlib
import itertools

import pytest

from engine.cards import OperatorCard
from engine.lane.evaluate import Evaluation
from engine.propose.base import Proposal, Usage
from engine.run.orchestrator import Budgets, Orchestrator
from engine.run.plan import CardState


class MemoryRecorder:
    def __init__(self):
        self.candidates, self.events, self.control_rows, self.statuses = {}, [], [], []
        self.hashes = set()
        self.seq = itertools.count(1)

    async def candidate_proposed(self, rec):
        key = (rec.card_id, rec.proposal.source)
        if key in self.hashes:
            return None
        self.hashes.add(key)
        self.candidates[rec.id] = rec.status
        return rec.id

    async def candidate_evaluating(self, rec):
        self.candidates[rec.id] = "evaluating"

    async def candidate_finished(self, rec):
        self.candidates[rec.id] = rec.status

    async def usage(self, *a):
        pass

    async def event(self, kind, payload, card_id=None):
        self.events.append((kind, card_id, payload))

    async def controls(self):
        rows, self.control_rows = self.control_rows, []
        return rows

    async def consume(self, seq):
        pass

    async def status(self, status, stopped_by=None):
        self.statuses.append((status, stopped_by))

    def control(self, command, card_id=None, **args):
        self.control_rows.append({"seq": next(self.seq), "command": command, "card_id": card_id, "args": args})


class ScriptedProposer:
    """Returns distinct sources; records when each call ran. Optional tokens per call."""

    name = "scripted"

    def __init__(self, delay=0.03, tokens=0):
        self.delay, self.tokens, self.calls, self.n = delay, tokens, [], itertools.count()

    def supports(self, card):
        return True

    async def propose(self, request):
        t0 = asyncio.get_running_loop().time()
        await asyncio.sleep(self.delay)
        self.calls.append((t0, asyncio.get_running_loop().time(), request.card.card_id))
        n = next(self.n)
        return Proposal(source=f"// kernel {n} for {request.card.card_id}\n", spec="[[launch]]", intent="x",
                        usage=Usage(tokens_in=self.tokens, tokens_out=self.tokens))


class StandInLane:
    """Test double of a GPU lane: one evaluation at a time, deterministic cost model."""

    def __init__(self, latency=0.01):
        self.latency, self.busy, self.intervals = latency, asyncio.Lock(), []

    async def __call__(self, card, proposal):
        async with self.busy:
            t0 = asyncio.get_running_loop().time()
            await asyncio.sleep(self.latency)
            self.intervals.append((t0, asyncio.get_running_loop().time()))
        h = int(hashlib.sha256(proposal.source.encode()).hexdigest()[:8], 16)
        if h % 5 == 0:
            return Evaluation("rejected", "mismatch", "out0: 3 elements differ", 0.01)
        eager = card.eager_us
        t = eager / (1.0 + (h % 100) / 50.0)
        return Evaluation("verified", None, "", 0.01, payload={"timing": {
            "eager": {"median": eager}, "candidate": {"median": t}, "speedup": eager / t,
            "speedup_ci": [eager / t * 0.98, eager / t * 1.02]}})


def card(cid, share=0.3, eager=50.0, roofline=5.0):
    sig = {"op": "aten::gelu", "args": [], "aliases": []}
    return CardState(OperatorCard(cid, "aten::gelu", sig, bytes=1000, eager_us=eager, roofline_us=roofline,
                                  share=share), ["s0"])


def orchestrator(cards, proposer, lane, recorder, **kw):
    ids = (f"c{i}" for i in itertools.count())
    return Orchestrator(cards=cards, proposer=proposer, evaluate=lane, recorder=recorder,
                        new_id=lambda: next(ids), poll_s=0.005, **kw)


async def test_proposals_overlap_while_lane_evaluations_never_do():
    rec, prop, lane = MemoryRecorder(), ScriptedProposer(delay=0.05), StandInLane(latency=0.01)
    o = orchestrator([card("a"), card("b", 0.2)], prop, lane, rec, budgets=Budgets(iterations_per_card=8),
                     max_proposals=4)
    stopped = await o.run()
    assert stopped == "iterations"
    calls = sorted(prop.calls)
    assert any(b[0] < a[1] for a, b in zip(calls, calls[1:])), "proposer calls should overlap"
    ev = sorted(lane.intervals)
    assert all(b[0] >= a[1] for a, b in zip(ev, ev[1:])), "lane evaluations must never overlap"
    assert len(ev) == 16 and all(c.iterations == 8 for c in o.cards.values())
    assert rec.statuses[-1] == ("done", "iterations")


async def test_each_card_stops_at_its_iteration_budget_and_search_revises_winners():
    rec = MemoryRecorder()
    o = orchestrator([card("a")], ScriptedProposer(0.0), StandInLane(0.0), rec, budgets=Budgets(iterations_per_card=12))
    await o.run()
    tree = o.trees["a"]
    assert o.cards["a"].iterations == 12
    depths = [len(tree.path(n)) - 1 for n in tree.nodes if n != "root"]
    assert max(depths) >= 2, "MCTS should revise verified candidates, not only start fresh ones"
    best = o.cards["a"].best_us
    assert best == min(r.best_us for r in o.records.values() if r.best_us)


async def test_wall_time_and_token_budgets_stop_the_run_cleanly():
    t = [0.0]
    rec = MemoryRecorder()
    o = orchestrator([card("a")], ScriptedProposer(0.01), StandInLane(0.0), rec,
                     budgets=Budgets(iterations_per_card=1000, wall_s=5.0), clock=lambda: t[0])

    async def tick():
        while True:
            await asyncio.sleep(0.01)
            t[0] += 1.0

    ticker = asyncio.create_task(tick())
    assert await o.run() == "wall_time"
    ticker.cancel()
    assert all(s in ("verified", "rejected") for s in rec.candidates.values()), "in-flight work was finished"
    o2 = orchestrator([card("a")], ScriptedProposer(0.0, tokens=500), StandInLane(0.0), MemoryRecorder(),
                      budgets=Budgets(iterations_per_card=1000, tokens=10_000))
    assert await o2.run() == "tokens"
    assert o2.totals.tokens_in + o2.totals.tokens_out >= 10_000


class VirtualLane(StandInLane):
    """A lane whose evaluations each take 5 units of a virtual clock `t` (a one-element list), one at a time."""

    def __init__(self, t):
        super().__init__(0.0)
        self.t = t

    async def __call__(self, card, proposal):
        async with self.busy:
            await asyncio.sleep(0)
            self.t[0] += 5.0
        return await StandInLane(0.0)(card, proposal)


async def test_a_wall_time_run_starts_no_task_it_cannot_finish_in_time():
    """Four tasks in flight queue on one lane: started up to the last moment, they ran past the wall time by up to
    four evaluations (the SD3.5 VAE's 480 s run was still evaluating at 494 s and was killed). Virtual time: each
    evaluation takes 5 units of the orchestrator's clock."""
    t = [0.0]
    rec = MemoryRecorder()
    o = orchestrator([card("a"), card("b", 0.2)], ScriptedProposer(0.0), VirtualLane(t), rec, max_proposals=4,
                     budgets=Budgets(iterations_per_card=1000, wall_s=100.0), clock=lambda: t[0])
    assert await o.run() == "wall_time"
    assert 15 <= o.totals.evaluations <= 20, o.totals.evaluations  # the lane was kept busy to the end
    assert t[0] <= 100.0 + 5.0, f"the search ended at {t[0]} for a wall time of 100"
    assert all(s in ("verified", "rejected") for s in rec.candidates.values()), "in-flight work was finished"


async def test_a_run_whose_every_card_finished_says_so_even_near_its_wall_time():
    """Four evaluations of 5 units, all four of the card's budget in flight from the start, a wall time of 22:
    the guard would hold back a fifth task at 15, but there is none to start. The run ends by its iterations,
    not its wall time."""
    t = [0.0]
    o = orchestrator([card("a")], ScriptedProposer(0.0), VirtualLane(t), MemoryRecorder(), max_proposals=4,
                     budgets=Budgets(iterations_per_card=4, wall_s=22.0), clock=lambda: t[0])
    assert await o.run() == "iterations"
    assert o.totals.evaluations == 4 and t[0] == 20.0


async def test_the_wall_time_guard_times_only_tasks_that_evaluated():
    """Declines and duplicates end at once without an evaluation. Late in a run, when the builtin spaces run
    dry, they are most tasks: timed too, they would pull the estimate of a task's time to zero and the guard
    would start evaluations it cannot finish by the wall time."""
    t = [0.0]
    o = orchestrator([card("a")], ScriptedProposer(0.0), StandInLane(0.0), MemoryRecorder(),
                     budgets=Budgets(iterations_per_card=100, wall_s=100.0), clock=lambda: t[0])

    async def task(evaluated: bool, seconds: float) -> bool:
        t[0] += seconds
        return evaluated

    await o._timed(task(True, 20.0))
    for _ in range(8):
        await o._timed(task(False, 0.0))
    assert o._task_s == [20.0]
    t[0] = 85.0
    assert o._no_time_for_another(start=0.0)  # 15 s left; a task that evaluates takes 20
    t[0] = 70.0
    assert not o._no_time_for_another(start=0.0)


async def test_control_rows_pause_resume_stop_and_prioritize():
    rec = MemoryRecorder()
    cards = [card("big", share=0.5), card("small", share=0.05)]
    o = orchestrator(cards, ScriptedProposer(0.0), StandInLane(0.02), rec, budgets=Budgets(iterations_per_card=40),
                     max_proposals=1)
    rec.control("prioritize", "small", factor=100.0)
    rec.control("pause")
    task = asyncio.create_task(o.run())
    await asyncio.sleep(0.1)
    assert o.totals.proposals == 0 and ("paused", None) in rec.statuses
    rec.control("resume")
    await asyncio.sleep(0.1)
    assert o.totals.proposals > 0
    first = next(cid for kind, cid, _ in rec.events if kind == "evaluated")
    assert first == "small", "a prioritised card goes first"
    ev = next(payload for kind, _, payload in rec.events if kind == "evaluated")
    assert isinstance(ev["compile_ms"], float) and isinstance(ev["compile_cached"], bool)  # for the harness report
    rec.control("stop")
    assert await asyncio.wait_for(task, 5) == "user"
    assert rec.statuses[-1] == ("stopped", "user")


async def test_declining_proposer_leaves_the_card_on_eager():
    class Declines:
        name = "decl"

        def supports(self, c):
            return False

        async def propose(self, r):
            return Proposal(declined=True, reason="no template")

    rec = MemoryRecorder()
    o = orchestrator([card("a")], Declines(), StandInLane(0.0), rec)
    assert await o.run() == "iterations"
    assert o.cards["a"].done_reason == "declined" and not rec.candidates


class ThreeThenNothing:
    """Three revisions for card x, then it declines every parent; card y always has another."""

    name = "three"

    def __init__(self):
        self.n = itertools.count()

    def supports(self, c):
        return True

    async def propose(self, r):
        n = next(self.n)
        if r.card.card_id == "x" and n >= 3:
            return Proposal(declined=True, reason="every neighbour of this parent was tried already")
        return Proposal(source=f"// {r.card.card_id} {n}\n", spec="[[launch]]")


class ProgressRecorder(MemoryRecorder):
    """A MemoryRecorder that also hands each event to `sink(kind, payload, card_id, orchestrator)`, as run --no-tui's
    Progress gets them; `orchestrator` is set once the orchestrator is made."""

    def __init__(self, sink):
        super().__init__()
        self.sink, self.orchestrator = sink, None

    async def event(self, kind, payload, card_id=None):
        await super().event(kind, payload, card_id)
        self.sink(kind, payload, card_id, self.orchestrator)


async def test_every_card_of_a_finished_run_says_how_it_finished():
    rec = MemoryRecorder()
    prop = ThreeThenNothing()
    o = orchestrator([card("x"), card("y", 0.2)], prop, StandInLane(0.0), rec,
                     budgets=Budgets(iterations_per_card=6), max_proposals=1)
    assert await o.run() == "iterations"
    done = {cid: p["reason"] for kind, cid, p in rec.events if kind == "card_done"}
    assert done == {"x": "exhausted", "y": "iterations"}
    assert o.cards["x"].iterations < 6 and o.cards["y"].iterations == 6


async def test_duplicate_sources_are_not_evaluated_twice():
    class Same:
        name = "same"

        def supports(self, c):
            return True

        async def propose(self, r):
            return Proposal(source="// same\n", spec="x")

    lane = StandInLane(0.0)
    o = orchestrator([card("a")], Same(), lane, MemoryRecorder(), budgets=Budgets(iterations_per_card=5))
    await o.run()
    assert len(lane.intervals) == 1


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
async def test_other_strategies_run_to_budget(strategy):
    o = orchestrator([card("a")], ScriptedProposer(0.0), StandInLane(0.0), MemoryRecorder(),
                     budgets=Budgets(iterations_per_card=10), strategy=strategy)
    assert await o.run() == "iterations" and o.cards["a"].iterations == 10


async def test_failed_candidates_are_repaired_with_their_diagnostics_and_lineage():
    class Repairing:
        name, repairs = "llm", True

        def __init__(self):
            self.requests = []

        def supports(self, c):
            return True

        async def propose(self, r):
            self.requests.append(r)
            if r.failed is None:
                return Proposal(source=f"// bad {len(self.requests)}\n", spec="x")
            return Proposal(source=f"// fixed {len(self.requests)} after {r.failed.candidate_id}\n", spec="x")

    class CompileFailsOnBad(StandInLane):
        async def __call__(self, card, proposal):
            if "bad" in proposal.source:
                return Evaluation("rejected", "compile", "candidate.cu:3: error: identifier \"x\" is undefined", 0.0)
            return Evaluation("verified", None, "", 0.0, payload={"timing": {
                "eager": {"median": 50.0}, "candidate": {"median": 40.0}, "speedup": 1.25, "speedup_ci": [1.2, 1.3]}})

    prop = Repairing()
    o = orchestrator([card("a")], prop, CompileFailsOnBad(0.0), MemoryRecorder(), budgets=Budgets(iterations_per_card=4),
                     max_proposals=1)
    await o.run()
    repairs = [r for r in prop.requests if r.failed is not None]
    assert repairs and "undefined" in repairs[0].failed.message and repairs[0].attempt == 1
    fixed = [r for r in o.records.values() if "fixed" in r.proposal.source]
    assert fixed and all(o.records[r.parent_id].status == "rejected" for r in fixed)  # child of the failure
    assert o.cards["a"].best_us is not None  # the repaired candidate verified and counts


async def test_resumed_run_keeps_finished_cards_finished():
    # A first session runs until every card stops by plateau; a resumed session over the same records
    # and the first session's card_done reasons proposes nothing more.
    from engine.run.plan import SchedulePolicy

    class Repeating(ScriptedProposer):
        """Every other answer repeats an earlier source: duplicates count as iterations, unstored."""

        async def propose(self, request):
            p = await super().propose(request)
            if len(self.calls) % 2 == 0:
                p = dataclasses.replace(p, source=f"// kernel 0 for {request.card.card_id}\n")
            return p

    rec = MemoryRecorder()
    first = orchestrator([card("a"), card("b")], Repeating(0.0), StandInLane(0.0), rec,
                         budgets=Budgets(iterations_per_card=40), policy=SchedulePolicy(patience=3))
    await first.run()
    done = {cid: p["reason"] for kind, cid, p in rec.events if kind == "card_done"}
    assert set(done) == {"a", "b"} and set(done.values()) == {"plateau"}
    records = list(first.records.values())
    prop = ScriptedProposer(0.0)
    again = orchestrator([card("a"), card("b")], prop, StandInLane(0.0), MemoryRecorder(),
                         budgets=Budgets(iterations_per_card=40), policy=SchedulePolicy(patience=3))
    assert again.restore(records, done) == []
    await again.run()
    assert prop.calls == []
    assert {c.done_reason for c in again.cards.values()} == {"plateau"}


async def test_each_revision_asks_for_one_intent_and_siblings_get_different_ones(tmp_path):
    from engine.propose.intents import INTENTS
    from engine.run.store_recorder import StoreRecorder, load_records
    from engine.store import Store, new_id

    class Asked(ScriptedProposer):
        """Records the intent each request asked for, and says it did that (as the builtin does)."""

        async def propose(self, request):
            p = await super().propose(request)
            self.asked.append((request.parent.candidate_id if request.parent else None, request.intent))
            return dataclasses.replace(p, intent=request.intent or "fresh")

    prop = Asked(0.01)
    prop.asked = []
    async with await Store.open(tmp_path / "kforge.db") as store:
        await store.save_capture({"id": "cap", "model": "m", "device": "cuda:0", "dtype": "float16"}, [], [])
        run = (await store.create_run("cap", "m", "scripted"))["id"]
        recorder = StoreRecorder(store, run)
        o = Orchestrator(cards=[card("a")], proposer=prop, evaluate=StandInLane(0.0), recorder=recorder,
                         new_id=lambda: new_id("cand"), budgets=Budgets(iterations_per_card=16), max_proposals=4,
                         poll_s=0.005)
        recorder.orchestrator = o
        await o.run()
        rows = await store.candidates(run)
        restored = {r.id: r.focus for r in await load_records(store, run)}
    assert {p for p, _ in prop.asked if p} and all((p is None) == (i is None) for p, i in prop.asked)
    revisions = [r for r in rows if r["parent_id"]]
    assert revisions, "MCTS should revise verified candidates"
    assert all(r["focus"] in INTENTS and r["intent"] == r["focus"] for r in revisions)
    assert all(r["focus"] is None for r in rows if not r["parent_id"])  # a fresh kernel has no focus
    by_parent: dict = {}
    for r in revisions:
        by_parent.setdefault(r["parent_id"], []).append(r["focus"])
    assert any(len(f) > 1 for f in by_parent.values())
    assert all(len(set(f)) == len(f) for f in by_parent.values()), "siblings explore different intents"
    assert restored == {r["id"]: r["focus"] for r in rows}  # a resumed run knows what was asked
