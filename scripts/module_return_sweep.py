"""The module-return sweep, whole: every pattern of tests/module_return_models.py x N seeds, captured on the CPU,
every module card it binds installed with eager as its plan, the model's output compared with and without the cast
(tests/test_module_return_sweep.py). Prints every finding (a bound card that changes the output, a legitimate module
card that does not bind or is not served), and a count.

    PYTHONPATH=.:tests python3 scripts/module_return_sweep.py [--seeds 3] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from module_return_models import PATTERNS  # noqa: E402
from test_module_return_sweep import problems  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    findings, runs, cards = [], 0, 0
    for name in PATTERNS:
        if a.only and a.only not in name:
            continue
        bound = []
        for seed in range(a.seeds):
            with tempfile.TemporaryDirectory() as d:
                try:
                    found, n = problems(name, seed, Path(d))
                except Exception as e:  # noqa: BLE001 - the capture or the cast failing is a finding too
                    found, n = [f"{name} seed {seed}: raised {type(e).__name__}: {str(e)[:300]}"], 0
            findings += found
            bound.append(n)
            runs += 1
            cards += n
        print(f"{name:40s} module cards bound per seed {bound}  findings {sum(name in f for f in findings)}")
    for f in findings:
        print("FINDING", f)
    print(f"{runs} captures ({len([n for n in PATTERNS if a.only in n])} patterns x {a.seeds} seeds), "
          f"{cards} module cards bound, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
