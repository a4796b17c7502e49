"""Where sd35_medium's forward spends its GPU time with the 2.59x cast (sd35_medium.cast here, H100 2026-12-06e),
against eager: the next things to take. Arms: eager, and the cast with its layout route (the Decoder channels-last)
but not its graph route (a replayed graph hides its kernels from the profiler, and the graph route changes host
time, not kernels). Per arm: the GPU kernels of one forward by total time, and the CPU-side aten ops by input
shapes. A CPU run (no GPU) is a smoke test at --small: it checks the script, measures nothing.

    python docs/results/sd35-bias-2026-12-06e/where.py CAST OUT_DIR   (not profile.py or kernels.py: those names hide
    modules diffusers imports, the standard library's profile and HF kernels)
"""
import collections
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine.cast.loader import load
from engine.config import build_target, load_config

cast_path, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
target = build_target(load_config("configs/models/sd35_medium.toml", small=DEV == "cpu"), torch.device(DEV))
model, forward = target.module, target.forward
cast = load(cast_path) if DEV == "cuda" else None
if cast is not None:
    cast.graph_route_classes = lambda: []   # kernels, not replays: the layout route and the op routes only
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
res = {}


def arm(name, run):
    for _ in range(3):
        run()
    sync()
    with profile(activities=acts, record_shapes=True) as p:
        run()
        sync()
    agg = collections.defaultdict(lambda: [0.0, 0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name][0] += e.device_time_total
            agg[e.name][1] += 1
    top = sorted(agg.items(), key=lambda kv: -kv[1][0])
    res[name] = {"kernel_us_total": sum(v[0] for v in agg.values()), "launches": sum(v[1] for v in agg.values())}
    (out / f"{name}_kernels.txt").write_text("\n".join(f"{v[0]:10.1f} us {v[1]:5d}x  {k[:170]}" for k, v in top))
    rows = sorted(p.key_averages(group_by_input_shape=True), key=lambda e: -e.device_time_total)
    (out / f"{name}_ops.txt").write_text("\n".join(
        f"{e.device_time_total:10.1f} us {e.count:5d}x  {e.key[:60]:60s} {str(e.input_shapes)[:200]}"
        for e in rows[:200]))
    print(name, f"kernels {res[name]['kernel_us_total']:.0f} us in {res[name]['launches']} launches", flush=True)
    print("\n".join((out / f"{name}_kernels.txt").read_text().splitlines()[:25]), flush=True)


with torch.no_grad():
    arm("eager", forward)
    if cast is not None:
        with cast.enabled(model):
            arm("cast", forward)
            st = cast.stats()
            res["cast"]["hits"] = {v["id"]: v["hits"] for v in st["variants"] if v["hits"]}
            res["cast"]["layout_routes"] = st["layout_routes_summary"]
(out / "where.json").write_text(json.dumps(res, indent=1, default=str))
