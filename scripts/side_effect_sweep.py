"""The side-effect sweep, whole: every case of tests/side_effect_models.py x N seeds, captured on the CPU, every module
card it binds installed with eager as its plan, the model run several calls with and without the cast, and the
outputs, the effect's state, the generators' states and what was printed, warned and logged compared
(tests/test_side_effect_sweep.py). Prints a table (per case: module cards bound and calls served per seed, findings,
and why a card did not bind or was declined), every finding, and a count.

    PYTHONPATH=.:tests python3 scripts/side_effect_sweep.py [--seeds 3] [--only SUBSTRING] [--why]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from side_effect_models import CASES, LEGIT  # noqa: E402
from test_side_effect_sweep import problems  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--why", action="store_true", help="say why each card did not bind or was declined")
    a = ap.parse_args()
    names = [n for n in CASES if a.only in n]
    findings, runs = [], 0
    print(f"{'case':46s} {'ctl':3s} {'bound/served per seed':28s} findings")
    for name in names:
        cells, whys, mine = [], set(), []
        for seed in range(a.seeds):
            with tempfile.TemporaryDirectory() as d:
                try:
                    found, info = problems(name, seed, Path(d))
                except Exception as e:  # noqa: BLE001 - the capture or the cast failing is a finding too
                    found, info = [f"{name} seed {seed}: raised {type(e).__name__}: {str(e)[:300]}"], {}
            mine += found
            runs += 1
            cells.append(f"{len(info.get('bound', []))}/{info.get('hits', 0)}")
            whys |= set(info.get("unbound", [])) | {f"{k} x{v}" for k, v in info.get("declines", {}).items()}
        findings += mine
        print(f"{name[:46]:46s} {'yes' if name in LEGIT else '':3s} {' '.join(cells):28s} {len(mine)}")
        if a.why:
            for w in sorted(whys):
                print(f"{'':50s}- {w[:150]}")
    for f in findings:
        print("FINDING", f[:400])
    print(f"{runs} runs ({len(names)} cases x {a.seeds} seeds), {len(findings)} findings in "
          f"{len({f.split(' seed ')[0] for f in findings})} cases")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
