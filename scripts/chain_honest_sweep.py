"""The honest sweep of chain cards, whole: every pattern of tests/chain_sweep_models.py x N seeds, each chain card
captured on the CPU and its own eager verified, timed with audits and re-checked as the candidate
(tests/test_chain_honest_sweep.py). Prints every false rejection found, and a count.

    PYTHONPATH=.:tests python3 scripts/chain_honest_sweep.py [--seeds 10] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

import pytest  # noqa: E402
from chain_sweep_models import PATTERNS  # noqa: E402
from test_chain_honest_sweep import sweep_one  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--only", default="")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    bad = runs = cards = 0
    for name in PATTERNS:
        if a.only and a.only not in name:
            continue
        t0 = time.perf_counter()
        found, seen = [], []
        for seed in range(a.seeds):
            with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
                try:
                    problems = sweep_one(mp, Path(d), name, seed, seen)
                except Exception as e:  # noqa: BLE001 - the capture itself failing is a finding
                    problems = [f"capture raised {type(e).__name__}: {str(e)[:300]}"]
            runs += 1
            found += [f"seed {seed}: {p}" for p in problems]
        bad += bool(found)
        cards += len(seen)
        print(f"{name}: {len(seen)} chain cards, {len(set(seen))} distinct, {len(found)} problems ({time.perf_counter() - t0:.1f} s)", flush=True)
        if a.verbose:
            for t in sorted(set(seen)):
                print("      card", t[:160])
        for p in found[:6]:
            print("   ", p[:400], flush=True)
    print(f"{runs} captures, {cards} chain cards; {bad} patterns with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
