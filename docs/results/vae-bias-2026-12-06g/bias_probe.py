"""The SD3.5 VAE decode under torch.compile with its cast: do the convolutions before the cast's GroupNorms keep
their bias (`compose._keeping_biases`, 4ed2ed7: cuDNN's convolution, then ATen's broadcast `add_` of the bias,
14 calls, 2.25 ms of the 28.0 ms of kernels on the H100, 2026-12-06g, docs/results/next-2026-12-07/) or let
Inductor split it off (its own pointwise add, computed straight into the channels-last layout the cast's twins
take, b1229e1)? Three arms compiled in one process with Inductor's caches off (a graph compiled one way must not
be served for the other): torch.compile alone, compile + cast keeping biases, compile + cast splitting them.
Alternating whole decodes (bench_compose's turns), medians with paired 95 % CIs; each arm's kernels by kind
under the profiler; output agreement with torch.compile alone.

    [PROBE_TIME_S=40] python docs/results/vae-bias-2026-12-06g/bias_probe.py CAST OUT_DIR
"""
import collections
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import bench_compose as bc  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from engine.cast import compose  # noqa: E402
from engine.cast.format import read_cast  # noqa: E402
from engine.cast.loader import load  # noqa: E402
from engine.config import build_target, load_config  # noqa: E402

cast_path, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
torch._inductor.config.force_disable_caches = True
target = build_target(load_config("configs/examples/sd35_vae.toml"), torch.device("cuda"))
model, forward = target.module, target.forward
mine = {k for v in read_cast(cast_path).variants for k in v.get("kernels", []) if isinstance(k, str)}
KINDS = (("convolution", re.compile(r"fprop|convolve|implicit_gemm|conv2d|nchwToNhwc|nhwcToNchw", re.I)),
         ("attention", re.compile(r"fmha|flash|sdpa|attention", re.I)),
         ("gemm", re.compile(r"gemm|nvjet|cublas|cutlass", re.I)),
         ("aten add", re.compile(r"CUDAFunctor_add")),
         ("triton (Inductor)", re.compile(r"^triton_")))


def kind(name):
    if name in mine or name.split("(")[0] in mine:
        return "cast"
    return next((k for k, rx in KINDS if rx.search(name)), "other")


def kernels(name, run, around):
    with around():
        for _ in range(2):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            run()
            torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0.0, 0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time_total
            per[e.name][1] += 1
    by = collections.defaultdict(float)
    for n, (us, _) in per.items():
        by[kind(n)] += us
    top = sorted(per.items(), key=lambda kv: -kv[1][0])
    (out / f"{name}_kernels.txt").write_text("\n".join(f"{v[0]:10.1f} us {v[1]:5d}x  [{kind(k)}] {k[:160]}"
                                                       for k, v in top))
    return {"kernel_us": round(sum(v[0] for v in per.values()), 1), "by_kind_us": {k: round(v, 1) for k, v in by.items()}}


@contextlib.contextmanager
def splitting():
    saved = compose._keeping_biases
    compose._keeping_biases = lambda *a, **k: contextlib.nullcontext()
    try:
        yield
    finally:
        compose._keeping_biases = saved


def first_call(fn):
    t = time.perf_counter()
    y = fn()
    torch.cuda.synchronize()
    return (y[0] if isinstance(y, (tuple, list)) else y), time.perf_counter() - t


res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "started": time.strftime("%F %T")}
cast = load(cast_path)
with torch.no_grad():
    alone = torch.compile(forward)
    ref, res["compile_s_alone"] = first_call(alone)
    arms = {}
    for name, ctx in (("split", splitting), ("keep", contextlib.nullcontext)):
        with cast.enabled(model), ctx():
            fn = cast.compile(forward)
            y, res[f"compile_s_{name}"] = first_call(fn)
            res[f"layout_copies_{name}"] = cast.stats().get("layout_copies")
            res[f"rel_l2_{name}_vs_alone"] = float((y.float() - ref.float()).norm() / ref.float().norm())
        arms[name] = fn
    enabled = lambda: cast.enabled(model)  # noqa: E731
    res["kernels"] = {"alone": kernels("alone", alone, contextlib.nullcontext),
                      "keep": kernels("keep", arms["keep"], enabled),
                      "split": kernels("split", arms["split"], enabled)}
    print(json.dumps(res["kernels"], indent=1), flush=True)
    h0 = bc.hits(cast)
    res["timing"] = bc.rotate([("alone", alone, None), ("keep", arms["keep"], enabled),
                               ("split", arms["split"], enabled)], 8, precision=0.01,
                              max_s=float(os.environ.get("PROBE_TIME_S", 40)))
    res["hits_while_timed"] = bc.hits(cast) - h0
(out / "bias_probe.json").write_text(json.dumps(res, indent=1, default=str))
print(json.dumps({k: v for k, v in res.items() if k not in ("kernels",) and not k.startswith("layout")}, indent=1,
                 default=str), flush=True)
