"""Issue 20's VAE target (>= 1.6x over torch.compile): how much of the compiled decode would a faster mid-block
attention give? The decoder's one attention (1 head, 16,384 tokens, d = 512 at 1024^2) runs as a memory-efficient
SDPA kernel (flash takes d <= 256): 4.55 ms of 28.0 ms of kernels with the cast on an H100 (2026-12-06g). Here
F.scaled_dot_product_attention is replaced, while Dynamo traces, by its math form where flash cannot serve
(d > 256, 16-bit, no mask, no dropout, not causal): S = q k^T (float32 out, or bf16), softmax in float32, P v;
Inductor then compiles cuBLAS GEMMs and a fused softmax. Arms, compiled in one process (Inductor's caches off),
timed in rotation (bench_compose's turns): torch.compile alone; + cast (the committed rule: biases split off);
+ cast + math attention (float32 S; bf16 S); torch.compile + math attention. Each arm's kernels by kind under
the profiler, and its output's rel L2 from the model run in float32 (what the export's accuracy rule judges).

    [PROBE_TIME_S=40] python docs/results/vae-split-2026-12-06h/attn_vae_probe.py CAST OUT_DIR
"""
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import bench_compose as bc  # noqa: E402

from engine.bench.accuracy import wider_outputs  # noqa: E402
from engine.cast.loader import load  # noqa: E402
from engine.config import build_target, load_config  # noqa: E402
from engine.models.forwards import output_tensor, output_tensors  # noqa: E402

ORIG = F.scaled_dot_product_attention


def math_sdpa(f32: bool):
    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if (attn_mask is not None or dropout_p or is_causal or enable_gqa or query.dim() != 4
                or query.shape[-1] <= 256 or query.dtype not in (torch.bfloat16, torch.float16)
                or key.shape[:2] != query.shape[:2]):
            return ORIG(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
        s = scale if scale is not None else query.shape[-1] ** -0.5
        b, h, n, d = query.shape
        outs = []
        for i in range(b * h):   # the VAE: one
            qi, ki, vi = query.reshape(b * h, n, d)[i], key.reshape(b * h, -1, d)[i], \
                value.reshape(b * h, key.shape[-2], -1)[i]
            sc = torch.mm(qi, ki.t(), out_dtype=torch.float32) if f32 else torch.mm(qi, ki.t()).float()
            outs.append(torch.mm(torch.softmax(sc * s, dim=-1).to(query.dtype), vi))
        return torch.stack(outs).reshape(b, h, n, -1)
    return sdpa


# one function object per form: Dynamo guards on F.scaled_dot_product_attention's identity, so each arm's compiled
# graph is served only while its own form is in place (a new closure per call would recompile every call)
MATH = {True: math_sdpa(True), False: math_sdpa(False)}


@contextlib.contextmanager
def patched(f32: bool | None):
    if f32 is None:
        yield
        return
    F.scaled_dot_product_attention = MATH[f32]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = ORIG


def first_call(fn):
    t = time.perf_counter()
    y = fn()
    torch.cuda.synchronize()
    return output_tensor(y), time.perf_counter() - t


def kernels(run, around):
    """Kernel time of one call under the profiler, by kind."""
    from torch.profiler import ProfilerActivity, profile
    with around():
        for _ in range(2):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            run()
            torch.cuda.synchronize()
    by: dict[str, float] = {}
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n = e.name.lower()
            k = ("attention" if any(w in n for w in ("fmha", "flash", "attention")) else
                 "gemm" if any(w in n for w in ("gemm", "nvjet", "cublas", "cutlass")) and "fprop" not in n else
                 "convolution" if any(w in n for w in ("fprop", "conv", "nhwc")) else
                 "triton" if n.startswith("triton_") else "other")
            by[k] = by.get(k, 0.0) + e.device_time_total
    return {"kernel_us": round(sum(by.values()), 1), "by_kind_us": {k: round(v, 1) for k, v in by.items()}}


if __name__ == "__main__":
    cast_path, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch._inductor.config.force_disable_caches = True
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 1024
    target = build_target(load_config("configs/examples/sd35_vae.toml"), torch.device("cuda"))
    model, forward = target.module, target.forward
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "started": time.strftime("%F %T")}
    cast = load(cast_path)
    with torch.no_grad():
        eager = output_tensor(forward()).float()
        wide = wider_outputs(model, forward, output_tensors)
        ref = wide[0][0].float() if wide is not None and wide[0] else None
        rel = lambda y, r: float((y.float() - r).norm() / r.norm())  # noqa: E731
        if ref is not None:
            res["eager_rel_l2_vs_float32"] = rel(eager, ref)
        arms, around = {}, {}
        for name, with_cast, f32 in (("alone", False, None), ("cast", True, None), ("cast+math32", True, True),
                                     ("cast+math16", True, False), ("alone+math32", False, True)):
            def ctx(with_cast=with_cast, f32=f32):
                stack = contextlib.ExitStack()
                if with_cast:
                    stack.enter_context(cast.enabled(model))
                stack.enter_context(patched(f32))
                return stack
            try:
                with ctx():
                    fn = cast.compile(forward) if with_cast else torch.compile(forward)
                    y, res[f"compile_s_{name}"] = first_call(fn)
                    if ref is not None:
                        res[f"rel_l2_vs_float32_{name}"] = rel(y, ref)
                arms[name], around[name] = fn, ctx
            except Exception as e:  # an arm this torch cannot compile
                res[f"error_{name}"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(name, {k: v for k, v in res.items() if k.endswith(name)}, flush=True)
        res["kernels"] = {name: kernels(arms[name], around[name]) for name in arms}
        print(json.dumps(res["kernels"], indent=1), flush=True)
        order = ["alone"] + [n for n in arms if n != "alone"]
        res["timing"] = bc.rotate([(n, arms[n], around[n]) for n in order], 8, precision=0.01,
                                  max_s=float(os.environ.get("PROBE_TIME_S", 40)))
    (out / "attn_vae_probe.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({k: v for k, v in res.items() if k != "kernels"}, indent=1, default=str), flush=True)
