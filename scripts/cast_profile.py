#!/usr/bin/env python3
"""Where a cast's end-to-end time goes: host time to issue one forward, and GPU kernel time by kernel,
with and without the cast (torch.profiler), on a model config.

    python scripts/cast_profile.py --config resnet50 --cast resnet50.cast --out DIR
    python scripts/cast_profile.py --config gemma4_e2b@full_depth=true --cast gemma4_e2b.cast --out DIR

A config written CONFIG@key=value[,key=value] is built with those [params] overridden (as bench_e2e does).
The cast is installed on the model, so its module cards run too. Writes DIR/cast_profile_<config>.json and
.md, with a cProfile of the host for both arms (where the host's time goes per forward). Needs the GPU the
cast is for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def _host_us(forward, n: int = 10) -> tuple[float, float]:
    """(host µs to issue one forward, wall µs per forward with the GPU finishing)."""
    torch.cuda.synchronize()
    issue = []
    t_all = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        forward()
        issue.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t_all) / n
    return sorted(issue)[n // 2] * 1e6, wall * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--cast", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import engine.cast
    from engine.bench.forward import kernel_times
    from engine.bench.host import python_profile
    from engine.config import build_target, load_model_spec
    from engine.errors import UsageError

    try:
        spec, config = load_model_spec(args.config)
    except UsageError as e:
        print(f"error: --config: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: cast_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    target = build_target(config, torch.device("cuda"))
    forward, model = target.forward, target.module
    cast = engine.cast.load(args.cast)
    doc: dict = {"config": args.config, "cast": args.cast, "variants": len(cast.usable())}
    with torch.no_grad():
        for _ in range(3):
            forward()
        with cast.enabled(model):
            for _ in range(3):
                forward()
        from engine.cast import runtime

        for arm in ("eager", "cast"):
            if arm == "cast":
                cast.install(model)
            issue, wall = _host_us(forward)
            doc[arm] = {"host_issue_us": issue, "wall_us": wall, **kernel_times(forward)}
            if arm == "eager":
                doc["cprofile_eager"] = python_profile(forward, calls=10, top=30)
            if arm == "cast":
                doc["stats"] = cast.stats()
                # The override's own tax: installed but suspended, every call passes to the original.
                with runtime.suspended():
                    issue_s, wall_s = _host_us(forward)
                doc["override_only"] = {"host_issue_us": issue_s, "wall_us": wall_s}

                doc["cprofile_cast"] = python_profile(forward, calls=10, top=30)
                cast.remove()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = Path(spec.name).stem + "".join(f"_{k}-{v}" for k, v in sorted(spec.params.items()))
    (out / f"cast_profile_{name}.json").write_text(json.dumps(doc, indent=1, default=str))
    lines = [f"# Cast profile: {name} ({doc['variants']} variants)", ""]
    for arm in ("eager", "cast"):
        d = doc[arm]
        lines += [f"## {arm}: host issues a forward in {d['host_issue_us']:.0f} µs; wall {d['wall_us']:.0f} µs; "
                  f"GPU kernels {d['gpu_kernel_us_per_forward']:.0f} µs per forward", "",
                  "| kernel | µs/forward | calls/forward |", "|---|---:|---:|"]
        lines += [f"| {r['name']} | {r['us_per_forward']:.1f} | {r['count_per_forward']:.0f} |" for r in d["top"]]
        lines.append("")
    o = doc["override_only"]
    lines += [f"## override installed but suspended (every call passes to the original): host issues a forward "
              f"in {o['host_issue_us']:.0f} µs; wall {o['wall_us']:.0f} µs", "", "## cProfile of 10 forwards "
              "without the cast (host)", "", "```", doc["cprofile_eager"], "```", "",
              "## cProfile of 10 forwards with the cast (host)", "", "```", doc["cprofile_cast"], "```"]
    (out / f"cast_profile_{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
