"""What the TUI knows of the workspace database: one `poll` per tick, incremental, through the
store's read side (`engine.store.read`: the TUI writes no SQL).

The engine writes; the TUI only reads (and appends control rows through `controls.py`). A tick asks
SQLite only for what changed since the last one (events by seq, candidates by updated_at), keeps a
light copy of every candidate of the open run in memory, and recomputes card aggregates only for the
cards that changed. Bulky columns (source, logs, prompts) are fetched only when a candidate is opened.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.cards import (
    chain_card_dispatch,
    chain_inputs,
    chain_label,
    compile_note,
    copy_fraction,
    hidden_makers,
    hidden_part,
)
from engine.outcomes import CARD_SKIP_REASONS, FINISHED, IN_FLIGHT, LIVE_RUN_STATUSES, UNKNOWN_CATEGORY
from engine.progress import search_bar
from engine.store import open_readonly, read
from engine.store.read import CandidateHead
from kforge_tui.format import layouts

# A candidate's updated_at is taken before its transaction commits, so a later tick can see a row
# stamped slightly before the newest one it already saw: re-read this window and diff.
_OVERLAP_S = 2.0
RESYNC_TICKS = 30


@dataclass(frozen=True)
class RunInfo:
    id: str
    capture_id: str
    model: str
    provider: str
    status: str
    stopped_by: str | None
    created_at: float
    updated_at: float
    pid: int | None
    tokens_in: int
    tokens_out: int
    cost_usd: float
    config: dict[str, Any]

    @property
    def live(self) -> bool:
        return self.status in LIVE_RUN_STATUSES

    @property
    def label(self) -> str:
        return str(self.config.get("label") or "")


def _twin_of(signature: Any) -> str | None:
    """The original card a channels-last twin names (engine.capture.twins), from a card row's signature."""
    return _as_dict(signature).get("twin_of")


@dataclass(frozen=True)
class CardRow:
    card_id: str
    op: str
    signature: str
    calls: float
    share: float
    eager_us: float | None
    roofline_us: float | None
    best_us: float | None
    speedup: float | None
    roofline_pct: float | None
    status: str
    candidates: int
    failures: int
    failure_counts: dict[str, int]
    best_id: str | None
    chain: dict[str, Any] | None = None  # a chain card's facts (OperatorCard.chain); None for an op card
    compile_us: float | None = None  # the op under torch.compile alone, timed as eager is (None: not measured)
    copy_us: float | None = None     # the lane's copy of the card's bytes, timed as eager is
    compile_note: str | None = None  # "no compile reference (reason)" where torch.compile was tried and failed
    twin_of: str | None = None       # a channels-last twin's original card (its calls and share are counted there)

    @property
    def copy_pct(self) -> float | None:
        """The best kernel's time (eager's until one is verified) as a percentage of the copy's: 100 is a copy."""
        frac = copy_fraction(self.best_us or self.eager_us, self.copy_us)
        return None if frac is None else 100.0 * frac

    @property
    def label(self) -> str:
        """What the card is, in one line: its op, or for a chain card `chain: _to_copy → pow → …`."""
        return chain_label(self.chain, self.signature) if self.chain is not None else self.op.removeprefix("aten::")

    @property
    def detail(self) -> str:
        """The rest: the op card's signature, or which dispatch serves a chain card and its inputs."""
        if self.chain is None:
            return layouts(self.signature)
        return f"{chain_card_dispatch(self.chain)} · {layouts(chain_inputs(self.signature))}"


@dataclass(frozen=True)
class EventRow:
    seq: int
    ts: float
    kind: str
    card_id: str | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class LaneState:
    """A GPU lane as the engine last reported it: busy with a candidate since `since`, or idle."""

    name: str
    candidate_id: str | None = None
    since: float | None = None

    @property
    def busy(self) -> bool:
        return self.candidate_id is not None


@dataclass(frozen=True)
class RunStats:
    candidates: int = 0
    verified: int = 0
    rejected: int = 0
    evaluating: int = 0
    proposed: int = 0
    llm_calls: int = 0
    llm_errors: int = 0
    lanes_busy: tuple[str, ...] = ()   # names of the lanes evaluating right now
    iterations_budget: int | None = None  # the search bar's total (engine.progress.search_bar)
    proposer_in_flight: int = 0        # proposer calls started and not yet answered
    lanes: tuple[LaneState, ...] = ()  # every lane the engine announced or used, busy or idle
    iterations_used: int | None = None    # the search bar's count (None: the run's config has no iterations)


@dataclass
class Snapshot:
    """What one tick found; the app applies it inside one batch_update()."""

    run: RunInfo
    stats: RunStats
    changed_nodes: list[CandidateHead] = field(default_factory=list)
    changed_cards: list[CardRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    elapsed_ms: float = 0.0


@dataclass
class CandidateDetail:
    row: dict[str, Any]
    parent_source: str | None
    llm_call: dict[str, Any] | None
    card: CardRow | None


class ReadModel:
    """Queries for one workspace database; `poll(run_id)` is the per-tick entry point."""

    def __init__(self, db_file: str | Path) -> None:
        self.db_file = Path(db_file)
        # Refuses a missing file or a newer schema, with a clear message. One connection shared by the
        # tick worker thread and the UI thread, serialised by a lock.
        self._conn = open_readonly(self.db_file, threads=True)
        self._lock = threading.Lock()
        self._run_id: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.nodes: dict[str, CandidateHead] = {}
        self.by_card: dict[str, dict[str, CandidateHead]] = {}
        self.cards: dict[str, CardRow] = {}
        self._card_static: dict[str, Mapping[str, Any]] = {}
        self._card_reason: dict[str, str] = {}
        # Since the engine last (re)started, as its cards count them: duplicate answers per card (an iteration
        # with no candidate row) and the cards it said have nothing left to try (engine.progress.search_bar).
        self._duplicates: dict[str, int] = {}
        self._exhausted: set[str] = set()
        self._cand_cursor = 0.0
        self._cand_rowid = 0
        self._in_flight: set[str] = set()
        self._status_counts: dict[str, int] = {}
        self._fail_counts: dict[str, int] = {}  # rejected candidates per category, kept per changed row
        self._llm = [0, 0, 0]  # rowid cursor, calls, errors
        self._ticks = 0
        self._event_seq = 0
        self._proposing: set[str] = set()  # nodes whose proposer call is in flight
        self._lane_names: list[str] = []
        self._eval_cursor = 0
        self._run: RunInfo | None = None
        self._prev_status: str | None = None
        self._card_agg: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---- runs ------------------------------------------------------------------------------------------

    def runs(self) -> list[RunInfo]:
        """Every run in the workspace, newest first."""
        with self._lock:
            rows = read.runs(self._conn)
        return [_run_info(r) for r in rows]

    def run(self, run_id: str) -> RunInfo | None:
        with self._lock:
            row = read.run(self._conn, run_id)
        return _run_info(row) if row else None

    def resolve_run(self, ref: str) -> RunInfo | None:
        """A run by exact id or unique id prefix."""
        runs = self.runs()
        exact = [r for r in runs if r.id == ref]
        if exact:
            return exact[0]
        prefixed = [r for r in runs if r.id.startswith(ref) or r.id.startswith(f"run-{ref}")]
        return prefixed[0] if len(prefixed) == 1 else None

    # ---- the tick --------------------------------------------------------------------------------------

    def poll(self, run_id: str) -> Snapshot:
        """Everything that changed in `run_id` since the previous poll (the first poll loads it all)."""
        t0 = time.perf_counter()
        with self._lock:
            if run_id != self._run_id:
                self._reset()
                self._run_id = run_id
            conn = self._conn
            row = read.run(conn, run_id)
            if row is None:
                raise KeyError(f"no run {run_id!r}")
            run = _run_info(row)
            first = self._run is None
            self._run = run
            if first:
                for c in read.cards_of_capture(conn, run.capture_id):
                    self._card_static[c["card_id"]] = c
            events = [EventRow(e["seq"], e["ts"], e["kind"], e["card_id"],
                               e["payload"] if isinstance(e["payload"], dict) else {})
                      for e in read.events_since(conn, run_id, self._event_seq)]
            if events:
                self._event_seq = events[-1].seq
            touched: set[str] = set()
            for e in events:
                if e.card_id and e.kind in ("card_done", "card_skipped"):
                    self._card_reason[e.card_id] = str(e.payload.get("reason") or e.kind)
                    touched.add(e.card_id)
                elif e.card_id and e.kind == "control" and e.payload.get("command") == "prioritize":
                    touched.add(e.card_id)
                elif e.kind == "proposer_started":
                    self._proposing.add(str(e.payload.get("node")))
                elif e.kind == "proposer_done":
                    self._proposing.discard(str(e.payload.get("node")))
                elif e.kind == "run_started":  # a (re)started engine: calls of a killed one never finish
                    self._proposing.clear()
                    self._duplicates.clear()   # a resumed engine counts its cards' candidates only
                    self._exhausted.clear()    # and says again which have nothing left to try
                elif e.card_id and e.kind == "duplicate":
                    self._duplicates[e.card_id] = self._duplicates.get(e.card_id, 0) + 1
                elif e.card_id and e.kind == "card_exhausted":
                    self._exhausted.add(e.card_id)
                elif e.kind == "lanes":
                    self._add_lanes(e.payload.get("lanes") or [])
            # New candidates by rowid, changes by re-reading the ones still in flight (the engine updates
            # only those); every RESYNC_TICKS a scan by updated_at catches anything else.
            self._ticks += 1
            batches = [read.candidate_heads_added(conn, run_id, self._cand_rowid),
                       read.candidate_heads(conn, sorted(self._in_flight))]
            if self._ticks % RESYNC_TICKS == 0:
                batches.append(read.candidate_heads_updated(conn, run_id, self._cand_cursor - _OVERLAP_S))
            changed: list[CandidateHead] = []
            for batch in batches:
                for node in batch:
                    self._cand_cursor = max(self._cand_cursor, node.updated_at)
                    self._cand_rowid = max(self._cand_rowid, node.order)
                    old = self.nodes.get(node.id)
                    if old == node:
                        continue
                    self._account(old, node)
                    changed.append(node)
                    touched.add(node.card_id)
            for eval_id, lane in read.lanes_used_since(conn, run_id, self._eval_cursor):
                self._eval_cursor = eval_id
                self._add_lanes([lane])
            busy = read.busy_lanes(conn, run_id)
            lanes = tuple(LaneState(name, *busy.get(name, (None, None))) for name in self._lane_names)
            for rowid, failed in read.llm_calls_since(conn, run_id, self._llm[0]):
                self._llm = [max(self._llm[0], rowid), self._llm[1] + 1, self._llm[2] + failed]
            llm = (self._llm[1], self._llm[2])
        if first:
            touched |= set(self._card_static)
        changed_cards = [self._recompute_card(cid, run) for cid in sorted(touched) if cid in self._card_static]
        if not first and run.status != self._prev_status:
            # The run ended: 'searching' cards become 'finished'; recompute them all once.
            changed_cards = [self._recompute_card(cid, run) for cid in self._card_static]
        self._prev_status = run.status
        stats = self._stats(run, lanes, llm[0], llm[1], len(self._proposing))
        return Snapshot(run, stats, changed, changed_cards, events, (time.perf_counter() - t0) * 1000)

    def _account(self, old: CandidateHead | None, node: CandidateHead) -> None:
        """Keep the caches and the per-status and per-card counters in step with one changed row."""
        self.nodes[node.id] = node
        self.by_card.setdefault(node.card_id, {})[node.id] = node
        counts, fails = self._status_counts, self._fail_counts
        if old is not None:
            counts[old.status] -= 1
            if old.status == "rejected":
                fails[old.category or UNKNOWN_CATEGORY] -= 1
            self._agg(old, -1)
        counts[node.status] = counts.get(node.status, 0) + 1
        if node.status == "rejected":
            fails[node.category or UNKNOWN_CATEGORY] = fails.get(node.category or UNKNOWN_CATEGORY, 0) + 1
        self._agg(node, +1)
        if node.status in IN_FLIGHT:
            self._in_flight.add(node.id)
        else:
            self._in_flight.discard(node.id)

    def _agg(self, n: CandidateHead, sign: int) -> None:
        agg = self._card_agg.setdefault(n.card_id, {"fails": {}, "flight": 0, "best": None, "stale": False})
        if n.status == "rejected":
            cat = n.category or UNKNOWN_CATEGORY
            agg["fails"][cat] = agg["fails"].get(cat, 0) + sign
        elif n.status in IN_FLIGHT:
            agg["flight"] += sign
        elif n.status == "verified" and n.best_us:
            best = agg["best"]
            if sign > 0 and (best is None or n.best_us < best.best_us):
                agg["best"] = n
            elif sign < 0 and best is not None and best.id == n.id:
                agg["stale"] = True  # the best changed: rescan this card once

    def _recompute_card(self, card_id: str, run: RunInfo) -> CardRow:
        s = self._card_static[card_id]
        nodes = self.by_card.get(card_id, {})
        agg = self._card_agg.get(card_id, {"fails": {}, "flight": 0, "best": None, "stale": False})
        if agg["stale"]:
            ok = [n for n in nodes.values() if n.status == "verified" and n.best_us]
            agg["best"], agg["stale"] = min(ok, key=lambda n: n.best_us, default=None), False
        best: CandidateHead | None = agg["best"]
        fails = {k: v for k, v in agg["fails"].items() if v}
        in_flight = agg["flight"]
        eager = s["eager_us"] if s["eager_us"] is not None else (best.eager_us if best else None)
        best_us = best.best_us if best else None
        roof = s["roofline_us"]
        pct = 100.0 * roof / best_us if roof and best_us else (100.0 * roof / eager if roof and eager else None)
        reason = self._card_reason.get(card_id)
        if in_flight:
            status = "searching"
        elif reason:
            status = reason
        elif not run.live:
            status = "finished" if nodes else "untouched"
        else:
            status = "waiting" if nodes else "queued"
        row = CardRow(card_id, s["op"], s["signature_text"], s["calls"], self._share(s, eager), eager, roof, best_us,
                      best.speedup if best else None, pct, status, len(nodes), sum(fails.values()), fails,
                      best.id if best else None, _chain(s.get("chain")), s.get("compile_us"), s.get("copy_us"),
                      compile_note(s.get("ref_stats")), _twin_of(s.get("signature")))
        self.cards[card_id] = row
        return row

    def _share(self, s: dict[str, Any], eager: float | None) -> float:
        """A card's share; a hidden call's (engine.capture.hidden) its part of its makers' once its eager time
        is known, as tables and coverage count it (engine.cards.hidden_part), not their whole shares."""
        makers = [self._card_static.get(m) for m in hidden_makers(_as_dict(s.get("signature")))]
        if not makers or not all(makers):
            return s["share"]
        part = hidden_part(eager, [(float(m["share"]), m.get("capture_us")) for m in makers if m])
        return s["share"] if part is None else part

    def _add_lanes(self, names: Iterable[Any]) -> None:
        for name in names:
            if str(name) not in self._lane_names:
                self._lane_names.append(str(name))

    def _search_bar(self, iterations: int) -> tuple[int, int]:
        """The search's bar as `run --no-tui` counts it (engine.progress.search_bar): each searched card's
        iterations (its finished candidates and duplicate answers) against its budget while it may go on, or
        what it used once it is done or the engine said it has nothing left to try (card_exhausted). A run
        stopped short (wall time, cost, Ctrl-C) keeps its bar where it stopped. (The bar counted `iterations`
        for such a card until the run ended, then jumped to its end.)"""
        cards = []
        for card_id in self._card_static:
            reason = self._card_reason.get(card_id)
            if reason in CARD_SKIP_REASONS:
                continue
            finished = sum(1 for n in self.by_card.get(card_id, {}).values() if n.status in FINISHED)
            cards.append((finished + self._duplicates.get(card_id, 0),
                          not reason and card_id not in self._exhausted))
        return search_bar(cards, iterations)

    def _stats(self, run: RunInfo, lanes: tuple[LaneState, ...], llm_calls: int, llm_errors: int,
               proposing: int) -> RunStats:
        counts = self._status_counts
        iters = run.config.get("iterations")
        used, budget = self._search_bar(iters) if isinstance(iters, int) else (None, None)
        if not run.live:  # an ended run has nothing in flight, whatever a killed engine left behind
            lanes, proposing = tuple(LaneState(lane.name) for lane in lanes), 0
        return RunStats(len(self.nodes), counts.get("verified", 0) + counts.get("compiled", 0),
                        counts.get("rejected", 0), counts.get("evaluating", 0), counts.get("proposed", 0),
                        llm_calls, llm_errors, tuple(lane.name for lane in lanes if lane.busy), budget,
                        proposing, lanes, used)

    # ---- views over the cache ----------------------------------------------------------------------------

    def compile_context(self, card_id: str) -> list[dict[str, Any]]:
        """The chains torch.compile fuses this op card into, with each chain's compiled time
        (engine.cards.compile_in_context); [] for a chain card or an op no measured chain holds."""
        from engine.cards import compile_in_context

        return compile_in_context(list(self.cards.values())).get(card_id, [])

    def nodes_of(self, card_id: str) -> list[CandidateHead]:
        """A card's candidates in proposal order."""
        with self._lock:
            return sorted(self.by_card.get(card_id, {}).values(), key=lambda n: n.order)

    def all_nodes(self) -> list[CandidateHead]:
        """Every candidate of the open run, in proposal order (the run-level charts)."""
        with self._lock:
            return sorted(self.nodes.values(), key=lambda n: n.order)

    def failures(self, category: str | None = None) -> list[CandidateHead]:
        """Every rejected candidate of the open run (optionally one category), oldest first."""
        with self._lock:
            rows = [n for n in self.nodes.values() if n.status == "rejected"
                    and (category is None or (n.category or UNKNOWN_CATEGORY) == category)]
        return sorted(rows, key=lambda n: n.order)

    def failure_categories(self) -> dict[str, int]:
        """Rejected candidates per category, most frequent first."""
        with self._lock:
            out = {k: v for k, v in self._fail_counts.items() if v}
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    def best_cards(self, limit: int = 5) -> list[CardRow]:
        rows = [c for c in self.cards.values() if c.speedup]
        return sorted(rows, key=lambda c: -(c.speedup or 0))[:limit]

    # ---- one candidate -------------------------------------------------------------------------------

    def candidate(self, candidate_id: str) -> CandidateDetail | None:
        """Everything stored about one candidate, its parent's source and its proposer call."""
        with self._lock:
            d = read.candidate(self._conn, candidate_id)
            if d is None:
                return None
            parent = read.candidate_source(self._conn, d["parent_id"]) if d["parent_id"] else None
            call = read.llm_call(self._conn, d["llm_call_id"]) if d["llm_call_id"] else None
        return CandidateDetail(d, parent, call, self.cards.get(d["card_id"]))

    def change_vs_parent(self, candidate_id: str) -> str:
        """What a candidate changed against its parent, in one line: the params that differ (the
        builtin templates), else the proposer's stated intent; "" when nothing is stored."""
        with self._lock:
            d = read.candidate(self._conn, candidate_id)
            p = read.candidate(self._conn, d["parent_id"]) if d and d["parent_id"] else None
        if d is None:
            return ""
        return describe_change(d.get("params"), p.get("params") if p else None, d.get("intent"), p is not None)

    # ---- exports -------------------------------------------------------------------------------------

    def exports(self, run_id: str) -> list[dict[str, Any]]:
        """The run's recorded exports (`kforge-tui export`), newest first."""
        with self._lock:
            return read.exports(self._conn, run_id)

    # ---- compare -------------------------------------------------------------------------------------

    def compare(self, run_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Per run: totals, failure categories and best speedup per card (for the compare screen)."""
        out = []
        with self._lock:
            for rid in run_ids:
                r = read.run(self._conn, rid)
                if r is None:
                    continue
                info = _run_info(r)
                counts = read.status_counts(self._conn, rid)
                cats = read.failure_counts(self._conn, rid)
                best = read.best_speedups(self._conn, rid)
                last = read.last_event_ts(self._conn, rid)
                end = last if last is not None else info.updated_at
                out.append({"run": info, "counts": counts, "categories": cats, "best": best,
                            "wall_s": max(0.0, end - info.created_at)})
        return out


def _run_info(r: Mapping[str, Any]) -> RunInfo:
    cfg = r["config"]
    return RunInfo(r["id"], r["capture_id"], r["model"], r["provider"], r["status"], r["stopped_by"],
                   r["created_at"], r["updated_at"], r["pid"], r["tokens_in"], r["tokens_out"], r["cost_usd"],
                   cfg if isinstance(cfg, dict) else {})


def describe_change(params: Any, parent_params: Any, intent: Any, has_parent: bool) -> str:
    """`unroll 2→4, vec 4→8` for params that differ from the parent's; the intent when there are none."""
    mine = _as_dict(params)
    theirs = _as_dict(parent_params)
    if has_parent and mine and theirs:
        diff = [f"{k} {theirs.get(k, '–')}→{mine.get(k, '–')}" for k in sorted(set(mine) | set(theirs))
                if mine.get(k) != theirs.get(k)]
        if diff:
            return ", ".join(diff)
    if not has_parent and mine:
        return "root: " + ", ".join(f"{k} {v}" for k, v in sorted(mine.items()))
    return f"intent: {intent}" if intent else ""


def _as_dict(v: Any) -> dict[str, Any]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return {}
    return v if isinstance(v, dict) else {}


def _chain(value: Any) -> dict[str, Any] | None:
    """A card row's chain facts: JSON text in the store (schema v4), None for an op card."""
    return None if value is None or value == "" else _as_dict(value)
