"""Run the GPU-marked tests one process per test and write what each did.

A crash in one test (a segfault in a kernel or in the C++ router) takes a whole pytest session with it: its
summary, and every later test, are lost. Here each test runs alone, so a crash costs that test only and
is named, with the last lines it printed.

    python scripts/gpu_tests.py --out OUT                    # every test marked gpu under tests/
    python scripts/gpu_tests.py --out OUT -k cast_gpu        # those whose node id contains 'cast_gpu'

Writes OUT/gpu_tests.md (rewritten after every test) and OUT/logs/<n>.log; exit 0 when every test passed or
was skipped, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.errors import signal_name  # noqa: E402


def base_of(paths: list[str]) -> Path:
    """Where the tests run from: the repository for its own tests, else the folder holding the given paths
    (pytest names a test relative to its root folder)."""
    full = [Path(p).resolve() for p in paths]
    if all(f.is_relative_to(ROOT) for f in full):
        return ROOT
    return Path(os.path.commonpath([f if f.is_dir() else f.parent for f in full]))


def collect(paths: list[str], base: Path) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                        "--rootdir", str(base), *(str(Path(p).resolve()) for p in paths)],
                       capture_output=True, text=True, cwd=base)
    return [ln.strip() for ln in r.stdout.splitlines() if "::" in ln and not ln.startswith(" ")]


def verdict(rc: int, out: str) -> str:
    if rc < 0:
        return f"crashed ({signal_name(rc)})"
    if rc == 0:
        return "skipped" if " skipped" in out and " passed" not in out else "passed"
    return {1: "failed", 5: "not collected"}.get(rc, f"exit {rc}")


def table(rows: list[dict]) -> str:
    lines = ["# GPU tests, one process each", "", "| test | result | s | last line |", "|---|---|---:|---|"]
    for r in rows:
        last = r["last"].replace("|", "\\|")[:160]
        lines.append(f"| `{r['test']}` | {r['result']} | {r['seconds']:.0f} | {last} |")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    lines += ["", ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-k", dest="only", help="run the tests whose node id contains this text")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per test (default 900)")
    ap.add_argument("paths", nargs="*", default=["tests"])
    args = ap.parse_args()
    base = base_of(args.paths)
    nodes = [n for n in collect(args.paths, base) if not args.only or args.only in n]
    if not nodes:
        print(f"error: no test marked gpu under {' '.join(args.paths)}"
              + (f" matches -k {args.only!r}" if args.only else ""), file=sys.stderr)
        return 2
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, node in enumerate(nodes, 1):
        t0 = time.perf_counter()
        cmd = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-m", "gpu", "-q", "-rA", "-n", "0", "-p", "no:cacheprovider",
               "--rootdir", str(base), node]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=base, timeout=args.timeout)
            rc, out = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {args.timeout:.0f} s"
            out = out if isinstance(out, str) else out.decode(errors="replace")
        (logs / f"{i:02d}.log").write_text(f"$ {' '.join(cmd)}\n{out}")
        result = "timed out" if rc == 124 else verdict(rc, out)
        tail = [ln for ln in out.strip().splitlines() if ln.strip()]
        rows.append({"test": node, "result": result, "seconds": time.perf_counter() - t0,
                     "last": tail[-1].strip() if tail else ""})
        print(f"[{i}/{len(nodes)}] {result:>9}  {node}", flush=True)
        (args.out / "gpu_tests.md").write_text(table(rows))
    return 0 if all(r["result"] in ("passed", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
