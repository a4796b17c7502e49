"""`export --sanitize`: NVIDIA compute-sanitizer on each confirmed variant before it ships.

Per variant and tool (memcheck: out-of-bounds and misaligned accesses; racecheck: shared-memory hazards;
synccheck: invalid barriers), the exporter runs

    compute-sanitizer --tool TOOL --error-exitcode 86 --log-file LOG ... \\
        python -m engine.export.sanitize --cast FILE.cast --variant ID --out RESULT.json [--samples P ...]

The child installs only that variant and calls the public op on the variant's own captured samples (on
inputs synthesised from its signature where there are none), so the variant's kernels run exactly as in
the model. PyTorch's caching allocator is off in the child: memcheck then sees each tensor's own
allocation, and a write past an output lands outside any allocation instead of in a pooled neighbour.

The sanitizer also sees PyTorch's kernels and CUDA API calls. A finding is held against the variant only
where its log names one of the variant's kernels (the manifest's `kernels`); others are reported as
warnings. A finding in the variant's kernels, a crash, a run that never reached the kernel, or one that
did not finish in time drops the variant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS = ("memcheck", "racecheck", "synccheck")
ERROR_EXITCODE = 86
TIMEOUT_S = 300.0  # per variant and tool: racecheck instruments every shared-memory access
FALLBACK_DIRS = ("/usr/local/cuda/bin",)
PREFIX = "========="


def find_sanitizer(environ: dict[str, str] | None = None) -> str | None:
    """compute-sanitizer on PATH, else in $CUDA_HOME/bin, else in /usr/local/cuda/bin; None if nowhere."""
    environ = os.environ if environ is None else environ
    found = shutil.which("compute-sanitizer", path=environ.get("PATH"))
    if found:
        return found
    dirs = [str(Path(environ["CUDA_HOME"]) / "bin")] if environ.get("CUDA_HOME") else []
    for d in [*dirs, *FALLBACK_DIRS]:
        exe = Path(d) / "compute-sanitizer"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return None


def require_sanitizer(environ: dict[str, str] | None = None) -> str:
    """The compute-sanitizer to run, or a UsageError (exit 2) naming the missing tool and the fix."""
    from engine.errors import UsageError

    found = find_sanitizer(environ)
    if found is None:
        raise UsageError("export --sanitize: compute-sanitizer not found (not on PATH, in $CUDA_HOME/bin or "
                         f"{', '.join(FALLBACK_DIRS)}); install the CUDA toolkit's compute-sanitizer or put its "
                         "bin folder on PATH")
    return found


# ------------------------------------------------------------------------------------------ the log


@dataclass
class SanitizerLog:
    """What one compute-sanitizer log says: findings in the variant's kernels (`ours`: errors, `ours_warnings`)
    and elsewhere (`others`), each deduplicated with a count; `summary`: the errors the tool counted (its
    ERROR SUMMARY, or RACECHECK SUMMARY's errors), None when it printed no summary (it did not finish)."""

    ours: list[str] = field(default_factory=list)
    ours_warnings: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    summary: int | None = None


_ERROR_SUMMARY = re.compile(r"^ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"^RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, \d+ warnings?\)")


def _records(text: str) -> list[list[str]]:
    """The log's messages: a line right after the `=========` prefix starts one, indented lines continue it,
    a bare prefix ends it. Lines without the prefix (the program's own output) are not the tool's."""
    out: list[list[str]] = []
    cur: list[str] | None = None
    for raw in text.splitlines():
        if not raw.startswith(PREFIX):
            continue
        body = raw[len(PREFIX):]
        if not body.strip():
            cur = None
        elif body.startswith("  "):
            if cur is not None:
                cur.append(body.strip())
        else:
            cur = [body.strip()]
            out.append(cur)
    return out


def _names(record: list[str], kernel: str) -> bool:
    """Whether a message places itself in `kernel` (`at k+0x90`, `at 0x90 in k`, a device frame, a race
    between two accesses `at k+0x…`); host frames do not count (a host function may share a name)."""
    pat = re.compile(rf"(?<![\w$]){re.escape(kernel)}(?=\+0x|\(|\s|$)")
    device = [ln for ln in record if not ln.startswith(("Host Frame", "in ", "Saved host backtrace"))]
    return any(pat.search(ln) for ln in device)


def _describe(record: list[str]) -> str:
    """A message in one line: its first line and where it happened (`at …`)."""
    where = next((ln for ln in record[1:] if ln.startswith("at ")), None)
    first = record[0].removeprefix("Error: ")
    return f"{first} {where}" if where else first


def _counted(items: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for it in items:
        counts[it] = counts.get(it, 0) + 1
    return [f"{k} ({n} times)" if n > 1 else k for k, n in counts.items()]


def parse_log(text: str, kernels: Sequence[str]) -> SanitizerLog:
    """Sort a compute-sanitizer log's findings into the variant's kernels' and everyone else's."""
    log = SanitizerLog()
    ours, ours_warn, others = [], [], []
    for rec in _records(text):
        head = rec[0]
        if head == "COMPUTE-SANITIZER" or head.startswith("LEAK SUMMARY"):
            continue
        m = _ERROR_SUMMARY.match(head) or _RACE_SUMMARY.match(head)
        if m:
            log.summary = int(m.group(1)) + (log.summary or 0)
            continue
        text_ = _describe(rec)
        if any(_names(rec, k) for k in kernels):
            (ours_warn if head.lower().startswith("warning") else ours).append(text_)
        else:
            others.append(text_)
    log.ours, log.ours_warnings, log.others = _counted(ours), _counted(ours_warn), _counted(others)
    return log


def _first(items: list[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; and {len(items) - n} more" if len(items) > n else "")


@dataclass(frozen=True)
class ToolRun:
    """One compute-sanitizer run of a variant: the child's exit status (None: killed at the timeout), the
    tail of its output, the log's text and the child's own JSON result (None when it wrote none)."""

    returncode: int | None
    output: str
    log: str
    result: dict[str, Any] | None


def judge(tool: str, run: ToolRun, kernels: Sequence[str], timeout_s: float) -> tuple[bool, str | None, list[str]]:
    """(kept, why not, warnings) for one variant and tool."""
    log = parse_log(run.log, kernels)
    warnings = []
    if log.ours_warnings:
        warnings.append(f"compute-sanitizer {tool} warns in its kernels: {_first(log.ours_warnings)}")
    if log.others:
        warnings.append(f"compute-sanitizer {tool} reported {len(log.others)} finding(s) outside its kernels "
                        f"(PyTorch's own or CUDA API calls), not held against it: {_first(log.others, 2)}")
    if log.ours:
        return False, f"compute-sanitizer {tool}: {_first(log.ours)}", warnings
    if run.returncode is None:
        return False, f"compute-sanitizer {tool} did not finish in {timeout_s:g} s", warnings
    tail = (run.output.strip().splitlines() or ["no output"])[-1]
    if run.result is None:
        return False, f"compute-sanitizer {tool}: the run ended without a result (exit {run.returncode}): {tail}", \
            warnings
    if "error" in run.result:
        return False, f"compute-sanitizer {tool}: the op failed under the sanitizer: {run.result['error']}", warnings
    if not run.result.get("ok"):
        return False, f"compute-sanitizer {tool}: {run.result.get('reason', 'no result')}", warnings
    if log.summary is None:
        return False, (f"compute-sanitizer {tool} printed no summary (exit {run.returncode}), so its run "
                       f"cannot vouch for the kernel: {tail}"), warnings
    return True, None, warnings


# ------------------------------------------------------------------------------------------ the parent


PADDING_BYTES = 64 * 1024  # memcheck's padding after every allocation (the lane's guard band is as wide)


def argv_for(sanitizer: str, tool: str, log: Path, cast_path: Path, vid: str, samples: Sequence[str],
             out: Path) -> list[str]:
    """The command line of one run: the sanitizer around this package's child entry point."""
    # memcheck sees an access only where it falls outside every allocation: a write just past an output
    # that lands in the next cudaMalloc'd buffer is invisible without padding after each allocation.
    padding = ["--padding", str(PADDING_BYTES)] if tool == "memcheck" else []
    return [sanitizer, "--tool", tool, *padding, "--error-exitcode", str(ERROR_EXITCODE), "--print-limit", "1000",
            "--target-processes", "application-only", "--log-file", str(log),
            sys.executable, "-m", "engine.export.sanitize", "--cast", str(cast_path), "--variant", vid,
            "--out", str(out), *(["--samples", *samples] if samples else [])]


def run_sanitizer(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """Run one command in its own process group; (exit status or None when killed at the timeout, output).
    The whole group goes at the timeout: the sanitizer and the Python process it runs."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out or ""


def check_variant(sanitizer: str, cast_path: Path, vid: str, kernels: Sequence[str], samples: Sequence[str],
                  tmp: Path, env: dict[str, str], timeout_s: float = TIMEOUT_S, tools: Sequence[str] = TOOLS,
                  progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Every tool on one variant, stopping at the first that fails it: {"ok", "reason", "tools", "warnings"}."""
    env = {**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    clean: list[str] = []
    warnings: list[str] = []
    for tool in tools:
        log, out = tmp / f"{vid}.{tool}.log", tmp / f"{vid}.{tool}.json"
        for p in (log, out):
            p.unlink(missing_ok=True)
        progress(f"{vid}: compute-sanitizer {tool}")
        code, output = run_sanitizer(argv_for(sanitizer, tool, log, cast_path, vid, samples, out), env, timeout_s)
        result = None
        if out.exists():
            try:
                result = json.loads(out.read_text())
            except ValueError:
                result = None
        run = ToolRun(code, output, log.read_text(errors="replace") if log.exists() else "", result)
        ok, why, warn = judge(tool, run, kernels, timeout_s)
        warnings += warn
        if not ok:
            return {"ok": False, "reason": why, "tools": clean, "warnings": warnings}
        clean.append(tool)
    return {"ok": True, "reason": None, "tools": clean, "warnings": warnings}


# ------------------------------------------------------------------------------------------ the child


def exercise(cast_path: str, vid: str, samples: Sequence[str], calls: int = 2) -> dict[str, Any]:
    """Install only `vid`, call its public op `calls` times on each of its samples, synchronise; how many
    calls reached its kernels (0: the sanitizer checked PyTorch's kernel, not ours)."""
    import torch

    from engine.capture.samples import load_sample
    from engine.cast.loader import load
    from engine.export.confirm import synth_inputs
    from engine.ops import call_op, resolve_op
    from engine.verify.inputs import clone_bound

    device = torch.device("cuda", torch.cuda.current_device())
    cast = load(cast_path, only={vid}, any_target=True)  # the variant's own calls, in eager
    state = next((s for s in cast.variants if s.id == vid), None)
    if state is None:
        return {"ok": False, "reason": f"no variant {vid!r} in the cast"}
    v = next(x for x in (cast.manifest or {}).get("variants", []) if x["id"] == vid)
    op = resolve_op(v["op"])
    bound_sets = [load_sample(p, device, v["signature"]).args for p in samples] or [synth_inputs(v["signature"], device)]
    cast.install()
    try:
        if state.problem is not None or state.plan is None:
            return {"ok": False, "reason": f"not installed: {state.problem or 'no launch plan'}"}
        before = state.hits
        for bound in bound_sets:
            for _ in range(calls):
                call_op(op, clone_bound(bound))
        torch.cuda.synchronize()
        hits = state.hits - before
    finally:
        cast.remove()
    inputs = "captured samples" if samples else "synthesised from the signature"
    if hits == 0:
        return {"ok": False, "reason": "the guard never matched the variant's own inputs: its kernels did not run",
                "inputs": inputs}
    return {"ok": True, "hits": hits, "calls": calls * len(bound_sets), "inputs": inputs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one variant of a cast on its samples (under compute-sanitizer)")
    ap.add_argument("--cast", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--samples", nargs="*", default=[])
    ap.add_argument("--calls", type=int, default=2, help="calls per sample (default 2)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from engine.export.confirm import run_job

    return run_job(lambda: exercise(args.cast, args.variant, args.samples, args.calls), args.out)


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
