"""The single-op variant sweep under torch.compile, whole (CPU): does a cast's op variant ever change what the
compiled model computes? Each case of tests/op_compile_cases.py proves model A's call of one ATen op (plan: PyTorch's
own kernel) and compiles a function B that differs from it in one detail (or is A) through `compose.compile`; B's
outputs are compared with eager's within plain torch.compile's noise, and the variant's hits with what the case
allows. Prints each finding (values off, a variant run on a call that is not A's, a compile or run that raises), and
a count.

    PYTHONPATH=.:tests python3 scripts/op_compile_sweep.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from op_compile_cases import CASES, sweep_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="op-sweep-"))
    cases = findings = 0
    for name in CASES:
        if a.only not in name:
            continue
        t0 = time.perf_counter()
        try:
            out = sweep_case(name)
            problems, what = out.problems, f"hits={out.hits} (fire: {CASES[name].fire})"
        except Exception as e:  # noqa: BLE001 - a compile or run that raises is a finding
            problems, what = [f"raised {type(e).__name__}: {str(e)[:400]}"], "raised"
        cases += 1
        findings += bool(problems)
        print(f"{'FINDING' if problems else 'ok':8s} {name}: {what} ({time.perf_counter() - t0:.1f} s)", flush=True)
        for p in problems:
            print(f"         {p}", flush=True)
    print(f"\n{findings} finding(s) in {cases} case(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
