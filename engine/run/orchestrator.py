"""The asyncio orchestrator: many proposals in flight, evaluations serialised per lane, every step
recorded as it happens, budgets and control rows honoured, resumable after any crash.

It owns no GPU code: evaluation is a callable (compile + lane in the engine, a stand-in in tests), and
persistence goes through a `Recorder` (the workspace store in the engine).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.lane.evaluate import Evaluation
from engine.propose.base import Attempt, Hardware, Proposal, ProposalRequest
from engine.propose.intents import choose_intent
from engine.propose.repair import MAX_ATTEMPTS, next_step, repair_request
from engine.run.plan import CardState, SchedulePolicy, count_chains_once, next_card, skip_reason, stop_reason
from engine.search.tree import ROOT, STRATEGIES, SearchParams, Tree, backup

# Proposals failing in the provider call, before any has come back, after which a run stops ("provider"): a
# wrong base URL, model or key, or a server down, fails every later call alike and would spend the budget.
PROVIDER_GIVE_UP = 6

Evaluate = Callable[[CardState, Proposal], Awaitable[Evaluation]]


@dataclass(frozen=True)
class Budgets:
    iterations_per_card: int = 50
    wall_s: float | None = None
    tokens: int | None = None
    cost_usd: float | None = None


@dataclass
class CandidateRecord:
    """A candidate as the run knows it (and as the recorder stores it)."""

    id: str
    card_id: str
    parent_id: str | None
    proposal: Proposal
    focus: str | None = None          # the intent the request asked for (None: a fresh kernel)
    status: str = "proposed"          # proposed → evaluating → verified | rejected
    category: str | None = None
    message: str = ""
    best_us: float | None = None
    eager_us: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    compile_log: str = ""             # the compiler's full diagnostics (the message holds only a summary)
    payload: dict[str, Any] = field(default_factory=dict)


class Recorder(Protocol):
    """Where the run writes as it goes (the store); every call is one durable step."""

    async def candidate_proposed(self, rec: CandidateRecord) -> str | None:
        """Store a new candidate; returns None if its source is a duplicate in this card."""

    async def candidate_evaluating(self, rec: CandidateRecord) -> None: ...
    async def candidate_finished(self, rec: CandidateRecord) -> None: ...
    async def usage(self, tokens_in: int, tokens_out: int, cost_usd: float) -> None: ...
    async def event(self, kind: str, payload: dict[str, Any], card_id: str | None = None) -> None: ...
    async def controls(self) -> list[dict[str, Any]]: ...
    async def consume(self, seq: int) -> None: ...
    async def status(self, status: str, stopped_by: str | None = None) -> None: ...
    # Optional (a recorder without them records no lane use, no search-tree nodes):
    #   async def lane_busy(self, candidate_id: str, lane: str) -> Any          (returns a token)
    #   async def lane_free(self, token: Any, status: str, category: str | None) -> None
    #   async def search_nodes(self, card_id: str, nodes: list[dict]) -> None   (root first, as backup left them)


class LaneUse:
    """Lets an evaluator say which lane it took for the candidate being evaluated, and when it let go.

    The orchestrator puts one in `CURRENT_LANE_USE` around each evaluation (a context variable, so the
    evaluate callable keeps its two-argument signature and stand-ins need not know about it)."""

    def __init__(self, recorder: Any, candidate_id: str) -> None:
        self.recorder = recorder
        self.candidate_id = candidate_id
        self._token: Any = None

    async def busy(self, lane: str) -> None:
        hook = getattr(self.recorder, "lane_busy", None)
        if hook is not None:
            self._token = await hook(self.candidate_id, lane)

    async def free(self, status: str, category: str | None) -> None:
        hook = getattr(self.recorder, "lane_free", None)
        if hook is not None and self._token is not None:
            token, self._token = self._token, None
            await hook(token, status, category)


CURRENT_LANE_USE: contextvars.ContextVar[LaneUse | None] = contextvars.ContextVar("kforge_lane_use", default=None)


class NullRecorder:
    """A Recorder that keeps nothing (benchmarks subclass it to watch candidates finish in memory)."""

    async def candidate_proposed(self, rec: CandidateRecord) -> str | None:
        return rec.id

    async def candidate_evaluating(self, rec: CandidateRecord) -> None:
        pass

    async def candidate_finished(self, rec: CandidateRecord) -> None:
        pass

    async def usage(self, tokens_in: int, tokens_out: int, cost_usd: float) -> None:
        pass

    async def event(self, kind: str, payload: dict[str, Any], card_id: str | None = None) -> None:
        pass

    async def controls(self) -> list[dict[str, Any]]:
        return []

    async def consume(self, seq: int) -> None:
        pass

    async def status(self, status: str, stopped_by: str | None = None) -> None:
        pass


@dataclass
class RunTotals:
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    proposals: int = 0
    evaluations: int = 0


class Orchestrator:
    """Runs the search over all cards until every card is done or a budget or a stop ends it."""

    def __init__(self, *, cards: list[CardState], proposer: Any, evaluate: Evaluate, recorder: Recorder,
                 new_id: Callable[[], str], hardware: Hardware = Hardware(), strategy: str = "mcts",
                 params: SearchParams = SearchParams(), budgets: Budgets = Budgets(),
                 policy: SchedulePolicy = SchedulePolicy(), max_proposals: int = 4,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = 0.1,
                 totals: RunTotals | None = None, max_attempts: int = MAX_ATTEMPTS):
        self.cards = {c.ref.card_id: c for c in cards}
        self.trees: dict[str, Tree] = {c.ref.card_id: Tree.new() for c in cards}
        self.records: dict[str, CandidateRecord] = {}
        self.proposer = proposer
        self.evaluate = evaluate
        self.recorder = recorder
        self.new_id = new_id
        self.hardware = hardware
        self.select = STRATEGIES[strategy]
        self.params = params
        self.budgets = budgets
        self.policy = policy
        self.max_proposals = max_proposals
        self.clock = clock
        self.poll_s = poll_s
        self.totals = totals or RunTotals()
        self.max_attempts = max_attempts
        # The intent each node's request asked for, kept from the moment it is asked (in-flight siblings
        # count too, so concurrent children of one parent get different intents).
        self.focus: dict[str, str | None] = {}
        self.paused = False
        self.stopped_by: str | None = None
        self._answered = False      # some proposal came back from the provider (answered or declined)
        self._provider_failures = 0  # proposals that failed in the provider call
        self._tasks: set[asyncio.Task] = set()
        # How long the search's tasks that evaluated something (a proposal and its evaluation, queueing for a
        # lane included) took: under a wall time, a task is started only while the time left could hold one
        # more. Declines and duplicates end at once and are left out: late in a run, when the builtin spaces
        # run dry, they would pull the estimate to zero.
        self._task_s: list[float] = []
        self._evaluated: set[str] = set()  # candidates `_evaluate` ran
        self._exhausted: set[str] = set()  # cards said to have nothing left to try (card_exhausted)
        self._work: set[asyncio.Future] = set()  # proposer calls and evaluations in flight
        self._wake = asyncio.Event()

    def interrupt(self) -> None:
        """Ctrl-C: stop now, without waiting for proposals or evaluations in flight.

        Only those calls are cancelled (never a store write): an interrupted candidate stays 'proposed'
        or 'evaluating' in the store and is evaluated again on --resume. `run` returns 'interrupted'."""
        self.stopped_by = "interrupted"
        for work in list(self._work):
            work.cancel()
        self._wake.set()

    async def _interruptible(self, aw: Awaitable[Any]) -> Any:
        """Await a proposer call or an evaluation so that `interrupt` can cancel it."""
        if self.stopped_by == "interrupted":
            if asyncio.iscoroutine(aw):
                aw.close()
            raise asyncio.CancelledError()
        work = asyncio.ensure_future(aw)
        self._work.add(work)
        try:
            return await work
        finally:
            self._work.discard(work)

    # ---- resume -------------------------------------------------------------------------------------

    def restore(self, records: list[CandidateRecord], done: dict[str, str] | None = None, *,
                redo_compiled: bool = True) -> list[CandidateRecord]:
        """Rebuild trees from stored candidates (parents first); returns those still to evaluate.

        `done` maps cards to the reason they finished in the earlier session (its `card_done` events):
        a card that stopped (plateau, roofline, …) stays stopped — proposals that were declined or
        duplicates are not stored as candidates, so the counts alone would not say so. A dry run's
        `compiled` candidates are evaluated again when `redo_compiled` (a dry run resumed on a GPU is
        verified and timed there); a dry run resumed as one counts them as done.
        """
        for card_id, why in (done or {}).items():
            if card_id in self.cards and not self.cards[card_id].done_reason:
                self.cards[card_id].done_reason = why
        todo = []
        for rec in sorted(records, key=lambda r: _depth(r, {x.id: x for x in records})):
            card = self.cards.get(rec.card_id)
            if card is None:
                continue
            tree = self.trees[rec.card_id]
            parent = rec.parent_id if rec.parent_id in tree.nodes else ROOT
            tree.add(rec.id, parent)
            self.records[rec.id] = rec
            self.focus[rec.id] = rec.focus
            if rec.status in ("verified", "rejected") or (rec.status == "compiled" and not redo_compiled):
                self._account(card, tree, rec)
            else:
                card.in_flight += 1
                todo.append(rec)
        return todo

    # ---- main loop ------------------------------------------------------------------------------------

    async def run(self, resume: list[CandidateRecord] = ()) -> str:
        """Returns why the run stopped: 'iterations', 'wall_time', 'tokens', 'cost', 'user' or 'interrupted'."""
        start = self.clock()
        for card in self.cards.values():
            why = skip_reason(card, self.policy)
            if why and not card.done_reason:
                card.done_reason = why
                await self.recorder.event("card_skipped", {"reason": why}, card.ref.card_id)
            elif card.done_reason in ("declined", "not-selected") and not card.iterations:
                # Set before the search (the proposer has nothing for the card, --ops left it out): said
                # once here, so that a viewer neither counts it in the run's budget nor waits for it.
                # with why in words where the reason alone does not say (a cpu-only or custom op)
                await self.recorder.event("card_skipped", {"reason": card.done_reason,
                                                           **({"detail": card.note} if card.note else {})},
                                          card.ref.card_id)
        await self.recorder.status("running")
        await self.recorder.event("run_started", {"cards": len(self.cards), "resumed": len(resume)})
        for rec in resume:  # proposed before a crash, never evaluated: evaluate once now
            self._spawn(self._evaluate(self.cards[rec.card_id], rec))
        while True:
            await self._apply_controls()
            await self._say_exhausted()
            self.stopped_by = self.stopped_by or self._budget_exhausted(start)
            if self.stopped_by:
                break
            launched = held = False
            if not self.paused:
                while len(self._tasks) < self.max_proposals:
                    job = self._next_job()  # (selection only reads the trees: a job not taken costs nothing)
                    if job is None:
                        break
                    if self._no_time_for_another(start):
                        held = True  # what is in flight finishes by the wall time; nothing new would
                        break
                    card, parent = job
                    node_id = self.new_id()
                    self.trees[card.ref.card_id].add(node_id, parent)
                    card.in_flight += 1
                    self._spawn(self._timed(self._propose_and_evaluate(card, node_id, parent)))
                    launched = True
            if not self._tasks and not launched and not self.paused:
                # Nothing in flight and nothing left to start (or no time left to start it).
                self.stopped_by = "wall_time" if held else "iterations"
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
        if self._tasks:  # a clean stop lets in-flight work finish and be recorded (interrupt cancelled it)
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self.stopped_by == "iterations":  # every card is finished: say how the rest finished
            for card in self.cards.values():
                if not card.done_reason:
                    card.done_reason = ("iterations" if card.iterations >= self.budgets.iterations_per_card
                                        else "exhausted")  # every revision the proposer can make was tried
                    await self.recorder.event("card_done", {"reason": card.done_reason}, card.ref.card_id)
        status = "stopped" if self.stopped_by in ("user", "interrupted", "provider") else "done"
        await self.recorder.status(status, self.stopped_by)
        await self.recorder.event("run_finished", {"stopped_by": self.stopped_by, **self.totals.__dict__})
        return self.stopped_by

    async def _timed(self, work: Awaitable[bool]) -> None:
        """Run one search task; when it evaluated a candidate, record how long it took (`_task_s`)."""
        t0 = self.clock()
        if await work:
            self._task_s.append(self.clock() - t0)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            self._wake.set()
        task.add_done_callback(done)

    def may_go_on(self, card: CardState) -> bool:
        """Whether `card` may still use an iteration: not finished, and with work in flight or a node to
        expand. One with neither has tried every revision the proposer can make; the run says it ended
        'exhausted' only when the whole search ends. Reads the tree only."""
        return not card.done_reason and (card.in_flight > 0 or
                                         self.select(self.trees[card.ref.card_id], self.params) is not None)

    async def _say_exhausted(self) -> None:
        """A `card_exhausted` event, once, for each card that has nothing left to try (may_go_on): a viewer
        reading the store counts the search's bar as `run --no-tui` does (engine.progress.search_bar). The
        card's done reason, 'exhausted', is still set only when the whole search ends."""
        for card in self.cards.values():
            cid = card.ref.card_id
            if cid not in self._exhausted and not card.done_reason and not card.in_flight and not self.may_go_on(card):
                self._exhausted.add(cid)
                await self.recorder.event("card_exhausted", {"iterations": card.iterations}, cid)

    def _next_job(self) -> tuple[CardState, str] | None:
        count_chains_once(list(self.cards.values()))
        blocked: list[CardState] = []
        while True:
            card = next_card([c for c in self.cards.values() if c not in blocked], self.policy,
                             self.budgets.iterations_per_card)
            if card is None:
                return None
            parent = self.select(self.trees[card.ref.card_id], self.params)
            if parent is not None:
                return card, parent
            blocked.append(card)  # waiting on its in-flight work; try the next card

    def _no_time_for_another(self, start: float) -> bool:
        """Under a wall time: True when a task started now would likely end after it.

        A task's time is the median of the last few (they include the wait for a lane behind the other tasks
        in flight, so the estimate holds at the concurrency the search runs at). Without this, the search
        started work up to the last second and its in-flight tasks, queued on one lane, ran past the wall time
        by up to max_proposals evaluations (the SD3.5 VAE: 4 x ~6 s past a 480 s limit)."""
        if self.budgets.wall_s is None or not self._task_s:
            return False
        recent = sorted(self._task_s[-8:])
        return self.budgets.wall_s - (self.clock() - start) < recent[len(recent) // 2]

    def _budget_exhausted(self, start: float) -> str | None:
        b = self.budgets
        if b.wall_s is not None and self.clock() - start >= b.wall_s:
            return "wall_time"
        if b.tokens is not None and self.totals.tokens_in + self.totals.tokens_out >= b.tokens:
            return "tokens"
        if b.cost_usd is not None and self.totals.cost_usd >= b.cost_usd:
            return "cost"
        return None

    async def _apply_controls(self) -> None:
        was_paused = self.paused
        for c in await self.recorder.controls():
            cmd = c["command"]
            if cmd == "pause":
                self.paused = True
            elif cmd == "resume":
                self.paused = False
            elif cmd == "stop":
                self.stopped_by = "user"
            elif cmd == "prioritize" and c.get("card_id") in self.cards:
                factor = float((c.get("args") or {}).get("factor", 10.0))
                self.cards[c["card_id"]].priority_boost = factor
            await self.recorder.consume(c["seq"])
            await self.recorder.event("control", {"command": cmd}, c.get("card_id"))
        if self.paused:
            await self.recorder.status("paused")
        elif was_paused:  # resumed: the run row must not keep saying "paused"
            await self.recorder.status("running")

    # ---- one iteration --------------------------------------------------------------------------------

    def _request(self, card: CardState, parent: str, node_id: str) -> ProposalRequest:
        """The request for a new child `node_id` of `parent`, with its intent chosen once, here."""
        tree = self.trees[card.ref.card_id]
        parent_att = self._attempt(parent) if parent != ROOT else None
        lineage = tuple(self._attempt(n.id) for n in reversed(tree.path(parent)[1:]) if n.id != ROOT)
        siblings = tuple(self._attempt(c) for c in tree.nodes[parent].children if c in self.records)
        seed = len(tree.nodes)
        intent = None  # a fresh kernel has no particular focus
        if parent != ROOT:
            others = [self.focus.get(c) for c in tree.nodes[parent].children if c != node_id]
            ancestors = [self.focus.get(n.id) for n in reversed(tree.path(parent)) if n.id != ROOT]
            intent = choose_intent(others, ancestors, seed=seed)
        self.focus[node_id] = intent
        return ProposalRequest(card.card, self.hardware, parent=parent_att, lineage=lineage, siblings=siblings,
                               intent=intent, seed=seed)

    def _attempt(self, cid: str) -> Attempt:
        r = self.records[cid]
        return Attempt(r.id, r.proposal.source, r.proposal.spec, r.proposal.intent, r.status, r.category,
                       r.message, best_us=r.best_us, speedup=r.speedup, params=r.proposal.params)

    async def _propose_and_evaluate(self, card: CardState, node_id: str, parent: str) -> bool:
        """One request and its bounded repair loop (engine.propose.repair's rules), for proposers that repair.
        Returns whether any candidate of it was evaluated.

        A repair is the failed candidate's child, so lineage is kept; a retry of an unusable answer is
        its sibling (the same request again)."""
        first = self._request(card, parent, node_id)
        request, node, tree_parent = first, node_id, parent
        evaluated = False
        for k in range(max(1, self.max_attempts)):
            if k:
                node = self.new_id()
                self.trees[card.ref.card_id].add(node, tree_parent)
                self.focus[node] = request.intent
                card.in_flight += 1
            rec = await self._iteration(card, node, tree_parent, request)
            evaluated = evaluated or (rec is not None and rec.id in self._evaluated)
            if rec is None or not getattr(self.proposer, "repairs", False):
                return evaluated
            attempt = self._attempt(rec.id)
            step = next_step(attempt)
            if step == "repair":
                request, tree_parent = repair_request(first, attempt, k + 1), rec.id
            elif step != "retry":
                return evaluated
            if self.stopped_by or card.iterations + card.in_flight >= self.budgets.iterations_per_card:
                return evaluated
        return evaluated

    async def _iteration(self, card: CardState, node_id: str, parent: str,
                         request: ProposalRequest) -> CandidateRecord | None:
        """Propose, store, evaluate one candidate; returns its record (None: declined or duplicate)."""
        tree = self.trees[card.ref.card_id]
        # Start and end of every proposer call, so a viewer can show how many are in flight.
        await self.recorder.event("proposer_started", {"node": node_id}, card.ref.card_id)
        try:
            proposal = await self._interruptible(self.proposer.propose(request))
        except Exception as e:  # a proposer bug must not end the run; the node fails
            proposal = Proposal(category="provider", reason=f"{type(e).__name__}: {e}")
        finally:
            await self.recorder.event("proposer_done", {"node": node_id}, card.ref.card_id)
        self.totals.proposals += 1
        if proposal.category == "provider":
            self._provider_failures += 1
            if not self._answered and self._provider_failures >= PROVIDER_GIVE_UP and not self.stopped_by:
                self.stopped_by = "provider"  # nothing has answered yet: the rest would fail alike
                self._wake.set()
        else:
            self._answered = True
        u = proposal.usage
        if u.tokens_in or u.tokens_out or u.cost_usd:
            self.totals.tokens_in += u.tokens_in
            self.totals.tokens_out += u.tokens_out
            self.totals.cost_usd += u.cost_usd
            await self.recorder.usage(u.tokens_in, u.tokens_out, u.cost_usd)
        if proposal.declined:
            card.in_flight -= 1
            _discard(tree, node_id)
            if request.failed is None:
                tree.nodes[parent].closed = True  # nothing new from here
            if parent == ROOT and not any(c in self.records for c in tree.nodes[ROOT].children):
                card.done_reason = "declined"
            await self.recorder.event("declined", {"reason": proposal.reason, "parent": parent}, card.ref.card_id)
            return None
        rec = CandidateRecord(node_id, card.ref.card_id, None if parent == ROOT else parent, proposal,
                              focus=request.intent)
        if not proposal.ok:  # unusable answer: a failed iteration, stored for the record
            rec.status, rec.category, rec.message = "rejected", proposal.category or "empty", proposal.reason
            card.in_flight -= 1
            if await self.recorder.candidate_proposed(rec) is None:  # the same unusable answer again
                _discard(tree, node_id)
                card.record(None, self.policy)
                return None
            self.records[node_id] = rec
            await self.recorder.candidate_finished(rec)
            self._account(card, tree, rec)
            await self._save_path(card, tree, rec.id)
            return rec
        stored = await self.recorder.candidate_proposed(rec)
        if stored is None:  # same source as an earlier candidate of this card: never evaluated twice
            card.in_flight -= 1
            _discard(tree, node_id)
            card.iterations += 1
            card.since_improvement += 1
            await self.recorder.event("duplicate", {"parent": parent}, card.ref.card_id)
            return None
        self.records[node_id] = rec
        await self._evaluate(card, rec)
        return rec

    async def _evaluate(self, card: CardState, rec: CandidateRecord) -> None:
        tree = self.trees[card.ref.card_id]
        rec.status = "evaluating"
        await self.recorder.candidate_evaluating(rec)
        scope = CURRENT_LANE_USE.set(LaneUse(self.recorder, rec.id))
        try:
            ev = await self._interruptible(self.evaluate(card, rec.proposal))
        except Exception as e:  # an evaluator bug: this candidate fails, the run goes on
            ev = Evaluation("rejected", "internal", f"{type(e).__name__}: {e}", 0.0)
        finally:
            CURRENT_LANE_USE.reset(scope)
        self.totals.evaluations += 1
        self._evaluated.add(rec.id)
        timing = ev.payload.get("timing") or {}
        rec.status, rec.category, rec.message, rec.payload = ev.status, ev.category, ev.message, ev.payload
        rec.compile_log = ev.compile_log or ""
        if ev.status == "verified" and timing:
            rec.best_us = timing["candidate"]["median"]
            rec.eager_us = timing["eager"]["median"]
            rec.speedup = timing["speedup"]
            rec.speedup_ci = tuple(timing.get("speedup_ci") or (rec.speedup, rec.speedup))
        evaluated = {"candidate": rec.id, "status": rec.status, "category": rec.category, "best_us": rec.best_us,
                     "speedup": rec.speedup, "compile_ms": round(ev.compile_seconds * 1e3, 2),
                     "compile_cached": ev.cached_compile}
        together = getattr(self.recorder, "candidate_evaluated", None)  # result and event in one write
        if together is not None:
            await together(rec, evaluated, card.ref.card_id)
        else:
            await self.recorder.candidate_finished(rec)
        card.in_flight -= 1
        self._account(card, tree, rec)
        await self._save_path(card, tree, rec.id)
        if together is None:
            await self.recorder.event("evaluated", evaluated, card.ref.card_id)
        why = stop_reason(card, self.policy, self.budgets.iterations_per_card)
        if why and why != "budget" and not card.done_reason:
            card.done_reason = why
            await self.recorder.event("card_done", {"reason": why}, card.ref.card_id)

    async def _save_path(self, card: CardState, tree: Tree, node_id: str) -> None:
        """Write the nodes this backup changed (the candidate's node and its ancestors), root first."""
        save = getattr(self.recorder, "search_nodes", None)
        if save is None:
            return
        cid = card.ref.card_id

        def name(n: Any) -> str | None:
            return None if n is None else (f"{ROOT}:{cid}" if n == ROOT else n)

        rows = [{"node_id": name(n.id), "parent_node_id": name(n.parent),
                 "candidate_id": None if n.id == ROOT else n.id, "visits": n.visits,
                 "value": n.raw if n.raw is not None else 0.0, "best_value": n.best_raw, "dead": n.dead}
                for n in reversed(tree.path(node_id))]
        await save(cid, rows)

    def _account(self, card: CardState, tree: Tree, rec: CandidateRecord) -> None:
        ok = rec.status == "verified" and rec.speedup is not None and rec.speedup > 0
        backup(tree, rec.id, math.log(rec.speedup) if ok else None)
        if not ok and rec.status != "compiled":  # a dry run's compiled candidate did not fail
            card.failures[rec.category or "unknown"] = card.failures.get(rec.category or "unknown", 0) + 1
        card.record(rec.best_us if ok else None, self.policy)


def _discard(tree: Tree, node_id: str) -> None:
    """Remove a node that never became a candidate (declined or duplicate)."""
    node = tree.nodes.pop(node_id)
    parent = tree.nodes[node.parent]
    parent.children.remove(node_id)
    for n in tree.path(parent.id):
        n.pending = max(0, n.pending - 1)


def _depth(rec: CandidateRecord, by_id: dict[str, CandidateRecord]) -> int:
    d, cur = 0, rec
    while cur.parent_id and cur.parent_id in by_id and d < 10_000:
        cur = by_id[cur.parent_id]
        d += 1
    return d
