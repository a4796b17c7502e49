"""Where the SD3.5 VAE decode spends its GPU time under torch.compile, alone and with a cast (issue 20 asks the
cast to make it >= 1.6x faster than torch.compile alone; the H100 measured 1.309x). One decode of each compiled
arm under the profiler, its kernels summed by kind: convolutions (cuDNN/CUTLASS fprop), attention, GEMMs, the
cast's own kernels (their names from the cast's manifest), Inductor's Triton kernels, and the rest. What the cast
does not replace (convolutions, attention, GEMMs) bounds what any cast of the other ops can reach: the decode
cannot be faster than that time, and the report says the best speedup over torch.compile alone it leaves.
Default mode (the mode the export kept the cast for). A CPU run is a smoke test at --small: no measurement.

    python docs/results/vae-compose-h200-2026-12-06e/where_compiled.py CAST OUT_DIR
"""
import collections
import json
import re
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine.cast.format import read_cast
from engine.cast.loader import load
from engine.config import build_target, load_config

cast_path, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
target = build_target(load_config("configs/examples/sd35_vae.toml", small=DEV == "cpu"), torch.device(DEV))
model, forward = target.module, target.forward
mine = {k for v in read_cast(cast_path).variants for k in v.get("kernels", []) if isinstance(k, str)}
KINDS = (("convolution", re.compile(r"fprop|convolve|implicit_gemm|conv2d|nchwToNhwc|nhwcToNchw", re.I)),
         ("attention", re.compile(r"fmha|flash|sdpa|attention", re.I)),
         ("gemm", re.compile(r"gemm|nvjet|cublas|cutlass", re.I)),
         ("triton (Inductor)", re.compile(r"^triton_")))


def kind(name: str) -> str:
    if name in mine or name.split("(")[0] in mine:
        return "cast"
    return next((k for k, rx in KINDS if rx.search(name)), "other")


def profiled(name: str, run) -> dict:
    for _ in range(3):
        run()
    if DEV == "cuda":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=acts) as p:
        run()
        if DEV == "cuda":
            torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0.0, 0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time_total
            per[e.name][1] += 1
    by_kind = collections.defaultdict(float)
    for n, (us, _) in per.items():
        by_kind[kind(n)] += us
    top = sorted(per.items(), key=lambda kv: -kv[1][0])
    (out / f"{name}_kernels.txt").write_text("\n".join(f"{v[0]:10.1f} us {v[1]:5d}x  [{kind(k)}] {k[:160]}"
                                                       for k, v in top))
    r = {"kernel_us": sum(v[0] for v in per.values()), "by_kind_us": dict(by_kind)}
    print(name, json.dumps(r), flush=True)
    return r


res = {}
with torch.no_grad():
    alone = torch.compile(forward)
    res["compile"] = profiled("compile", alone)
    if DEV == "cuda":
        cast = load(cast_path)
        with cast.enabled(model):
            fast = cast.compile(forward)
            res["compile_cast"] = profiled("compile_cast", fast)
            res["compile_cast"]["hits"] = sum(v["hits"] for v in cast.stats()["variants"])
kept = ("convolution", "attention", "gemm")
for arm in res.values():
    floor = sum(arm["by_kind_us"].get(k, 0.0) for k in kept)
    arm["not_replaced_us"] = floor
if "compile_cast" in res and res["compile_cast"]["not_replaced_us"]:
    res["best_over_compile_if_the_rest_took_no_time"] = res["compile"]["kernel_us"] / res["compile_cast"]["not_replaced_us"]
(out / "where_compiled.json").write_text(json.dumps(res, indent=1))
print(json.dumps({k: v for k, v in res.items() if not isinstance(v, dict)}), flush=True)
