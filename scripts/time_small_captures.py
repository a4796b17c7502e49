"""Time each reference config's `--small` capture on the CPU, phase by phase.

Each config runs in its own child process, in a fresh temporary workspace, through the code path of
`kforge-tui capture CONFIG --small --device cpu` (`engine.capture.store.capture_and_store`). Prints a
table: wall seconds split into build / warm-up / captured forward / writing samples (queueing them during the
forward, and waiting for the background writer at its end) / chain samples (finding the chains, and one more
forward where the warm-up could not plan their samples), cards, sample bytes, and the load average before and
after each config (the machine may be shared). With `--command`, each config is then also captured as a user
types it (`kforge-tui capture CONFIG --small --device cpu`, in a fresh workspace): "command s" is that
process's whole wall time, interpreter start, imports, printing the cards and exit included.

    python scripts/time_small_captures.py [CONFIG ...] [--timeout S] [--markdown] [--command]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = sorted((ROOT / "configs" / "models").glob("*.toml"))
PHASES = ("build", "warm-up", "captured forward", "writing samples", "chain samples")


def capture_one(config_path: str) -> dict:
    """Capture one config `--small` on the CPU in a temp workspace; the numbers as a dict."""
    from engine.capture.store import capture_and_store
    from engine.config import load_config
    from engine.store.workspace import ensure_workspace

    config = load_config(config_path, small=True)
    messages = 0

    def progress(msg: str) -> None:
        nonlocal messages
        messages += 1
        print(f"  [{config.name}] {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="kforge-time-") as tmp:
        workspace = ensure_workspace(Path(tmp))
        t0 = time.perf_counter()
        result = capture_and_store(config, "cpu", workspace, samples=None, progress=progress)
        total = time.perf_counter() - t0
        sample_bytes = sum(f.stat().st_size for f in (workspace / result.sample_dir).iterdir())
    return {"model": config.name, "total_s": total, "phases": result.phases, "cards": len(result.cards),
            "sample_bytes": sample_bytes, "dtype": result.dtype, "progress_messages": messages,
            "chain_samples_note": result.notes.get("chain samples")}


def time_command(config_path: str, env: dict, timeout: float) -> str:
    """Wall seconds of `kforge-tui capture CONFIG --small --device cpu` in a fresh workspace, as a string."""
    with tempfile.TemporaryDirectory(prefix="kforge-time-cmd-") as tmp:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "kforge_tui.cli", "capture", config_path, "--small",
                                   "--device", "cpu", "--workspace", tmp], env=env, timeout=timeout,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"not done after {timeout:.0f} s"
        wall = time.perf_counter() - t0
    return f"{wall:.1f}" if proc.returncode == 0 else f"exit {proc.returncode}"


def _load() -> str:
    """The 1-minute load average (Linux), or '?'."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def _row(r: dict) -> list[str]:
    command = [r["command"]] if "command" in r else []
    if "error" in r:
        return [r["model"], r["error"]] + [""] * (len(PHASES) + 3) + [r["load"]] + command
    return ([r["model"], f"{r['total_s']:.1f}"] + [f"{r['phases'].get(p, 0.0):.1f}" for p in PHASES]
            + [str(r["cards"]), f"{r['sample_bytes'] / 1e6:.1f} MB", str(r["progress_messages"]), r["load"]]
            + command)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=[str(p) for p in REFERENCE])
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per config before giving up")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--command", action="store_true",
                    help="also time each config's whole `kforge-tui capture CONFIG --small` process")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child mode: capture one config, JSON on stdout
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(capture_one(args.one)))
        return 0

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows = []
    for cfg in args.configs:
        name = Path(cfg).stem
        load = _load()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", cfg], env=env, timeout=args.timeout,
                                  stdout=subprocess.PIPE, text=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
                {"model": name, "error": f"exit {proc.returncode}"}
        except subprocess.TimeoutExpired:
            r = {"model": name, "error": f"not done after {time.perf_counter() - t0:.0f} s"}
        r["load"] = f"{load} → {_load()}"
        if args.command:
            r["command"] = time_command(cfg, env, args.timeout)
            r["load"] += f" → {_load()}"
        rows.append(r)

    head = ["model", "wall s", *PHASES, "cards", "sample bytes", "progress msgs", "load avg"]
    head += ["command s"] if args.command else []
    table = [head] + [_row(r) for r in rows]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in table[1:]:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(row[i]) for row in table) for i in range(len(head))]
        for row in table:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    for r in rows:
        if r.get("chain_samples_note"):
            print(f"\n{r['model']}: chain samples {r['chain_samples_note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
