#!/usr/bin/env python3
"""How much a convolutional model's eager forward would gain from running its convolutions channels-last, as
Inductor's layout optimization runs them under torch.compile: the model as built, then with its 4-D
parameters converted to channels-last (`model.to(memory_format=torch.channels_last)`; a convolution with a
channels-last weight runs channels-last in PyTorch, and its output stays so until an op makes it contiguous).
A probe for a layout route (not built): whole-forward times (steady state, medians), GPU kernel time by kernel
(torch.profiler) and how far the outputs move.

    python scripts/probe_conv_layout.py --config configs/examples/sd35_vae.toml --out DIR [--cast vae.cast] [--iters 10]

A config written CONFIG@key=value is built with those [params] overridden (as bench_e2e does). With --cast the
cast is installed for both arms. Writes DIR/probe_conv_layout_<config>.json and .md. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((t for t in map(_first_tensor, out) if t is not None), None)
    if isinstance(out, dict):
        return next((t for t in map(_first_tensor, out.values()) if t is not None), None)
    return getattr(out, "sample", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/examples/sd35_vae.toml")
    ap.add_argument("--cast")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from engine.bench.forward import kernel_times, time_steady
    from engine.config import build_target, load_model_spec
    from engine.errors import UsageError

    try:
        spec, config = load_model_spec(args.config)
    except UsageError as e:
        print(f"error: --config: {e}", file=sys.stderr)
        return 2
    if args.iters < 3:
        print("error: --iters: at least 3 timed forwards per arm", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: probe_conv_layout needs a CUDA GPU", file=sys.stderr)
        return 2
    target = build_target(config, torch.device("cuda"))
    forward, model = target.forward, target.module
    cast = None
    if args.cast:
        import engine.cast

        cast = engine.cast.load(args.cast)
        cast.install(model)
    doc: dict = {"config": args.config, "cast": args.cast, "gpu": torch.cuda.get_device_name(), "arms": {}}
    outs = {}
    with torch.no_grad():
        for arm in ("as built", "channels-last weights"):
            if arm != "as built":
                model.to(memory_format=torch.channels_last)
            for _ in range(2):
                forward()
            times = [time_steady(forward) for _ in range(args.iters)]
            out = _first_tensor(forward())
            outs[arm] = out.float().clone() if out is not None else None
            doc["arms"][arm] = {"median_us": statistics.median(times), "min_us": min(times),
                                **kernel_times(forward, top=20)}
    a, b = outs["as built"], outs["channels-last weights"]
    if a is not None and b is not None and a.shape == b.shape:
        doc["rel_l2"] = float((a - b).norm() / a.norm().clamp_min(1e-30))
    base, cl = (doc["arms"][k]["median_us"] for k in ("as built", "channels-last weights"))
    doc["speedup"] = base / cl
    if cast is not None:
        doc["stats_hits"] = {v["id"]: v["hits"] for v in cast.stats().get("variants", [])}
        cast.remove()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = Path(spec.name).stem
    (out_dir / f"probe_conv_layout_{name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Convolutions channels-last in eager: {args.config} ({doc['gpu']})", "",
             f"as built {base / 1e3:.2f} ms, channels-last weights {cl / 1e3:.2f} ms: {doc['speedup']:.3f}x; "
             f"outputs rel. L2 {doc.get('rel_l2', float('nan')):.2e}", ""]
    for arm, d in doc["arms"].items():
        lines += [f"## {arm}: {d['median_us'] / 1e3:.2f} ms (GPU kernels {d['gpu_kernel_us_per_forward'] / 1e3:.2f} ms)",
                  "", "| kernel | µs/forward | calls |", "|---|---:|---:|"]
        lines += [f"| {r['name']} | {r['us_per_forward']:.1f} | {r['count_per_forward']:.0f} |" for r in d["top"]]
        lines.append("")
    (out_dir / f"probe_conv_layout_{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
