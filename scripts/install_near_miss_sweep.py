"""The install near-miss sweep, whole: every case of tests/install_near_miss_models.py x N seeds. A cast proven on
model A (every module card A binds, captured on the CPU, eager as the plan) is installed into model B, which differs
from A in one construction detail or is changed after the install; B's output with the cast must equal its output
without, bitwise, and where B is A (a control) the cast must serve it (tests/test_install_near_miss_sweep.py).
Prints a table (per case: module cards A bound, B's hits, findings) and every finding.

    PYTHONPATH=.:tests python3 scripts/install_near_miss_sweep.py [--seeds 3] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from install_near_miss_models import CASES  # noqa: E402
from test_install_near_miss_sweep import outcome  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    names = [n for n in CASES if a.only in n]
    findings, runs = [], 0
    print(f"{'case':55s} {'bound':>6s} {'hits':>6s} {'declined':>9s}  findings")
    for name in names:
        bound, hits, declined, found = [], [], [], []
        for seed in range(a.seeds):
            with tempfile.TemporaryDirectory() as d:
                try:
                    got, info = outcome(name, seed, Path(d))
                except Exception as e:  # noqa: BLE001 - the capture or the cast failing is a finding too
                    got, info = [f"{name} seed {seed}: raised {type(e).__name__}: {str(e)[:300]}"], {}
            found += got
            bound.append(info.get("bound", 0))
            hits.append(sum((info.get("hits") or {}).values()))
            declined.append(sum(sum(x.values()) for x in (info.get("declines") or {}).values()))
            runs += 1
        findings += found
        kind = "control" if CASES[name].served else "B != A"
        print(f"{name:55s} {max(bound):6d} {sum(hits):6d} {sum(declined):9d}  {len(found)}  ({kind})")
    for f in findings:
        print("FINDING", f)
    print(f"{runs} runs ({len(names)} cases x {a.seeds} seeds), {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
