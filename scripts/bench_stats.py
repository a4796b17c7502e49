#!/usr/bin/env python3
"""How long the lane's bootstrap CI of a speedup takes (it runs once per timed candidate, on the lane's CPU).

    python scripts/bench_stats.py [--pairs 2000] [--resamples 2000] [--repeat 5]

Prints the best and median seconds of `speedup_ci` over `--repeat` seeds, paired (as the lane calls it)
and unpaired, on lognormal timings. About 0.06 s paired for 2000 pairs on a 2-core laptop. No GPU needed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from engine.bench.stats import speedup_ci  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2000, help="timed pairs per arm (default 2000, the lane's max_reps)")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    drift = rng.lognormal(0.0, 0.05, args.pairs)  # shared by both arms of a pair, as A/B alternation gives
    eager = 20.0 * drift * rng.lognormal(0.0, 0.02, args.pairs)
    cand = 10.0 * drift * rng.lognormal(0.0, 0.02, args.pairs)
    speedup_ci(eager, cand, n_boot=args.resamples)  # warm-up (imports, allocator)
    for paired in (True, False):
        times = []
        for seed in range(args.repeat):
            t0 = time.perf_counter()
            speedup_ci(eager, cand, paired=paired, n_boot=args.resamples, seed=seed)
            times.append(time.perf_counter() - t0)
        print(f"speedup_ci {'paired' if paired else 'unpaired'}, {args.pairs} pairs, {args.resamples} resamples: "
              f"best {min(times):.4f} s, median {statistics.median(times):.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
