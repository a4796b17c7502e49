"""H200: attention routes (engine/cast/attention.py) on CUDA.

1. One head of d = 512 over 4,096 tokens in bf16 (the SD3.5 VAE decoder's mid-block attention at 512²): compiled
   through a cast whose manifest proves the signature, the SDPA call becomes two GEMMs (one with float32 output)
   and a softmax, no memory-efficient attention kernel runs (the profile's kernel names), and the output is as
   close to float64 as SDPA's. Both times are printed (`attention-route` lines), not asserted.
2. The export's check in its fresh process (`python -m engine.export.attention_check`) on the SD3.5 VAE's
   small build (its mid-block attention at a 2 x 2 latent: 4 tokens of d = 512) with a cast of no variant: it
   finds the signature, compiles the model with and without the route, judges the output; whether the route
   is kept is the measurement's to say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

ENV_KEYS = ("torch", "torch_minor", "cuda", "gpu", "arch", "compute_capability", "driver", "nvrtc")


def _cast(tmp_path, sig):
    from engine.cast import format as cast_format
    from engine.cast.compat import current_env
    from engine.cast.format import write_cast

    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": current_env(),
                "variants": [], "source": {"attention_routes": {"signatures": [sig], "targets": ["compile"]}}}
    write_cast(tmp_path / "a.cast", manifest, {}, "# test\n")
    return tmp_path / "a.cast"


def _kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _ms(fn, reps=20):
    from engine.bench.forward import time_forward

    return sorted(time_forward(fn) for _ in range(reps))[reps // 2] / 1e3


def test_a_proven_signature_compiles_to_gemms_and_a_softmax(tmp_path):
    import engine.cast

    shape = (1, 1, 4096, 512)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    sig = {"q": list(shape), "k": list(shape), "v": list(shape), "dtype": "bfloat16", "scale": None}
    cast = engine.cast.load(_cast(tmp_path, sig))

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v) + 1

    torch._dynamo.reset()
    try:
        with cast.enabled(), torch.no_grad():
            routed = cast.compile(f)
            out = routed(q, k, v)
            names = _kernels(lambda: routed(q, k, v))
            assert cast.stats()["attention_rewrites"] == 1
            t_routed = _ms(lambda: routed(q, k, v))
        with torch.no_grad():
            alone = torch.compile(f)
            want = alone(q, k, v)
            t_alone = _ms(lambda: alone(q, k, v))
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double()) + 1
    finally:
        cast.remove()
        torch._dynamo.reset()
    assert not any("fmha" in n or "attention" in n.lower() for n in names), names
    err = lambda x: ((x.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert err(out) <= 1.5 * err(want) + 1e-4
    print(f"attention-route: SDPA compiled {t_alone:.3f} ms, math form compiled {t_routed:.3f} ms "
          f"(rel L2 from float64 {err(want):.2e} / {err(out):.2e})")


def test_the_export_check_on_the_vae_small_build(tmp_path):
    from engine.cast import format as cast_format
    from engine.cast.compat import current_env
    from engine.cast.format import write_cast

    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": current_env(),
                "variants": []}
    write_cast(tmp_path / "empty.cast", manifest, {}, "# test\n")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "engine.export.attention_check", "--config",
                           "configs/examples/sd35_vae.toml", "--small", "--cast", str(tmp_path / "empty.cast"),
                           "--out", str(out), "--modes", "default", "--max-s", "5"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    res = res.get("result", res)
    (sig,) = res["signatures"]
    assert sig["q"][-1] == 512 and sig["dtype"] == "bfloat16"
    (t,) = res["tried"]
    assert t["rewritten"] == 1 and "rel_l2_err" in t
    print(f"attention-route: VAE small build {json.dumps(t)}")
