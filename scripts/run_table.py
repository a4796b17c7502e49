#!/usr/bin/env python3
"""A run of a workspace store as Markdown: every card the search worked on (eager µs, best µs, speedup with
its 95 % CI, the best kernel against the lane's copy of the card's bytes and against torch.compile of the card,
candidates, verified, failures by category, why it stopped) and the run's totals.

    python scripts/run_table.py WORKSPACE/kforge.db [--run RUN] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.capture.twins import twins_among  # noqa: E402
from engine.outcomes import UNKNOWN_CATEGORY, faster_with_confidence  # noqa: E402
from engine.run.report import first_line  # noqa: E402
from engine.store import open_readonly, read  # noqa: E402


def render(db_path: Path, run_id: str | None = None) -> str:
    db = open_readonly(db_path)
    try:
        run = read.run(db, run_id) if run_id else read.latest_run(db)
        if run is None:
            raise SystemExit(f"error: {db_path}: no run {run_id or ''}".rstrip())
        cards = {r["card_id"]: r for r in read.cards_of_capture(db, run["capture_id"])}
        cands = read.candidates(db, run["id"])
        events = read.events_since(db, run["id"])
    finally:
        db.close()
    stopped = {e["card_id"]: (e["payload"] or {}).get("reason") for e in events if e["kind"] == "card_done"}
    skipped = {e["card_id"]: (e["payload"] or {}).get("reason") for e in events if e["kind"] == "card_skipped"}
    evaluated = [e["ts"] for e in events if e["kind"] == "evaluated"]
    proposals = sum(1 for e in events if e["kind"] in ("declined", "duplicate")) + len(cands)
    per: dict[str, list] = {}
    for c in cands:
        per.setdefault(c["card_id"], []).append(c)
    rows = []
    for cid, cs in per.items():
        card = cards[cid]
        ok = [c for c in cs if c["status"] == "verified" and c["best_us"]]
        best = min(ok, key=lambda c: c["best_us"]) if ok else None
        fails: dict[str, int] = {}
        for c in cs:
            if c["status"] == "rejected":
                cat = c["category"] or UNKNOWN_CATEGORY
                fails[cat] = fails.get(cat, 0) + 1
        rows.append((card, cs, ok, best, fails))
    rows.sort(key=lambda r: -(r[0]["share"] or 0.0))
    shares = share_texts(cards)
    span = (max(evaluated) - min(evaluated)) if len(evaluated) > 1 else 0.0
    won = [r for r in rows if r[3] is not None
           and faster_with_confidence((r[3]["speedup_low"], r[3]["speedup_high"]))]
    lines = [f"# Run {run['id']}: {run['model']}, provider {run['provider']}", "",
             f"Status {run['status']}, stopped by {run['stopped_by']}. {len(cards)} cards captured, "
             f"{len(per)} searched ({_unsearched(cards, per, skipped, run['stopped_by'])}), "
             f"{len(won)} with a verified kernel faster than eager with confidence. {len(cands)} candidates "
             f"evaluated from {proposals} proposals (the rest were duplicates or declines, never evaluated); "
             f"{60 * len(cands) / span:.0f} candidates per minute while the search ran ({span:.0f} s)."
             if span else f"Status {run['status']}.", "",
             "| op | signature | calls | share | eager µs | best µs | speedup (95 % CI) | copy µs | best at % of copy "
             "| torch.compile µs | best vs compile | candidates | verified | failures | stopped |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for card, cs, ok, best, fails in rows:
        sig = _signature_text(card)
        if best is not None:
            sp = f"{best['speedup']:.2f}× ({best['speedup_low']:.2f}–{best['speedup_high']:.2f})"
            b = f"{best['best_us']:.1f}"
        else:
            sp, b = "–", "–"
        eager = f"{card['eager_us']:.1f}" if card["eager_us"] else "–"
        fail = ", ".join(f"{k} {v}" for k, v in fails.items()) or "–"
        refs = _references(card, best["best_us"] if best is not None else None)
        share = shares[card["card_id"]]
        lines.append(f"| `{card['op']}` | {sig} | {card['calls']:g} | {share} | {eager} | "
                     f"{b} | {sp} | {refs} | {len(cs)} | {len(ok)} | {fail} | {stopped.get(card['card_id'], '–')} |")
    before = _before_search(cards.values())
    # Why a card none of whose candidates verified was left on eager, in the lane's words (an H100 run's largest
    # GroupNorm card failed 9 of 9 as "launch", and this table said no more, 2026-12-06).
    none = []
    for card, cs, ok, _best, _fails in rows:
        why = {c["category"] or UNKNOWN_CATEGORY: c["error"] for c in cs
               if c["status"] == "rejected" and c.get("error")}
        if not ok and why:
            none.append(f"- `{card['op']}` {card['card_id'][:8]}: no candidate verified; "
                        + "; ".join(f"{k}: {first_line(v)}".replace("|", "\\|") for k, v in sorted(why.items())))
    return "\n".join(lines + ([""] + none if none else []) + ([""] + before if before else [])) + "\n"


def _references(card: dict, best_us: float | None) -> str:
    """Four cells: the lane's copy of the card's bytes, the best kernel's time as a share of it (a memory-bound
    kernel cannot beat 100 %), torch.compile of the card, and the best kernel's speedup over that."""
    copy, comp = card.get("copy_us"), card.get("compile_us")
    cells = [f"{copy:.1f}" if copy else "–",
             f"{100 * copy / best_us:.0f} %" if copy and best_us else "–",
             f"{comp:.1f}" if comp else "–",
             f"{comp / best_us:.2f}×" if comp and best_us else "–"]
    return " | ".join(cells)


def _before_search(cards) -> list[str]:
    """Where the run's time before its search went, from the seconds stored with each card's eager and
    reference stats (runs from before they were stored: nothing)."""
    load = measure = copy = comp = 0.0
    n_eager = n_refs = 0
    for c in cards:
        es = c.get("eager_stats") or {}
        rs = c.get("ref_stats") or {}
        sec = es.get("seconds") if isinstance(es, dict) else None
        if sec:
            n_eager += 1
            load += sec.get("load", 0.0)
            measure += sec.get("measure", 0.0)
        if isinstance(rs, dict) and ((rs.get("copy") or {}).get("seconds") or "seconds" in (rs.get("compile") or {})):
            n_refs += 1
            copy += ((rs.get("copy") or {}).get("seconds") or {}).get("measure", 0.0)
            comp += (rs.get("compile") or {}).get("seconds", 0.0)
    if not n_eager and not n_refs:
        return []
    return [f"Before the search: eager timed for {n_eager} card(s) in {load + measure:.0f} s (loading their "
            f"samples {load:.0f} s, timing {measure:.0f} s); references for {n_refs} card(s): the copy "
            f"{copy:.0f} s, torch.compile {comp:.0f} s."]


SKIP_WORDS = {"not-selected": "not selected by --ops", "declined": "no template (declined)",
              "noise": "below the noise floor", "no-samples": "without samples"}


def share_texts(cards: dict[str, dict]) -> dict[str, str]:
    """Each card's share as the table shows it: a channels-last twin's calls are its original's ("twin of");
    a hidden call's share is its part of the call that makes it, once eager was timed for it ("in")."""
    from engine.capture.hidden import makers_of, row_shares

    twins = twins_among([(c["card_id"], c["op"], c["signature"]) for c in cards.values()])
    shares = row_shares(cards)
    out = {}
    for cid, r in cards.items():
        sig = r.get("signature")
        makers = makers_of(json.loads(sig) if isinstance(sig, str) else (sig or {}))
        inside = ", ".join(m[:8] for m in makers)
        out[cid] = (f"twin of {twins[cid][:8]}" if cid in twins else
                    f"{100 * shares[cid]:.1f} % in {inside}" if makers else f"{100 * (shares[cid] or 0):.1f} %")
    return out


def _unsearched(cards: dict, searched: dict, skipped: dict, stopped_by: str | None) -> str:
    """Why the cards not searched were not, counted by reason; a card that was neither skipped nor searched
    was still waiting its turn when the run stopped (the planner had better cards, or the time ran out)."""
    by: dict[str, int] = {}
    for cid in cards:
        if cid in searched:
            continue
        why = skipped.get(cid)
        text = SKIP_WORDS.get(why, why) if why else f"still waiting when the run stopped ({stopped_by or 'ended'})"
        by[text] = by.get(text, 0) + 1
    if not by:
        return "every card"
    return "the rest: " + ", ".join(f"{n} {text}" for text, n in sorted(by.items(), key=lambda kv: -kv[1]))


def _signature_text(card) -> str:
    try:
        from engine.capture.signature import signature_text

        text = signature_text(card["signature"])
    except Exception:
        text = card["card_id"]
    return text if len(text) <= 70 else text[:67] + "…"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--run")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = render(args.db, args.run)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
