"""Run overview: progress, lanes, proposer, tokens and cost, best speedups, the event log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Header, ProgressBar, RichLog

from kforge_tui import format as fmt
from kforge_tui import keymap as keys
from kforge_tui.readmodel import EventRow, RunStats, Snapshot
from kforge_tui.widgets import KeyFooter, KforgeScreen, LiveBar, LiveTable


class OverviewScreen(KforgeScreen):
    BINDINGS = keys.OVERVIEW
    FOOTER_LAST = ("overview.exports",)

    def action_exports(self) -> None:
        from kforge_tui.screens.exports import ExportsScreen

        self.app.push_screen(ExportsScreen())

    def compose(self) -> ComposeResult:
        yield Header()
        yield LiveBar(id="run-line", classes="bar")
        with Horizontal(id="progress-row"):
            yield ProgressBar(id="progress", show_eta=False)
        yield LiveBar(id="work-line", classes="bar")
        yield LiveBar(id="spend-line", classes="bar")
        yield LiveTable(id="best", cursor_type="row", show_cursor=False)
        yield RichLog(id="events", max_lines=500, wrap=False, markup=False)
        yield KeyFooter()

    def on_mount(self) -> None:
        t = self.query_one("#best", LiveTable)
        t.add_columns("best so far", "signature", "µs", "speedup")
        self._last_seq = 0
        self.sync()

    def on_screen_resume(self) -> None:
        self.sync()

    def sync(self) -> None:
        if self.app.snapshot is not None:
            self.apply_snapshot(self.app.snapshot)

    def apply_snapshot(self, snap: Snapshot) -> None:
        run, st = snap.run, snap.stats
        now = self.app.clock()
        end = now if run.live else run.updated_at
        line = Text.assemble(
            (run.id, "bold"), f"  {run.model}  provider {run.provider}  ",
            (run.status, "bold green" if run.status == "running" else "bold yellow"),
            f"{'  stopped by ' + run.stopped_by if run.stopped_by else ''}  elapsed {fmt.duration(end - run.created_at)}")
        if run.label:  # e.g. a stand-in run must never pass for a measurement
            line.append(f"  {run.label}", style="bold yellow")
        self.query_one("#run-line", LiveBar).show(line)
        done, total = progress_of(st)
        if not run.live and done == 0 and st.verified + st.rejected == 0:
            # a finished run that searched nothing (every card declined) read "done 0/1" at 0 %: it is done
            total = 0
        self.query_one("#progress", ProgressBar).update(total=max(total, 1), progress=done if total else 1)
        repeated = done - st.verified - st.rejected  # duplicate answers: iterations without a candidate
        self.query_one("#work-line", LiveBar).show(
            f"lanes {_lanes(st, now)} · queued {st.proposed} · done {done}"
            f"{'/' + str(total) if st.iterations_budget else ''}: "
            f"{st.verified} ok, {st.rejected} failed{f', {repeated} duplicate' if repeated > 0 else ''}")
        k = st.proposer_in_flight
        self.query_one("#spend-line", LiveBar).show(
            f"{k} proposer call{'' if k == 1 else 's'} in flight · {st.llm_calls} done ({st.llm_errors} err) · "
            f"{fmt.tokens(run.tokens_in)}+{fmt.tokens(run.tokens_out)} tokens · ${run.cost_usd:.2f}")
        table = self.query_one("#best", LiveTable)
        best = self.app.model.best_cards(5)
        # a chain card by its ops (`chain: pow → mean → …`), not `kforge::chain`
        rows = [(c.label, c.signature[:30], fmt.us(c.best_us), fmt.speedup(c.speedup)) for c in best]
        if len(rows) < table.row_count:  # (only when runs are switched) fewer rows than shown
            table.clear()
        table.set_rows({f"rank{i}": r for i, r in enumerate(rows)})  # rows keyed by rank: cells update in place
        log = self.query_one("#events", RichLog)
        new = [e for e in self.app.events if e.seq > self._last_seq]
        for e in new:
            if e.kind == "run_note":  # a sentence for the user, wrapped to the log (it does not wrap lines)
                # before its first layout the log has no width yet: the screen's (notes were wrapped at 40 columns
                # on a 160-column terminal)
                for ln in _note_lines(e, max(40, (log.size.width or self.app.size.width) - 2)):
                    log.write(ln)
            elif e.kind not in QUIET_EVENTS:
                log.write(_event_line(e, self.app.model.cards))
        if new:
            self._last_seq = new[-1].seq


def progress_of(st: RunStats) -> tuple[int, int]:
    """The overview bar's (done, total): the search's bar as `run --no-tui` counts it (the read model's
    iterations_used of iterations_budget, engine.progress.search_bar); for a run whose config names no
    iterations, the finished candidates of those made."""
    if st.iterations_budget is not None and st.iterations_used is not None:
        return st.iterations_used, st.iterations_budget
    finished = st.verified + st.rejected
    return finished, max(st.candidates, finished, 1)


# Bookkeeping events that feed the counters above; one log line each would drown the log.
QUIET_EVENTS = frozenset({"proposer_started", "proposer_done", "lanes"})


def _lanes(st: RunStats, now: float) -> str:
    """'lane0 busy cand-… 4s, idle lane1'; lanes of several hosts (Ray lanes are named host/gpuN) per host:
    'node-a: gpu0 busy cand-… 4s, idle gpu1 · node-b 0/2 busy'; without lane reports, what the candidate
    statuses say."""
    if not st.lanes:
        return f"{st.evaluating} evaluating" if st.evaluating else "idle"
    hosts: dict[str, list] = {}
    for lane in st.lanes:
        host, sep, _ = lane.name.rpartition("/")
        hosts.setdefault(host if sep else "", []).append(lane)
    if len(hosts) < 2:
        return _lane_list(st.lanes, now, strip="")
    return " · ".join(f"{host}: {_lane_list(group, now, strip=host + '/')}" if any(x.busy for x in group)
                      else f"{host} 0/{len(group)} busy" for host, group in hosts.items())


def _lane_list(lanes, now: float, strip: str) -> str:
    short = (lambda n: n[len(strip):] if strip and n.startswith(strip) else n)  # noqa: E731
    busy = [f"{short(lane.name)} busy {lane.candidate_id} {fmt.duration(now - (lane.since or now))}"
            for lane in lanes if lane.busy]
    idle = [short(lane.name) for lane in lanes if not lane.busy]
    return ", ".join(busy + ([f"idle {' '.join(idle)}"] if idle else []))


def _note_lines(e: EventRow, width: int) -> list[Text]:
    """A run's note (why it proposed nothing, say) as whole lines of at most `width` columns."""
    import textwrap
    import time

    stamp = time.strftime("%H:%M:%S", time.gmtime(e.ts))
    lines = textwrap.wrap(str(e.payload.get("message") or ""), width=width - len(stamp) - 1,
                          break_on_hyphens=False) or [""]
    return [Text(f"{stamp if i == 0 else ' ' * len(stamp)} {ln}", style="yellow") for i, ln in enumerate(lines)]


def _event_line(e: EventRow, cards: Mapping[str, Any] | None = None) -> Text:
    """One event as a log line; a card by its id and what it is (`efa47f0f… native_layer_norm`): ids alone told
    a reader nothing on a run of many cards."""
    import time

    stamp = time.strftime("%H:%M:%S", time.gmtime(e.ts))
    p = e.payload
    if e.kind == "stage":  # a step before the search (eager timing, references), said as the engine says it
        return Text(f"{stamp} {p.get('stage') or ''}: {p.get('message') or ''}", style="cyan")
    if e.kind == "evaluated":
        status = str(p.get("status") or "")
        ok = status == "verified"
        detail = (f"{p.get('candidate')} {fmt.us(p.get('best_us'))} µs {fmt.speedup(p.get('speedup'))}" if ok
                  else f"{p.get('candidate')} {status} {p.get('category') or ''}")
        # A dry run's 'compiled' did not fail: its own neutral mark, not a red ✗.
        glyph = fmt.STATUS_GLYPH.get(status, "✗")
        return Text.assemble(f"{stamp} ", (glyph + " ", fmt.STATUS_STYLE.get(status, "red")),
                             f"{_card_name(e.card_id, cards)} {detail}")
    extra = " ".join(f"{k}={v}" for k, v in sorted(p.items()) if v is not None)
    return Text(f"{stamp} {e.kind} {_card_name(e.card_id, cards)} {extra}".rstrip())


def _card_name(card_id: str | None, cards: Mapping[str, Any] | None) -> str:
    card = (cards or {}).get(card_id) if card_id else None
    if card is None:
        return card_id or ""
    label = card.label
    return f"{card_id[:8]} {label[:40] + '…' if len(label) > 40 else label}"
