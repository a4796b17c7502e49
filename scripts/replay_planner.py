#!/usr/bin/env python3
"""Replay a run's recorded candidate outcomes through the planner (`engine.run.plan`), on the CPU: which cards
would get the run's evaluations, in what number, with today's planner.

    python scripts/replay_planner.py WORKSPACE/kforge.db [--run RUN] [--evaluations N] [--ops REGEX]   # as run --ops

Each card's i-th evaluation returns the i-th recorded candidate time of that card (cycled); a card the run
never searched returns, on every evaluation, its eager time over the median first-candidate speedup of the
searched cards of the same op (a stand-in, said so in the output; cards of an op nobody searched are left
out). Evaluations are one at a time (the run's lane did them one at a time too). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cards import card_from_row, card_selected  # noqa: E402
from engine.run.plan import CardState, SchedulePolicy, count_chains_once, next_card  # noqa: E402
from engine.store import open_readonly, read  # noqa: E402


def replay(db_path: Path, run_id: str | None, evaluations: int | None, ops: str | None) -> str:
    db = open_readonly(db_path)
    try:
        run = read.run(db, run_id) if run_id else read.latest_run(db)
        if run is None:
            raise SystemExit(f"error: {db_path}: no run {run_id or ''}".rstrip())
        rows = read.cards_of_capture(db, run["capture_id"])
        cands = sorted(read.candidates(db, run["id"]), key=lambda c: c["created_at"] or 0)
    finally:
        db.close()
    times: dict[str, list[float]] = {}
    for c in cands:
        if c["status"] == "verified" and c["best_us"]:
            times.setdefault(c["card_id"], []).append(c["best_us"])
    first: dict[str, list[float]] = {}
    for r in rows:
        if r["card_id"] in times and r["eager_us"]:
            first.setdefault(r["op"], []).append(r["eager_us"] / times[r["card_id"]][0])
    stand_in = {op: statistics.median(v) for op, v in first.items()}
    cards, notes = [], []
    for r in rows:
        card = card_from_row(r)
        if not card.eager_us or not card_selected(card.op, card.chain, card.signature_text, ops):
            continue
        if card.card_id in times or card.op in stand_in:
            cards.append(card)
    policy = SchedulePolicy()
    states = [CardState(c, ["replay"]) for c in cards]
    turns: dict[str, int] = {}
    n = evaluations if evaluations is not None else len(cands)
    for _ in range(n):
        count_chains_once(states)
        card = next_card(states, policy, 50)
        if card is None:
            break
        k = turns.get(card.card_id, 0)
        got = times.get(card.card_id)
        card.record(got[k % len(got)] if got else card.eager_us / stand_in[card.card.op], policy)
        turns[card.card_id] = k + 1
    for op, sp in sorted(stand_in.items()):
        notes.append(f"- unsearched `{op}` cards stand in at {sp:.2f}× (median first candidate of its searched cards)")
    lines = [f"# Planner replay of {run['id']} ({run['model']}): {n} evaluations", "", *notes, "",
             "| op | kind | card | share | eager µs | searched in the run | turns in the replay |",
             "|---|---|---|---:|---:|---:|---:|"]
    for s in sorted(states, key=lambda s: -s.share):
        kind = (s.card.chain or {}).get("kind", "op")
        lines.append(f"| `{s.card.op}` | {kind} | {s.card_id[:8]} | {100 * s.share:.1f} % | {s.eager_us:.0f} | "
                     f"{len(times.get(s.card_id, []))} | {turns.get(s.card_id, 0)} |")
    with_kernel = sum(1 for s in states if s.card.chain is None and turns.get(s.card_id))
    lines += ["", f"Op cards with a kernel after the replay: {with_kernel} of "
                  f"{sum(1 for s in states if s.card.chain is None)}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--run")
    ap.add_argument("--evaluations", type=int, help="default: as many as the run evaluated")
    ap.add_argument("--ops", help="only the cards `run --ops` would take with this regular expression")
    args = ap.parse_args()
    if not args.db.is_file():
        print(f"error: {args.db}: no such workspace store; give a workspace's kforge.db", file=sys.stderr)
        return 2
    print(replay(args.db, args.run, args.evaluations, args.ops), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
