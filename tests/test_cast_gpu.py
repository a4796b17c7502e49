"""H200: casts built from real models (capture, builtin kernels, lane verification, fresh-process
confirmation, packaging), installed back into the same models.

ResNet-50 (batch 32, fp16, channels_last) and the SD3.5-Medium VAE decoder's group_norm cards (1024x1024
decode, bf16). Each: outputs match eager, every variant is hit, no near misses, CUDA-graph capture and
replay agree with the cast's eager run, and remove() restores eager bit for bit. The casts are kept
under $KFORGE_CAST_DIR (when set) for scripts/bench_e2e.py --casts.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def _cast_dir(tmp_path_factory) -> Path:
    d = os.environ.get("KFORGE_CAST_DIR")
    path = Path(d) if d else tmp_path_factory.mktemp("casts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def resnet50():
    from engine.models.resnet50 import build

    t = build(device=torch.device("cuda"), dtype=torch.float16, batch=32, channels_last=True)
    return t.module, t.forward


def sd35_vae():
    from diffusers import AutoencoderKL

    from engine.models.sd35 import VAE_CONFIG

    torch.manual_seed(0)
    with torch.device("cuda"):
        vae = AutoencoderKL(**VAE_CONFIG)
    vae.encoder = None
    vae = vae.to(dtype=torch.bfloat16).eval()
    latent = torch.randn(1, 16, 128, 128, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    return vae, lambda: vae.decode(latent / 1.5305 + 0.0609, return_dict=False)[0]


MODELS = {"resnet50": (resnet50, lambda op: True), "sd35_vae": (sd35_vae, lambda op: "group_norm" in op)}


@pytest.fixture(scope="module", params=list(MODELS))
def built(request, tmp_path_factory):
    from engine.cast.direct import build_cast

    name = request.param
    make, keep = MODELS[name]
    module, forward = make()
    out = _cast_dir(tmp_path_factory) / f"{name}.cast"
    with torch.no_grad():
        summary = build_cast(forward, out, work=tmp_path_factory.mktemp(name), keep=keep, model=name)
    print(f"\n{name}: {summary['included']}\nleft out: {summary['excluded']}")
    return name, module, forward, out, summary


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def test_cast_matches_eager_hits_and_restores(built):
    import engine.cast

    name, module, forward, path, summary = built
    assert summary["included"], f"{name}: no variant survived confirmation: {summary['excluded']}"
    with torch.no_grad():
        eager = forward().clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cast = engine.cast.load(path)
        # A cast for this GPU and torch loads without a warning.
        assert not [w for w in caught if issubclass(w.category, engine.cast.CastWarning)]
        with cast.enabled():
            cast.reset_stats()
            mine = forward().clone()
            stats = cast.stats()
        assert not cast.installed
        after = forward().clone()
    err = _rel_err(mine, eager)
    print(f"{name}: relative L2 error vs eager {err:.2e}; hits {[(v['id'], v['hits']) for v in stats['variants']]}; "
          f"misses {stats['misses']}")
    assert err < 2e-2, f"{name}: output differs from eager by {err:.3e} (relative L2)"
    assert all(v["hits"] > 0 for v in stats["variants"]), stats["variants"]
    assert all(n == 0 for n in stats["near_misses"].values()), stats["near_miss_keys"]
    assert torch.equal(after, eager), "remove() did not restore eager exactly"


def test_cuda_graph_capture_and_replay(built):
    import engine.cast

    name, module, forward, path, _ = built
    cast = engine.cast.load(path)
    with torch.no_grad(), cast.enabled():
        ref = forward().clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            forward()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        cast.reset_stats()
        with torch.cuda.graph(g):
            static = forward()
        assert all(v["hits"] > 0 for v in cast.stats()["variants"])  # the kernels were captured
        g.replay()
        torch.cuda.synchronize()
        first = static.clone()
        g.replay()
        torch.cuda.synchronize()
    assert _rel_err(first, ref) < 1e-3, _rel_err(first, ref)
    assert _rel_err(static, first) < 1e-3


def test_host_cost_probe(tmp_path):
    from engine.cast.hostcost import measure

    r = measure(tmp_path)
    print(f"\nhost cost per call: {r}")
    assert r["hit_us"] > 0 and r["miss_us"] > 0
