"""H200: layout routes (engine/cast/layouts.py) on CUDA.

1. A VAE-like stack of resnet halves in bf16, routed channels-last: cuDNN runs its convolutions without the
   NCHW<->NHWC transposes eager launches around each (the profile's kernel names), the output comes back in
   eager's strides and is about as accurate as eager (distance from the float32 model, the export's rule). The times of both arms are
   printed (`layout-route` lines), not asserted.
2. The export's check in its fresh process (`python -m engine.export.layout_check`) on the SD3.5 VAE's small
   build with a cast of no variant: it tries the decoder's classes and reports each with its drift and,
   where the output stands, its speedup; whether one is kept is the measurement's to say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu


class Half(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = torch.nn.GroupNorm(32, c, eps=1e-6)
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return x + self.conv2(torch.nn.functional.silu(self.norm(self.conv1(x))))


class Stack(torch.nn.Module):
    def __init__(self, c=128, n=3):
        super().__init__()
        self.halves = torch.nn.ModuleList([Half(c) for _ in range(n)])
        self.out = torch.nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x):
        for h in self.halves:
            x = h(x)
        return self.out(x)


def _transposes(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in p.events() if "nchwToNhwc" in e.name or "nhwcToNchw" in e.name)


def test_a_routed_stack_runs_nhwc_and_agrees_with_eager():
    from engine.bench.forward import time_steady
    from engine.cast.layouts import LayoutSet
    from engine.export.e2e import rel_l2_err
    from engine.export.layout_check import ACCURACY_RATIO, float32_output

    torch.manual_seed(0)
    m = Stack().cuda().to(torch.bfloat16).eval()
    with torch.no_grad():
        for h in m.halves:
            h.conv1.weight.mul_(0.1)
            h.conv2.weight.mul_(0.1)
    x = torch.randn(1, 128, 256, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = m(x)
        ref32 = float32_output(m, lambda: m(x))
        eager_t = _transposes(lambda: m(x))
        ls = LayoutSet(m, lambda path, mod: type(mod) is Stack, learn=True)
        with ls:
            m(x)
            got = m(x)
            routed_t = _transposes(lambda: m(x))
            t_routed = sorted(time_steady(lambda: m(x)) for _ in range(7))[3]
        t_eager = sorted(time_steady(lambda: m(x)) for _ in range(7))[3]
    print(f"layout-route stack eager {t_eager:.0f} us ({eager_t} transposes), routed {t_routed:.0f} us "
          f"({routed_t} transposes): {t_eager / t_routed:.3f}x")
    assert got.stride() == ref.stride() and got.is_contiguous()
    e_eager, e_routed = rel_l2_err(ref.double(), ref32), rel_l2_err(got.double(), ref32)
    print(f"layout-route stack error from float32: eager {e_eager:.2e}, routed {e_routed:.2e}")
    assert e_routed <= ACCURACY_RATIO * e_eager, (e_routed, e_eager)
    assert ls.summary()["hits"] >= 2 and not ls.summary()["failed"]
    assert routed_t < eager_t, (routed_t, eager_t)


class Seen(torch.nn.Module):
    """Records whether what reaches it is channels-last."""

    def forward(self, x):
        self.channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        return x


class SeenHalf(Half):
    def __init__(self, c):
        super().__init__(c)
        self.seen = Seen()

    def forward(self, x):
        return x + self.conv2(self.seen(torch.nn.functional.silu(self.norm(self.conv1(x)))))


def _twin(x, w):
    """A channels-last GroupNorm variant for `x`'s signature, as a cast's twin would serve it (at the CUDA key):
    computes through NCHW and hands back channels-last."""
    from engine.capture.signature import bind_arguments, signature_of
    from engine.cast import runtime
    from engine.cast.guard import first_shape, layout_of, signature_key

    op = torch.ops.aten.native_group_norm.default
    args = (x, w, w, x.shape[0], x.shape[1], x.shape[2] * x.shape[3], 32, 1e-6)
    sig = signature_of(op, bind_arguments(op, args, {}))

    def run(b):
        y, mean, rstd = op(b[0].contiguous(), *b[1:])
        return y.contiguous(memory_format=torch.channels_last), mean, rstd

    lay = layout_of(op)
    plan = runtime.Plan("twin", run)
    owner = object()
    runtime.add_entries(owner, [(lay.op_name, signature_key(lay, sig, 0), plan, first_shape(sig))], "CUDA")
    return owner, plan


def test_inside_a_route_group_norm_keeps_channels_last_where_a_twin_serves_it():
    """CUDA's aten::group_norm copies a channels-last input to NCHW, and its native_group_norm refuses one
    (H100, torch 2.11: "Expected X.is_contiguous(memory_format)"). Inside a route, without a variant for the
    channels-last signature, the GroupNorms go through F.group_norm as before (the route still serves, nothing
    fails); with one (a cast's channels-last twin), they run on the channels-last tensor itself, the convolution
    after them runs NHWC too, and the routed stack launches almost none of cuDNN's transposes."""
    from engine.cast import runtime
    from engine.cast.layouts import LayoutSet

    torch.manual_seed(0)
    m = Stack().cuda().to(torch.bfloat16).eval()
    m.halves = torch.nn.ModuleList([SeenHalf(128) for _ in range(3)]).cuda().to(torch.bfloat16).eval()
    x = torch.randn(1, 128, 128, 128, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = m(x)
        eager_t = _transposes(lambda: m(x))
        assert not m.halves[1].seen.channels_last
        ls = LayoutSet(m, lambda path, mod: type(mod) is Stack, learn=True)
        with ls:
            m(x)
            plain = m(x)
            assert not any(h.seen.channels_last for h in m.halves)   # no twin: F.group_norm's copy
            plain_t = _transposes(lambda: m(x))
            owner, plan = _twin(m.halves[0].conv1(x.contiguous(memory_format=torch.channels_last)),
                                m.halves[0].norm.weight)
            try:
                got = m(x)
                assert all(h.seen.channels_last for h in m.halves) and plan.hits == 3
                routed_t = _transposes(lambda: m(x))
            finally:
                runtime.remove_owner(owner)
    print(f"layout-route group_norm: transposes eager {eager_t}, routed without a twin {plain_t}, with {routed_t}")
    assert ls.summary()["hits"] >= 3 and not ls.summary()["failed"]
    assert routed_t <= eager_t // 4, (routed_t, eager_t)
    for out in (plain, got):
        assert out.stride() == ref.stride()
        assert (out.float() - ref.float()).norm() <= 2e-2 * ref.float().norm()


def test_the_export_check_tries_the_vaes_classes_in_a_fresh_process(tmp_path):
    from engine.cast.compat import current_env
    from engine.cast.format import write_cast
    from engine.export.package import package

    path = tmp_path / "none.cast"
    manifest, files, report = package([], current_env(), {"run": "test", "model": "sd35_vae"})
    write_cast(path, manifest, files, report)
    out = tmp_path / "layout_check.json"
    proc = subprocess.run([sys.executable, "-m", "engine.export.layout_check", "--config",
                           "configs/examples/sd35_vae.toml", "--small", "--cast", str(path), "--out", str(out),
                           "--max-s", "5"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["candidates"] and res["tried"], res
    for t in res["tried"]:
        print(f"layout-check {t['class']}: modules {t['modules']}, hits {t.get('hits')}, rel_l2 "
              f"{t.get('rel_l2_err')}, float32 err {t.get('float32_err')} (without {t.get('float32_err_without')}), speedup {t.get('speedup')} {t.get('speedup_ci')}, why {t.get('why')}")
        if "float32_err" in t:  # the rule said what it compared, and a refusal says why
            assert t["float32_err"] <= 1.5 * t["float32_err_without"] + 1e-7 or "float32" in t.get("why", "")
