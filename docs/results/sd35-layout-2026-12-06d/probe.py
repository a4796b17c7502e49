"""Where sd35_medium's Decoder, routed channels-last with GroupNorm kept channels-last (6a0e05f), spends its time
(H100, 2026-12-06d). The export's layout trial measured it at 0.999x. Arms: base (the cast's op variants, NCHW) and
cl (the Decoder routed channels-last, as the export's trial). Per arm: device ms (alternating, medians), the
cast's hits, the top GPU kernels, and the CPU-side aten ops by input shapes (record_shapes; an add_ inside
aten::convolution is its bias). Then eager's bias add alone on the Decoder's largest convolution shapes, NCHW and
channels-last, against a copy of the same bytes.  python probe.py CAST OUT_DIR"""
import collections, json, statistics, sys
from pathlib import Path
import torch
from engine.config import build_target, load_config
from engine.cast.loader import load
from engine.cast.layouts import LayoutSet
from engine.bench.forward import time_steady

cast_path, out = sys.argv[1], Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test at --small, no measurement
target = build_target(load_config("configs/models/sd35_medium.toml", small=DEV == "cpu"), torch.device(DEV))
model, forward = target.module, target.forward
cast = load(cast_path)
sync = (lambda: torch.cuda.synchronize()) if DEV == "cuda" else (lambda: None)
res = {}
with torch.no_grad(), cast.enabled():
    ls = LayoutSet(model, lambda p, m: type(m).__name__ == "Decoder", learn=True)
    arms = {"base": forward}
    def cl():
        with ls:
            return forward()
    arms["cl"] = cl
    for n, f in arms.items():
        for _ in range(3): f()
        cast.reset_stats(); f(); sync()
        st = cast.stats()
        res[n] = {"misses": st["misses"], "near_miss_keys": st["near_miss_keys"],
                  "hits": {v["id"]: v["hits"] for v in st["variants"] if v["hits"]}}
    res["route"] = ls.summary()
    times = collections.defaultdict(list)
    for i in range(12 if DEV == "cuda" else 2):
        for n in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
            times[n].append(time_steady(arms[n], device=DEV))
    for n in arms:
        res[n]["ms"] = statistics.median(times[n]) / 1e3
        print(n, "%.2f ms" % res[n]["ms"], "hits", res[n]["hits"], "misses", res[n]["misses"], flush=True)
    from torch.profiler import profile, ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    for n, f in arms.items():
        f(); sync()
        with profile(activities=acts, record_shapes=True) as p:
            f(); sync()
        agg = collections.defaultdict(lambda: [0.0, 0])
        for e in p.events():
            if DEV == "cuda" and e.device_type == torch.autograd.DeviceType.CUDA:
                agg[e.name][0] += e.device_time_total; agg[e.name][1] += 1
        top = sorted(agg.items(), key=lambda kv: -kv[1][0])
        res[n]["kernel_us_total"] = sum(v[0] for v in agg.values())
        (out / f"{n}_kernels.txt").write_text("\n".join(f"{v[0]:10.1f} us {v[1]:5d}x  {k[:170]}" for k, v in top))
        ops = p.key_averages(group_by_input_shape=True)
        rows = sorted(ops, key=lambda e: -e.device_time_total)
        (out / f"{n}_ops.txt").write_text("\n".join(
            f"{e.device_time_total:10.1f} us {e.count:5d}x  {e.key[:60]:60s} {str(e.input_shapes)[:200]}" for e in rows[:150]))
    # eager's bias add on the Decoder's largest convolution outputs, against a copy of the same bytes
    bias = {}
    for c, hw in ((128, 1024), (256, 1024), (256, 512), (512, 512), (512, 256)):
        if DEV != "cuda":
            break
        for fmt in ("nchw", "cl"):
            y = torch.randn(1, c, hw, hw, device=DEV, dtype=torch.bfloat16)
            if fmt == "cl":
                y = y.contiguous(memory_format=torch.channels_last)
            b = torch.randn(1, c, 1, 1, device=DEV, dtype=torch.bfloat16)
            z = torch.empty_like(y)
            ta = statistics.median(time_steady(lambda: y.add_(b), device=DEV) for _ in range(5))
            tc = statistics.median(time_steady(lambda: z.copy_(y), device=DEV) for _ in range(5))
            bias[f"{c}x{hw}x{hw} {fmt}"] = {"add_us": ta, "copy_us": tc}
            print("bias add", c, hw, fmt, "%.1f us, copy %.1f us" % (ta, tc), flush=True)
    res["bias_add"] = bias
(out / "probe.json").write_text(json.dumps(res, indent=1, default=str))
for n in arms:
    print(n, "%.2f ms, kernels %.0f us" % (res[n]["ms"], res[n].get("kernel_us_total", 0)))
    print("\n".join((out / f"{n}_kernels.txt").read_text().splitlines()[:22]))
