"""H200: casts installed back into the models they were made for.

ResNet-50 and the SD3.5-Medium VAE decode, built exactly as their configs build them. The cast is the one
a run exported (`$KFORGE_CAST_DIR/resnet50.cast`, `sd35_medium.cast`: run → export, the user's path) or,
without one, a cast built directly from the model (capture, builtin kernels, lane verification,
fresh-process confirmation). Each: outputs match eager, every variant the model should use is hit with
no near misses, CUDA-graph capture and replay agree with the cast's eager run, and remove() restores
eager bit for bit.
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
    from engine.config import config_model

    return config_model("resnet50")


def sd35_vae():
    from engine.config import sd35_vae as make

    return make()


# name -> (builder, ops a directly built cast keeps, cast file a run exported for it, ops that must all hit)
MODELS = {"resnet50": (resnet50, lambda op: True, "resnet50", lambda op: True),
          "sd35_vae": (sd35_vae, lambda op: "group_norm" in op, "sd35_medium", lambda op: "group_norm" in op)}


@pytest.fixture(scope="module", params=list(MODELS))
def built(request, tmp_path_factory):
    """The cast under test: $KFORGE_CAST_DIR/<config>.cast when a run exported one (run → export, the
    user's path), else one built directly from the model (capture, builtin kernels, lane, confirmation)."""
    from engine.export.direct import build_cast

    name = request.param
    make, keep, stem, must_hit = MODELS[name]
    module, forward = make()
    out = _cast_dir(tmp_path_factory) / f"{stem}.cast"
    if out.exists():
        print(f"\n{name}: using the exported cast {out}")
        return name, module, forward, out, must_hit
    with torch.no_grad():
        summary = build_cast(forward, out, work=tmp_path_factory.mktemp(name), keep=keep, model=name)
    print(f"\n{name}: {summary['included']}\nleft out: {summary['excluded']}")
    assert summary["included"], f"{name}: no variant survived confirmation: {summary['excluded']}"
    return name, module, forward, out, must_hit


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def test_cast_matches_eager_hits_and_restores(built):
    import engine.cast
    from engine.models.forwards import output_tensor

    name, module, forward, path, must_hit = built
    with torch.no_grad():
        eager = output_tensor(forward()).clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cast = engine.cast.load(path)
        # A cast for this GPU and torch loads without a warning.
        assert not [w for w in caught if issubclass(w.category, engine.cast.CastWarning)]
        with cast.enabled():
            cast.reset_stats()
            mine = output_tensor(forward()).clone()
            stats = cast.stats()
        assert not cast.installed
        after = output_tensor(forward()).clone()
    err = _rel_err(mine, eager)
    print(f"{name}: relative L2 error vs eager {err:.2e}; hits {[(v['id'], v['hits']) for v in stats['variants']]}; "
          f"misses {stats['misses']}")
    assert err < 2e-2, f"{name}: output differs from eager by {err:.3e} (relative L2)"
    expected = [v for v in stats["variants"] if must_hit(v["op"])]
    assert expected and all(v["hits"] > 0 for v in expected), stats["variants"]
    near = {op: n for op, n in stats["near_misses"].items() if must_hit(op)}
    assert not any(near.values()), stats["near_miss_keys"]
    assert torch.equal(after, eager), "remove() did not restore eager exactly"


def test_cuda_graph_capture_and_replay(built):
    import engine.cast
    from engine.models.forwards import output_tensor

    name, module, forward, path, must_hit = built
    cast = engine.cast.load(path)
    with torch.no_grad(), cast.enabled():
        ref = output_tensor(forward()).clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            forward()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        cast.reset_stats()
        with torch.cuda.graph(g):
            static = output_tensor(forward())
        assert all(v["hits"] > 0 for v in cast.stats()["variants"] if must_hit(v["op"]))  # kernels captured
        g.replay()
        torch.cuda.synchronize()
        first = static.clone()
        g.replay()
        torch.cuda.synchronize()
    assert _rel_err(first, ref) < 1e-3, _rel_err(first, ref)
    assert _rel_err(static, first) < 1e-3


def test_host_cost_probe(tmp_path):
    from engine.export.hostcost import measure

    r = measure(tmp_path)
    print(f"\nhost cost per call: {r}")
    assert r["hit_us"] > 0 and r["miss_us"] > 0
