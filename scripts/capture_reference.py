#!/usr/bin/env python3
"""Capture the reference models and summarise them: cards, calls, wall time, top cards, op mix.

    python scripts/capture_reference.py --device cuda --out docs/results/capture-h200
    python scripts/capture_reference.py --device cpu --small --out /tmp/capture-cpu

Writes `<out>/<model>.json` (the `kforge-tui capture --json` document) and `<out>/summary.md`.
With `--compare DIR` (an earlier output), the summary lists ops seen in one capture and not the other.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

MODELS = ("resnet50", "sd35_medium", "gemma4_e2b", "qwen35_a3b")
ROOT = Path(__file__).resolve().parent.parent


def capture(model: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "kforge_tui", "capture", str(ROOT / "configs" / "models" / f"{model}.toml"),
           "--json", "--device", args.device, "--workspace", str(args.workspace), "--samples", str(args.samples)]
    if args.small:
        cmd.append("--small")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"{model}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return {"model": model, "error": proc.stderr.strip()[-2000:], "exit": proc.returncode}
    doc = json.loads(proc.stdout)
    doc["process_wall_s"] = wall
    return doc


def op_mix(doc: dict) -> dict[str, dict]:
    mix: dict[str, dict] = defaultdict(lambda: {"cards": 0, "calls": 0, "share": 0.0})
    for c in doc["cards"]:
        m = mix[c["op"]]
        m["cards"] += 1
        m["calls"] += c["calls"]
        m["share"] += c["share"]
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]["share"]))


def summary(docs: list[dict], args: argparse.Namespace, compare: dict[str, dict]) -> str:
    lines = [f"# Capture of the reference models ({args.device}{', --small' if args.small else ', full size'})",
             "", f"Command: `python scripts/capture_reference.py --device {args.device}"
             f"{' --small' if args.small else ''} --samples {args.samples}`", ""]
    lines += ["| model | dtype | cards | calls per forward | capture wall s | process wall s | sample MiB |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for d in docs:
        if "error" in d:
            lines.append(f"| {d['model']} | failed: {d['error'].splitlines()[-1][:120]} | | | | | |")
            continue
        mib = d.get("sample_bytes", 0) / 2**20
        lines.append(f"| {d['model']} | {d['dtype']} | {len(d['cards'])} | {d['total_calls']} | "
                     f"{d['wall_s']:.1f} | {d['process_wall_s']:.1f} | {mib:.0f} |")
    for d in docs:
        if "error" in d:
            continue
        lines += ["", f"## {d['model']}", ""]
        lines += [f"- {k}: {v}" for k, v in d.get("notes", {}).items()]
        lines += ["", "Top cards by share of captured op time:", "",
                  "| op | signature | calls | share | bytes |", "|---|---|---:|---:|---:|"]
        for c in d["cards"][:12]:
            sig = c["signature"] if len(c["signature"]) < 140 else c["signature"][:137] + "..."
            lines.append(f"| `{c['op']}` | `{sig}` | {c['calls']} | {100 * c['share']:.1f}% | {c['bytes']} |")
        lines += ["", "Op mix:", "", "| op | cards | calls | share |", "|---|---:|---:|---:|"]
        for op, m in op_mix(d).items():
            lines.append(f"| `{op}` | {m['cards']} | {m['calls']} | {100 * m['share']:.1f}% |")
        other = compare.get(d["model"])
        if other:
            mine, theirs = set(op_mix(d)), set(op_mix(other))
            lines += ["", f"Ops only in this capture: {', '.join(sorted(mine - theirs)) or 'none'}",
                      f"Ops only in the compared capture ({other['device']}): "
                      f"{', '.join(sorted(theirs - mine)) or 'none'}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--workspace", type=Path, default=Path("/tmp/kforge-capture-ws"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="an earlier output folder to diff op sets against")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    compare = {}
    if args.compare:
        for m in args.models:
            f = args.compare / f"{m}.json"
            if f.is_file():
                compare[m] = json.loads(f.read_text())
    docs = []
    for model in args.models:
        print(f"capturing {model} ...", file=sys.stderr, flush=True)
        doc = capture(model, args)
        if "error" not in doc:
            sample_dir = args.workspace / "samples" / doc["capture"]
            doc["sample_bytes"] = sum(p.stat().st_size for p in sample_dir.glob("*.safetensors"))
            print(f"  {len(doc['cards'])} cards, {doc['total_calls']} calls, {doc['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)
        (args.out / f"{model}.json").write_text(json.dumps(doc, indent=1))
        docs.append(doc)
    (args.out / "summary.md").write_text(summary(docs, args, compare))
    return 0 if all("error" not in d for d in docs) else 1


if __name__ == "__main__":
    sys.exit(main())
