"""Why sd35_medium's Decoder ran 0.64x slower channels-last (export's layout check, 2026-12-06c, H100).

Profiles the model's eager forward with the cast's op variants (no module cards, no graph routes) in three arms:
  base   - the cast as exported (NCHW everywhere)
  cl     - the same with the Decoder routed channels-last (engine.cast.layouts, as the export's trial)
  cl_fix - cl, with GroupNorm calls on channels-last tensors the cast does not cover sent through a contiguous copy
           (its contiguous variant) and back: a bound on what a verified channels-last twin would give
Writes per arm: device ms (alternating, medians), the cast's misses / near-miss keys, the top kernels by time.
python probe.py CAST OUT_DIR"""
import json, sys, statistics, collections
from pathlib import Path
import torch
from engine.config import build_target, load_config
from engine.cast.loader import load
from engine.cast.layouts import LayoutSet
from engine.bench.forward import time_steady

cast_path, out = sys.argv[1], Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test of the script at --small, no measurement
target = build_target(load_config("configs/models/sd35_medium.toml", small=DEV == "cpu"), torch.device(DEV))
model, forward = target.module, target.forward
cast = load(cast_path)
res = {}
orig_gn = torch.nn.functional.group_norm
state = {"fix": False, "fixed": 0}
def gn(x, num_groups, weight=None, bias=None, eps=1e-5):
    if state["fix"] and x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        key = tuple(x.shape)
        if key == (1, 256, 1024, 1024):   # the one channels-last GroupNorm no variant covers (card 47d4c882)
            state["fixed"] += 1
            return orig_gn(x.contiguous(), num_groups, weight, bias, eps).contiguous(memory_format=torch.channels_last)
    return orig_gn(x, num_groups, weight, bias, eps)
torch.nn.functional.group_norm = gn
import torch.nn.modules.normalization as nm
nm.F.group_norm = gn
ls = None
def arm(name):
    def run():
        state["fix"] = name == "cl_fix"
        if name == "base":
            return forward()
        with ls:
            return forward()
    return run
with torch.no_grad(), cast.enabled():
    ls = LayoutSet(model, lambda p, m: type(m).__name__ == "Decoder", learn=True)
    print("routes", len(ls.routes), flush=True)
    arms = {n: arm(n) for n in ("base", "cl", "cl_fix")}
    for n, f in arms.items():
        for _ in range(3): f()
        cast.reset_stats(); f(); DEV == 'cuda' and torch.cuda.synchronize()
        st = cast.stats()
        res[n] = {"misses": st["misses"], "near_miss_keys": st["near_miss_keys"],
                  "hits": {v["id"]: v["hits"] for v in st["variants"] if v["hits"]}}
        print(n, "misses", st["misses"], flush=True)
    times = collections.defaultdict(list)
    for i in range(12 if DEV == 'cuda' else 2):
        for n in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
            times[n].append(time_steady(arms[n], device=DEV))
    for n in arms:
        res[n]["ms"] = statistics.median(times[n]) / 1e3
        res[n]["ms_all"] = [t / 1e3 for t in times[n]]
        print(n, "%.2f ms" % res[n]["ms"], flush=True)
    from torch.profiler import profile, ProfilerActivity
    for n, f in arms.items():
        f(); DEV == 'cuda' and torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU]) as p:
            f(); DEV == 'cuda' and torch.cuda.synchronize()
        agg = collections.defaultdict(lambda: [0.0, 0])
        for e in p.events():
            if DEV != "cuda" or e.device_type == torch.autograd.DeviceType.CUDA:
                agg[e.name][0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
                agg[e.name][1] += 1
        top = sorted(agg.items(), key=lambda kv: -kv[1][0])
        res[n]["kernel_us_total"] = sum(v[0] for v in agg.values())
        res[n]["top"] = [[k[:140], round(v[0], 1), v[1]] for k, v in top[:45]]
        (out / f"{n}_kernels.txt").write_text("\n".join(f"{v[0]:10.1f} us {v[1]:5d}x  {k[:160]}" for k, v in top))
    res["fixed_calls"] = state["fixed"]
(out / "probe.json").write_text(json.dumps(res, indent=1))
for n in ("base", "cl", "cl_fix"):
    print(n, "%.2f ms, kernels %.0f us" % (res[n]["ms"], res[n]["kernel_us_total"]))
    for k, us, c in res[n]["top"][:25]:
        print("   %9.1f %4d %s" % (us, c, k[:110]))
