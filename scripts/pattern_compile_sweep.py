"""The pattern replacement sweep under torch.compile, whole (CPU): does a cast's pattern card ever change what the
compiled model computes? Three parts, each compiled with the cast and with torch.compile alone (the noise scale):

- near misses: every case of tests/pattern_compile_cases.py (model A's chain cards compiled into model B, which
  differs in one detail: a constant, an operand order, a dtype, an extra reader, a view, a graph break, ...);
- own cards: every model of tests/chain_sweep_models.py compiled with a cast of its own chain cards (static and
  dynamic shapes);
- every card: every model compiled with one cast holding the chain cards of all of them (a pattern inside, around
  or beside another model's).

Prints each finding (values off eager beyond the noise, a card run where the case says it computes something else,
a compile that raises), and a count.

    PYTHONPATH=.:tests python3 scripts/pattern_compile_sweep.py [--only SUBSTRING] [--part near|own|dynamic|all]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from chain_sweep_models import PATTERNS, build  # noqa: E402
from pattern_compile_cases import CASES  # noqa: E402
from test_pattern_compile_sweep import chain_signatures, compile_and_compare, sweep_case, sweep_model  # noqa: E402

from engine.capture.chains import chain_card_id  # noqa: E402


def _report(label: str, run, counts: dict) -> None:
    t0 = time.perf_counter()
    try:
        out = run()
        problems, what = out.problems, f"cards={out.cards} matches={out.matches} plan calls={out.plan_calls}"
    except Exception as e:  # noqa: BLE001 - a compile or run that raises is a finding
        problems, what = [f"raised {type(e).__name__}: {str(e)[:400]}"], "raised"
    counts["cases"] += 1
    counts["findings"] += bool(problems)
    print(f"{'FINDING' if problems else 'ok':8s} {label}: {what} ({time.perf_counter() - t0:.1f} s)", flush=True)
    for p in problems:
        print(f"         {p}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--part", default="all", choices=["near", "own", "dynamic", "every", "all"])
    a = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="pattern-sweep-"))
    counts = {"cases": 0, "findings": 0}
    parts = ["near", "own", "dynamic", "every"] if a.part == "all" else [a.part]
    if "near" in parts:
        for name in CASES:
            if a.only in name:
                _report(f"near miss '{name}'", lambda name=name: sweep_case(name), counts)
    models = [n for n in PATTERNS if a.only in n]
    for part, dynamic in (("own", False), ("dynamic", True)):
        if part in parts:
            for name in models:
                _report(f"{part} '{name}'", lambda name=name, d=dynamic: sweep_model(name, dynamic=d), counts)
    if "every" in parts:
        every: dict[str, dict] = {}
        for name in PATTERNS:
            m, inputs = build("cpu", None, name, 0)
            every.update({chain_card_id(s): s for s in chain_signatures(m.eval(), inputs)})
        for name in models:
            m, inputs = build("cpu", None, name, 0)  # the sizes of the cards: the patterns meet each other
            _report(f"every card '{name}'", lambda m=m, i=inputs: compile_and_compare(
                list(every.values()), m.eval(), [i], False), counts)
    print(f"\n{counts['findings']} finding(s) in {counts['cases']} case(s)")
    return 1 if counts["findings"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
