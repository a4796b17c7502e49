"""The chains of memory-bound ops of one forward of a model config (see engine/capture/chains.py).

    python scripts/find_chains.py configs/models/gemma4_e2b.toml --small [--device cpu] [--top 15] [--json OUT]

Prints one row per chain structure: instances, module card or pattern, traced time share, the ops.
Times are the traced wall clock of each call (on the CPU, where a small capture runs); on a GPU the
capture's CUDA events are the measure, so read the shares here as a guide to the structure only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.capture.chains import container_paths, find_chains, patterns, trace_forward  # noqa: E402
from engine.capture.run import resolve_device  # noqa: E402
from engine.config import build_target, load_config  # noqa: E402
from engine.errors import UsageError  # noqa: E402


def short(op: str) -> str:
    return op.split("::", 1)[-1].split(".")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        config = load_config(args.config, small=args.small)
        device = resolve_device(args.device)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    target = build_target(config, device)
    target.module.eval()
    with torch.no_grad():
        target.forward()  # warm-up: lazy initialisation is not part of the forward
    trace = trace_forward(target.module, target.forward, time_calls=device.type == "cpu")
    chains = find_chains(trace.calls, container_paths(target.module), unknown=trace.unknown)
    pats = patterns(chains)
    total = sum(c.us for c in trace.calls) or 1.0
    held = {c.index: c for ch in chains for c in ch.calls}  # each call once: module chains lie inside patterns
    in_chains = sum(c.us for c in held.values())
    heavy = sum(not c.view for c in trace.calls)
    print(f"{config.name}: {len(trace.calls)} ATen calls ({heavy} not views), {len(chains)} chains of "
          f"{len(pats)} structures, holding {sum(not c.view for c in held.values())} calls and "
          f"{100 * in_chains / total:.0f} % of the traced time (a module chain inside a pattern counts once)")
    print(f"{'n':>4} {'kind':7} {'share':>6}  {'scope (first instance)':40} ops")
    for p in pats[:args.top]:
        ch = p.instances[0]
        ops = " ".join(short(c.op) for c in ch.calls if not c.view)
        print(f"{p.calls:>4} {p.kind:7} {100 * p.us / total:5.1f}%  {ch.scope[:40]:40} {ops}")
    if args.json:
        doc = {"model": config.name, "calls": len(trace.calls), "patterns": [
            {"id": p.id, "kind": p.kind, "instances": p.calls, "share": p.us / total,
             "ops": [c.op for c in p.instances[0].calls], "scope": p.instances[0].scope,
             "module": p.instances[0].module, "inputs": len(p.instances[0].inputs),
             "outputs": len(p.instances[0].outputs)} for p in pats]}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
