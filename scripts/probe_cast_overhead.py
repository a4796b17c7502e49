#!/usr/bin/env python3
"""Where a cast's time goes in a host-bound model: eager against the cast, against the cast's routes
installed but switched off (every call of a routed op goes through the router to PyTorch: the routing
cost alone), and against the cast without each routed op in turn.

    python scripts/probe_cast_overhead.py --config configs/models/qwen35_a3b.toml \
        --cast docs/results/reproduce-h200/qwen35_a3b/qwen35_a3b.cast --out OUT [--iters 40]

Each forward is timed twice: the host's time to issue it (the GPU idle before it; `perf_counter` from the
call to its return) and the device span (CUDA events around it, then a sync). All arms alternate forward
by forward, in a rotating order, so drift of the host or the GPU falls on every arm alike. Calls per routed
op per forward come from the router's counters (hits + misses) over one forward.
Writes OUT/cast_overhead.json and OUT/cast_overhead.md; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def log(msg: str) -> None:
    print(f"[probe_cast_overhead {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed_forward(forward) -> tuple[float, float]:
    """(host µs to issue one forward from an idle GPU, device µs of the forward)."""
    import torch

    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    s.record()
    forward()
    t1 = time.perf_counter()
    e.record()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6, s.elapsed_time(e) * 1e3


def arms_of(variants: list[dict]) -> list[tuple[str, set[str] | None, bool]]:
    """(name, variant ids to load or None for eager, routes active) for every arm of the probe."""
    ids = {v["id"] for v in variants}
    arms = [("eager", None, True), ("cast", ids, True), ("routes off", ids, False)]
    for op in sorted({v["op"] for v in variants}):
        rest = {v["id"] for v in variants if v["op"] != op}
        if rest:
            arms.append((f"cast without {op}", rest, True))
    return arms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--cast", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=40, help="forwards per arm")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: probe_cast_overhead: no CUDA GPU is visible", file=sys.stderr)
        return 2
    import engine.cast
    from engine.bench.stats import speedup_ci
    from engine.cast import cpp_router
    from engine.cast.format import read_cast
    from engine.config import build_target, load_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = read_cast(args.cast).variants
    target = build_target(load_config(args.config), torch.device("cuda", torch.cuda.current_device()))
    forward = target.forward
    arms = arms_of(variants)
    casts = {name: (engine.cast.load(args.cast, only=ids) if ids is not None else None, active)
             for name, ids, active in arms}
    samples = {name: {"host": [], "device": []} for name, _, _ in arms}
    calls: dict[str, dict[str, int]] = {}
    with torch.no_grad():
        for _ in range(3):
            forward()
        full = casts["cast"][0]
        with full.enabled():
            forward()
            full.reset_stats()
            forward()
            st = full.stats()
        hits_by_op: dict[str, int] = {}
        for v in st["variants"]:
            hits_by_op[v["op"]] = hits_by_op.get(v["op"], 0) + v["hits"]
        for op, m in st["misses"].items():
            calls[op] = {"hits": hits_by_op.get(op, 0), "misses": int(m)}
        log(f"calls per forward through the router: {calls}")
        names = [name for name, _, _ in arms]
        log(f"{len(names)} arms, {args.iters} forwards each, alternating")
        for i in range(args.iters + 1):  # the first round warms every arm up and is dropped
            k = i % len(names)
            for name in names[k:] + names[:k]:
                cast, active = casts[name]
                if cast is not None:
                    cast.install()
                    cpp_router.set_active(active)
                try:
                    host, dev = timed_forward(forward)
                finally:
                    if cast is not None:
                        cpp_router.set_active(True)
                        cast.remove()
                if i:
                    samples[name]["host"].append(host)
                    samples[name]["device"].append(dev)
    rows = []
    base = samples["eager"]
    for name in names:
        s = samples[name]
        dev = speedup_ci(base["device"], s["device"], paired=True)
        host = speedup_ci(base["host"], s["host"], paired=True)
        rows.append({"arm": name, "device_ms": statistics.median(s["device"]) / 1e3,
                     "host_ms": statistics.median(s["host"]) / 1e3,
                     "speedup": dev.speedup, "speedup_ci": [dev.low, dev.high],
                     "host_speedup": host.speedup, "host_speedup_ci": [host.low, host.high]})
        log(f"{name}: device {rows[-1]['device_ms']:.2f} ms ({dev.speedup:.3f}x, {dev.low:.3f}-{dev.high:.3f}), "
            f"host {rows[-1]['host_ms']:.2f} ms ({host.speedup:.3f}x)")
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "config": args.config,
           "cast": args.cast, "iters": args.iters, "router": cpp_router.mode(), "calls": calls, "arms": rows,
           "samples": samples}
    (out / "cast_overhead.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Cast overhead probe: {Path(args.config).stem}", "",
             f"{doc['gpu']}, torch {doc['torch']}; `{' '.join(['scripts/probe_cast_overhead.py'] + (argv or sys.argv[1:]))}`",
             "", f"{args.iters} forwards per arm, all arms alternated. Speedup = eager / arm (median), 95 % CI "
             "(paired bootstrap). Host = time to issue the forward from an idle GPU.", "",
             "| arm | forward ms | speedup (95% CI) | host issue ms | host speedup |", "|---|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['device_ms']:.2f} | {r['speedup']:.3f}× ({r['speedup_ci'][0]:.3f}–"
                     f"{r['speedup_ci'][1]:.3f}) | {r['host_ms']:.2f} | {r['host_speedup']:.3f}× |")
    lines += ["", "Calls per forward through the router (one forward of the whole cast):", "",
              "| op | hits | misses |", "|---|---:|---:|"]
    lines += [f"| `{op}` | {c['hits']} | {c['misses']} |" for op, c in sorted(calls.items())]
    (out / "cast_overhead.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {out / 'cast_overhead.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
