"""What `run` shows: live progress (rich on a terminal, JSON lines otherwise), the final table, --json."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from engine.errors import UsageError
from engine.outcomes import CARD_DONE_REASONS, CARD_SKIP_REASONS, PROPOSAL_FAILURES
from engine.progress import StageProgress, search_bar, stdout_console
from engine.run.orchestrator import CandidateRecord, Orchestrator

# Rejections of candidates that never compiled: the compile failures and the unusable answers.
UNCOMPILED = frozenset({"compile", *PROPOSAL_FAILURES})


def card_summaries(o: Orchestrator) -> list[dict[str, Any]]:
    """One entry per card, in DESIGN.md's `run --json` shape."""
    from engine.cards import compile_in_context

    context = compile_in_context([c.card for c in o.cards.values()])
    out = []
    for cid, card in o.cards.items():
        recs: list[CandidateRecord] = [r for r in o.records.values() if r.card_id == cid]
        verified = [r for r in recs if r.status == "verified" and r.best_us]
        best = min(verified, key=lambda r: r.best_us, default=None)
        failures: dict[str, int] = {}
        why: dict[str, str] = {}  # each category's latest message: what a card whose candidates all failed says
        for r in recs:
            if r.status == "rejected":
                failures[r.category or "unknown"] = failures.get(r.category or "unknown", 0) + 1
                if r.message:
                    why[r.category or "unknown"] = first_line(r.message)
        out.append({
            "id": cid, "op": card.ref.op, "signature": card.card.signature_text,
            "signature_detail": card.card.signature, "calls": card.card.calls, "share": card.share,
            # A channels-last twin's original (engine.capture.twins): the calls and share are counted there
            "twin_of": card.card.signature.get("twin_of"),
            # A convolution-bias fold's plain chain card (engine.capture.folds): the add it stands for is the
            # bias Inductor splits off a convolution; it is served under torch.compile only
            "folded_from": (card.card.signature.get("folded_from") or {}).get("card"),
            "eager_us": best.eager_us if best else card.eager_us, "best_us": best.best_us if best else None,
            "speedup": best.speedup if best else None,
            # The references beside eager (null where not measured): torch.compile of the op alone, and the
            # lane's copy of the card's bytes (best_us / copy_us: how near the kernel is to a copy).
            "compile_us": card.card.compile_us, "copy_us": card.card.copy_us,
            "compile_note": card.card.compile_note,
            # In context: the chains torch.compile fuses this op into, with the chain's compiled time.
            "compile_in_context": context.get(cid, []),
            "speedup_ci": list(best.speedup_ci) if best and best.speedup_ci else None,
            "candidates": len(recs),
            "compiled": sum(1 for r in recs if r.status in ("verified", "compiled") or
                            (r.status == "rejected" and r.category not in UNCOMPILED)),
            "verified": len(verified), "failures": failures, "failure_messages": why,
            "stopped": card.done_reason,
        })
    return sorted(out, key=lambda c: -c["share"])


def first_line(message: str, width: int = 240) -> str:
    """A message's first line, cut to `width` (where a table or summary has room for one line)."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= width else line[:width - 1] + "…"


def run_document(run_id: str, status: str, o: Orchestrator) -> dict[str, Any]:
    t = o.totals
    return {"run": run_id, "status": status, "stopped_by": o.stopped_by, "tokens": t.tokens_in + t.tokens_out,
            "tokens_in": t.tokens_in, "tokens_out": t.tokens_out, "cost_usd": round(t.cost_usd, 6),
            "proposals": t.proposals, "evaluations": t.evaluations,
            "gpu": o.hardware.name, "arch": o.hardware.arch, "cards": card_summaries(o)}


def search_progress(o: Orchestrator) -> tuple[int, int]:
    """The search's bar (engine.progress.search_bar) over the searched cards as the orchestrator sees them:
    a card may go on while Orchestrator.may_go_on says so. (Against cards × iterations it sat at a sixth of
    the way, then jumped to the end when the run finished.)"""
    searched = [c for c in o.cards.values() if c.done_reason not in CARD_SKIP_REASONS]
    return search_bar(((c.iterations, o.may_go_on(c)) for c in searched), o.budgets.iterations_per_card)


class Progress:
    """Event sink for `run --no-tui`: the search stage of a StageProgress (a bar updated in place on a
    terminal, one JSON line per event otherwise) with running counts: compiled, verified, failed."""

    def __init__(self, stages: StageProgress | None = None, json_lines: bool | None = None, dry: bool = False):
        self.stages = stages or StageProgress(json_lines=json_lines)
        self.counts = {"compiled": 0, "verified": 0, "failed": 0}
        self.dry = dry   # nothing is verified in a dry run: its line counts compiled and failed to compile

    def __call__(self, kind: str, payload: dict[str, Any], card_id: str | None, o: Orchestrator | None) -> None:
        if kind == "evaluated":
            status = payload.get("status", "rejected")
            key = "failed" if status == "rejected" else status
            self.counts[key] = self.counts.get(key, 0) + 1
            if status == "verified" or (status == "rejected" and payload.get("category") not in UNCOMPILED):
                self.counts["compiled"] += 1
        if self.stages.json_lines:
            extra = {"counts": dict(self.counts)} if kind == "evaluated" else {}
            self.stages.emit(kind, card=card_id, **payload, **extra)
            return
        if o is None:
            return
        open_cards = sum(1 for c in o.cards.values() if not c.done_reason)
        best = max((r.speedup for r in o.records.values() if r.speedup), default=None)
        used, total = search_progress(o)
        checked = (f" · rejected {self.counts['failed']} (dry run: nothing verified or timed)" if self.dry else
                   f" · verified {self.counts['verified']} · failed {self.counts['failed']}")
        message = (f"cards open {open_cards}/{len(o.cards)} · proposals {o.totals.proposals} · compiled "
                   f"{self.counts['compiled']}" + checked + (f" · best {best:.2f}×" if best else ""))
        self.stages.update("search", completed=used, total=total, message=message)
        if kind == "run_finished":
            # A search stopped with cards still open (wall time, cost, Ctrl-C) keeps its bar where it stopped.
            self.stages.done("search", fill=used >= total)


NARROW_BELOW = 120  # columns: under this the final table takes its narrow form (a terminal of 80 columns)


def _stop_words(doc: dict[str, Any]) -> str:
    """Why the run ended, in words: 'stopped by iterations' only where a card used up its iterations; a run
    whose every card ran out of revisions to try (or was skipped) before that is 'every card finished'."""
    why = doc.get("stopped_by")
    if why != "iterations":
        return f"stopped by {why}"
    ends: dict[str, int] = {}
    for c in doc.get("cards", []):
        ends[c.get("stopped") or "?"] = ends.get(c.get("stopped") or "?", 0) + 1
    if ends.get("iterations"):
        return "stopped by iterations"
    parts = ", ".join(f"{n} {k}" for k, n in sorted(ends.items(), key=lambda kv: -kv[1]))
    return f"every card finished before its iterations: {parts}" if parts else "stopped by iterations"


def print_final_table(doc: dict[str, Any], console: Console | None = None) -> None:
    """Card, eager µs, best µs, speedup with CI, candidates, failures by category, tokens, cost.

    A run that timed nothing (a dry run) has no eager, best or speedup columns: they would be dashes.
    Under NARROW_BELOW columns the table has no borders, ops lose their `aten::` prefix and the failures
    by category go below it, one card a line, so every column is read whole on an 80-column terminal."""
    if console is None:
        console = stdout_console()
        if not console.is_terminal:
            console = stdout_console(width=160)  # a log file is not an 80-column screen
    narrow = console.width < NARROW_BELOW
    rows = [c for c in doc["cards"] if c["candidates"] or c["stopped"] not in CARD_SKIP_REASONS]
    timed = any(c.get("eager_us") is not None or c.get("best_us") is not None for c in doc["cards"])
    # The title is a line of its own: as the table's title it was centred and wrapped to the table's width,
    # which a dry run's five columns make narrower than the reasons the run ended.
    console.print(f"run {doc['run']}: {doc['status']} ({_stop_words(doc)})", highlight=False)
    if narrow:
        from rich import box

        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
    else:
        table = Table(pad_edge=False)
    cols: list[tuple[str, str]] = [("op", "left"), ("card", "left"), ("calls", "right")]
    if timed:
        cols += [("eager µs", "right"), ("best µs", "right"), ("speedup (95% CI)", "right")]
    cols += [("cand", "right"), ("compiled", "right")]
    if timed:
        cols += [("verified", "right")]
    if not narrow:
        cols += [("failures", "left")]
    short = {"eager µs": "eager", "best µs": "best", "compiled": "comp", "verified": "ver"} \
        if narrow and timed else {}
    if short:
        table.caption = "µs per call · cand candidates · comp compiled · ver verified"
        table.caption_justify = "left"
    failed: list[str] = []
    body: list[list[str]] = []
    for c in rows:
        ci = c["speedup_ci"]
        sp = f"{c['speedup']:.2f}× ({ci[0]:.2f}–{ci[1]:.2f})" if c["speedup"] and ci else "–"
        fails = ", ".join(f"{k} {v}" for k, v in sorted(c["failures"].items()))
        op = c["op"].removeprefix("aten::") if narrow else c["op"]
        cells = [op, c["id"][:8], str(c["calls"])]
        if timed:
            cells += [_us(c["eager_us"]), _us(c["best_us"]), sp]
        cells += [str(c["candidates"]), str(c["compiled"])]
        if timed:
            cells += [str(c["verified"])]
        if not narrow:
            cells += [fails or "–"]
        elif fails:
            failed.append(f"  {op} {c['id'][:8]}: {fails}")
        body.append(cells)
    heads = [short.get(col, col) for col, _ in cols]
    # The op column gives way (ending in …) so that every number is shown whole.
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(heads)]
    op_room = max(8, console.width - sum(widths[1:]) - (len(widths) - 1)) if narrow else None
    for (col, just), head in zip(cols, heads):
        if col == "op":
            table.add_column(head, justify=just, no_wrap=True, overflow="ellipsis", max_width=op_room)
        else:
            table.add_column(head, justify=just, no_wrap=col != "failures")
    for cells in body:
        table.add_row(*cells)
    console.print(table)
    if failed:
        console.print("failures by category:", highlight=False)
        for line in failed:
            console.print(line, highlight=False)
    # A card none of whose candidates verified: why, in the lane's words (an H100 run's largest GroupNorm card
    # failed 9 of 9 candidates as "launch" and the message was only in the workspace database, 2026-12-06).
    for c in rows:
        if c["candidates"] and not c["verified"] and c.get("failure_messages"):
            op = c["op"].removeprefix("aten::")
            console.print(f"no candidate of {op} {c['id'][:8]} verified: " + "; ".join(
                f"{k}: {first_line(v)}" for k, v in sorted(c["failure_messages"].items())), highlight=False,
                soft_wrap=True)
    skipped = [c for c in doc["cards"] if not c["candidates"]]
    if skipped:
        reasons: dict[str, int] = {}
        for c in skipped:
            reasons[c["stopped"] or "not reached"] = reasons.get(c["stopped"] or "not reached", 0) + 1
        # Each reason with its meaning: 'noise' or 'declined' alone left a first-time user guessing.
        console.print("cards left on eager: " + ", ".join(
            f"{v} {k}" + (f" ({CARD_DONE_REASONS[k]})" if k in CARD_DONE_REASONS else "")
            for k, v in sorted(reasons.items())), highlight=False, soft_wrap=True)
    console.print(f"tokens {doc['tokens']} · cost ${doc['cost_usd']:.4f} · proposals {doc['proposals']} · "
                  f"evaluations {doc['evaluations']}", highlight=False)


def _us(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


# ---- scripting: `runs`, `compare --json / --plain` -------------------------------------------------------


def run_summaries(db_path: Any, refs: list[str] | None = None) -> list[dict[str, Any]]:
    """One entry per run (newest first; or the runs `refs` name, ids or unique prefixes, in that order):
    id, model, provider, LLM model, status, started, candidates per status, best speedup, tokens, cost."""
    from engine.store import open_readonly, samples_removed
    from engine.store import read as store_read

    conn = open_readonly(db_path)
    try:
        rows = store_read.runs(conn)
        if refs is not None:
            chosen = []
            for ref in refs:
                hits = [r for r in rows if r["id"] == ref] or [r for r in rows if r["id"].startswith(ref)]
                if len(hits) != 1:
                    known = ", ".join(r["id"] for r in rows[:5]) or "none"
                    why = "no such run" if not hits else f"{len(hits)} runs start so; give more of the id"
                    raise UsageError(f"compare: {ref!r}: {why} (latest: {known})")
                chosen.append(hits[0])
            rows = chosen
        out = []
        captures: dict[str, Any] = {}
        for r in rows:
            if r["capture_id"] not in captures:
                captures[r["capture_id"]] = store_read.capture(conn, r["capture_id"])
            counts = store_read.status_counts(conn, r["id"])
            best = store_read.best_speedups(conn, r["id"])
            speedups = [s for s, _ in best.values() if s]
            cfg = r.get("config") or {}
            gone = process_gone(r)
            out.append({
                "id": r["id"], "model": r["model"], "provider": r["provider"], "llm_model": cfg.get("model"),
                "status": r["status"], "stopped_by": r.get("stopped_by"), "process_gone": gone,
                "dry_run": bool(cfg.get("dry_run")),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r["created_at"])),
                "candidates": sum(counts.values()), "verified": counts.get("verified", 0),
                "compiled": counts.get("compiled", 0), "failed": counts.get("rejected", 0),
                "failures": store_read.failure_counts(conn, r["id"]),
                "best_speedup": max(speedups, default=None), "cards_improved": len(speedups),
                "tokens": (r.get("tokens_in") or 0) + (r.get("tokens_out") or 0),
                "cost_usd": round(r.get("cost_usd") or 0.0, 6),
                "exported": export_summary(store_read.latest_export(conn, r["id"])),
                # `kforge-tui prune --run-captures`: the run can no longer be resumed, its export synthesises inputs
                "samples_removed": samples_removed(captures[r["capture_id"]]),
            })
        return out
    finally:
        conn.close()


def process_gone(run: dict[str, Any]) -> bool:
    """A run marked going (created, running or paused) whose process, on this host, no longer exists (killed with
    SIGKILL, the machine rebooted): it is not going, and `run --resume` continues it. Unknown (another host, no pid)
    is False."""
    import os
    import socket

    from engine.outcomes import LIVE_RUN_STATUSES

    pid, cfg = run.get("pid"), run.get("config") or {}
    if run.get("status") not in LIVE_RUN_STATUSES or not pid or cfg.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError, ValueError):   # alive under another user, or not ours to ask
        return False
    return False


def held_by(run: dict[str, Any]) -> tuple[int, str] | None:
    """(pid, host) of the process that has the run going, where one may: a run marked created, running or paused,
    with a pid, whose process is not known to be gone (process_gone). On another host that cannot be known, and it
    counts as going (as `prune` counts it). None where no process has it."""
    from engine.outcomes import LIVE_RUN_STATUSES

    pid = run.get("pid")
    if run.get("status") not in LIVE_RUN_STATUSES or not pid or process_gone(run):
        return None
    return int(pid), str((run.get("config") or {}).get("host") or "an unknown host")


def running_elsewhere(run: dict[str, Any], workspace: Any) -> UsageError | None:
    """The refusal of `run --resume RUN` while another live process has RUN going (held_by): two processes searched
    one run, the second re-setting its budgets, pid and host under the first (red team F4). None where none has it."""
    import os
    import socket

    holder = held_by(run)
    if holder is None or holder[0] == os.getpid() and holder[1] == socket.gethostname():
        return None
    pid, host = holder
    if host == socket.gethostname():
        return UsageError(f"--resume {run['id']}: the run is {run['status']} in process {pid} on this host ({host}); "
                          f"stop that process first (Ctrl-C where it runs, or kill {pid}) or wait for it to end; to "
                          f"watch it: kforge-tui --run {run['id']} --workspace {workspace}")
    return UsageError(f"--resume {run['id']}: the run is {run['status']} in process {pid} on host {host}, which this "
                      f"host ({socket.gethostname()}) cannot check; stop it there first, or, if it is gone there (the "
                      f"host rebooted, or the workspace was copied from it), add --takeover")


def export_summary(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's latest recorded export in brief: when, how it ended, the cast, and per target asked the
    whole-model speedup (None where that target's check refused or did not measure); None if never exported."""
    if row is None:
        return None
    checks = [c for c in row.get("checks") or [] if isinstance(c, dict)]
    return {"at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(row["finished_at"])), "status": row["status"],
            "out": row.get("out_path"), "speedup": {c.get("target"): c.get("speedup") for c in checks}}


def _export_cell(e: dict[str, Any] | None) -> str | None:
    if e is None:
        return None
    if e["status"] != "written":
        return e["status"]
    return ", ".join(f"{t} {'–' if s is None else f'{s:.2f}×'}" for t, s in e["speedup"].items()) or "written"


def _plain_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    cells = [[h for h, _ in cols]] + [["–" if r.get(k) is None else
                                      (f"{r[k]:.2f}×" if k == "best_speedup" else str(r[k])) for _, k in cols]
                                     for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _mark_dry_run(r: dict[str, Any]) -> dict[str, Any]:
    # A dry run compiles and stops: without the mark it reads as a run that found nothing.
    return {**r, "status": f"{r['status']}, dry run"} if r.get("dry_run") else r


def cmd_runs(args: Any, workspace: Any) -> int:
    """`kforge-tui runs [--json]`: the workspace's runs, newest first."""
    from engine.store import db_path

    rows = run_summaries(db_path(workspace))
    if args.json:
        print(json.dumps({"workspace": str(workspace), "runs": rows}, separators=(",", ":"), default=str))
    elif not rows:
        print(f"no runs in {workspace} yet: start one with 'kforge-tui run CONFIG'")
    else:
        rows = [{**r, "status": f"{r['status']} (process gone: --resume it)"} if r.get("process_gone") else r
                for r in rows]
        rows = [_mark_dry_run(r) for r in rows]
        rows = [{**r, "status": f"{r['status']}, samples removed"} if r.get("samples_removed") else r for r in rows]
        print(_plain_table(rows, [("run", "id"), ("model", "model"), ("provider", "provider"),
                                  ("status", "status"), ("started", "started"), ("cand", "candidates"),
                                  ("verified", "verified"), ("best", "best_speedup")]))
    return 0


def cmd_compare(args: Any, workspace: Any) -> int:
    """`kforge-tui compare RUN… --json | --plain`: the runs side by side, without the TUI."""
    from engine.store import db_path

    rows = run_summaries(db_path(workspace), list(args.runs))
    if args.json:
        print(json.dumps({"workspace": str(workspace), "runs": rows}, separators=(",", ":"), default=str))
        return 0
    rows = [_mark_dry_run(r) for r in rows]
    fields = [("run", "id"), ("model", "model"), ("provider", "provider"), ("llm model", "llm_model"),
              ("status", "status"), ("stopped by", "stopped_by"), ("started", "started"),
              ("candidates", "candidates"), ("compiled", "compiled"), ("verified", "verified"),
              ("failed", "failed"), ("cards improved", "cards_improved"), ("best speedup", "best_speedup"),
              ("exported (whole model)", "exported"), ("capture samples", "samples_removed"), ("tokens", "tokens"),
              ("cost USD", "cost_usd")]
    # One column per run: the rows are the facts, as the TUI's compare reads.
    table = [{"fact": label, **{r["id"]: r.get(k) for r in rows}} for label, k in fields]
    for t, (_, k) in zip(table, fields):
        if k == "best_speedup":
            for r in rows:
                t[r["id"]] = "–" if r.get(k) is None else f"{r[k]:.2f}×"
        elif k == "exported":
            for r in rows:
                t[r["id"]] = _export_cell(r.get(k))
        elif k == "samples_removed":
            for r in rows:
                t[r["id"]] = r.get(k) or "kept"
    print(_plain_table([{**t, **{rid: ("–" if v is None else v) for rid, v in t.items()}} for t in table],
                       [("", "fact")] + [(r["id"], r["id"]) for r in rows]))
    return 0
