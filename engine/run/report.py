"""What `run` shows: live progress (rich on a terminal, JSON lines otherwise), the final table, --json."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from engine.outcomes import CARD_SKIP_REASONS, PROPOSAL_FAILURES
from engine.run.orchestrator import CandidateRecord, Orchestrator

# Rejections of candidates that never compiled: the compile failures and the unusable answers.
UNCOMPILED = frozenset({"compile", *PROPOSAL_FAILURES})


def card_summaries(o: Orchestrator) -> list[dict[str, Any]]:
    """One entry per card, in DESIGN.md's `run --json` shape."""
    out = []
    for cid, card in o.cards.items():
        recs: list[CandidateRecord] = [r for r in o.records.values() if r.card_id == cid]
        verified = [r for r in recs if r.status == "verified" and r.best_us]
        best = min(verified, key=lambda r: r.best_us, default=None)
        failures: dict[str, int] = {}
        for r in recs:
            if r.status == "rejected":
                failures[r.category or "unknown"] = failures.get(r.category or "unknown", 0) + 1
        out.append({
            "id": cid, "op": card.ref.op, "calls": card.card.calls, "share": card.share,
            "eager_us": best.eager_us if best else card.eager_us, "best_us": best.best_us if best else None,
            "speedup": best.speedup if best else None,
            "speedup_ci": list(best.speedup_ci) if best and best.speedup_ci else None,
            "candidates": len(recs),
            "compiled": sum(1 for r in recs if r.status in ("verified", "compiled") or
                            (r.status == "rejected" and r.category not in UNCOMPILED)),
            "verified": len(verified), "failures": failures, "stopped": card.done_reason,
        })
    return sorted(out, key=lambda c: -c["share"])


def run_document(run_id: str, status: str, o: Orchestrator) -> dict[str, Any]:
    t = o.totals
    return {"run": run_id, "status": status, "stopped_by": o.stopped_by, "tokens": t.tokens_in + t.tokens_out,
            "tokens_in": t.tokens_in, "tokens_out": t.tokens_out, "cost_usd": round(t.cost_usd, 6),
            "proposals": t.proposals, "evaluations": t.evaluations, "cards": card_summaries(o)}


class Progress:
    """Event sink for `run --no-tui`: a refreshed status line on a terminal, JSON lines otherwise.

    On a terminal the line is redrawn at most every 0.25 s (never once per event).
    """

    def __init__(self, stream=None, json_lines: bool | None = None):
        self.stream = stream or sys.stderr
        self.json_lines = (not self.stream.isatty()) if json_lines is None else json_lines
        self.console = Console(file=self.stream)
        self._last = 0.0
        self.counts = {"verified": 0, "rejected": 0, "compiled": 0}

    def __call__(self, kind: str, payload: dict[str, Any], card_id: str | None, o: Orchestrator | None) -> None:
        if kind == "evaluated":
            self.counts[payload.get("status", "rejected")] = self.counts.get(payload.get("status", "rejected"), 0) + 1
        if self.json_lines:
            self.stream.write(json.dumps({"t": round(time.time(), 3), "event": kind, "card": card_id, **payload},
                                         default=str) + "\n")
            self.stream.flush()
            return
        now = time.monotonic()
        if o is None or (now - self._last < 0.25 and kind not in ("run_finished", "run_started")):
            return
        self._last = now
        open_cards = sum(1 for c in o.cards.values() if not c.done_reason)
        best = max((r.speedup for r in o.records.values() if r.speedup), default=None)
        self.console.print(
            f"[dim]{time.strftime('%H:%M:%S')}[/] cards open {open_cards}/{len(o.cards)} · proposals "
            f"{o.totals.proposals} · verified {self.counts['verified']} · rejected {self.counts['rejected']}"
            f" · best {best:.2f}×" if best else
            f"[dim]{time.strftime('%H:%M:%S')}[/] cards open {open_cards}/{len(o.cards)} · proposals "
            f"{o.totals.proposals} · verified {self.counts['verified']} · rejected {self.counts['rejected']}",
            highlight=False)


def print_final_table(doc: dict[str, Any], console: Console | None = None) -> None:
    """Card, eager µs, best µs, speedup with CI, candidates, failures by category, tokens, cost."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)  # a log file is not an 80-column screen
    table = Table(title=f"run {doc['run']}: {doc['status']} (stopped by {doc['stopped_by']})", pad_edge=False)
    for col, just in (("op", "left"), ("card", "left"), ("calls", "right"), ("eager µs", "right"),
                      ("best µs", "right"), ("speedup (95% CI)", "right"), ("cand", "right"),
                      ("compiled", "right"), ("verified", "right"), ("failures", "left")):
        table.add_column(col, justify=just, no_wrap=col != "failures")
    for c in doc["cards"]:
        if not c["candidates"] and c["stopped"] in CARD_SKIP_REASONS:
            continue
        ci = c["speedup_ci"]
        sp = f"{c['speedup']:.2f}× ({ci[0]:.2f}–{ci[1]:.2f})" if c["speedup"] and ci else "–"
        fails = ", ".join(f"{k} {v}" for k, v in sorted(c["failures"].items())) or "–"
        table.add_row(c["op"], c["id"][:8], str(c["calls"]), _us(c["eager_us"]), _us(c["best_us"]), sp,
                      str(c["candidates"]), str(c["compiled"]), str(c["verified"]), fails)
    console.print(table)
    skipped = [c for c in doc["cards"] if not c["candidates"]]
    if skipped:
        reasons: dict[str, int] = {}
        for c in skipped:
            reasons[c["stopped"] or "not reached"] = reasons.get(c["stopped"] or "not reached", 0) + 1
        console.print("cards left on eager: " + ", ".join(f"{v} {k}" for k, v in sorted(reasons.items())),
                      highlight=False)
    console.print(f"tokens {doc['tokens']} · cost ${doc['cost_usd']:.4f} · proposals {doc['proposals']} · "
                  f"evaluations {doc['evaluations']}", highlight=False)


def _us(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"
