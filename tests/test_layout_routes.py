"""Layout routes (engine/cast/layouts.py): a convolutional module's forward run with its 4-D inputs
channels-last, behind a guard, with eager's output strides given back; and the export's check of them
(engine/export/layout_check.py). On the CPU: PyTorch's CPU convolutions keep a channels-last input's layout as
CUDA's do, so the route's mechanics are the same. Where a test needs a timing, `timed` is a stand-in that
says which arm ran; no number here is a measurement."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from engine.cast import modules
from engine.cast.format import CastWarning
from engine.cast.layouts import LayoutSet, candidates
from engine.export import layout_check


class Probe(torch.nn.Module):
    """Records the layout of what reaches it."""

    def forward(self, x):
        self.seen = "channels_last" if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() \
            else "contiguous"
        return x


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.norm = torch.nn.GroupNorm(4, c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1)
        self.probe = Probe()

    def forward(self, x):
        return x + self.c2(self.probe(torch.nn.functional.silu(self.norm(self.c1(x)))))


class Net(torch.nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(c), Block(c)])
        self.up = torch.nn.Upsample(scale_factor=2)
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.up(x)


class NeedsNchw(Net):
    """A forward that needs eager's layout: `view` across the channel and height dims."""

    def forward(self, x):
        y = super().forward(x)
        return y.view(y.shape[0], y.shape[1] * y.shape[2], y.shape[3])


class ReadsStrides(Net):
    """A forward that silently computes something else channels-last (reads memory as if it were NCHW)."""

    def forward(self, x):
        y = super().forward(x)
        return y.as_strided(y.shape, [y.shape[1] * y.shape[2] * y.shape[3], y.shape[2] * y.shape[3], y.shape[3], 1])


def _net(cls=Net):
    torch.manual_seed(0)
    return cls().eval()


def _routes(model, **kw):
    return LayoutSet(model, lambda path, m: type(m) is type(model), **kw)


def test_the_route_runs_the_convolutions_channels_last_and_gives_eager_strides_back():
    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        ref = m(x)
        assert m.blocks[0].probe.seen == "contiguous"
        ls = _routes(m, learn=True)
        with ls:
            first = m(x)  # a signature's first call runs eagerly and records the outputs
            assert m.blocks[0].probe.seen == "contiguous"
            got = m(x)
            assert m.blocks[0].probe.seen == "channels_last" and m.blocks[1].probe.seen == "channels_last"
    assert torch.equal(first, ref)
    assert got.stride() == ref.stride() and got.is_contiguous()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert ls.summary()["hits"] == 1 and ls.stats()[""]["learned"] == 1
    # removed: the class has its own forward back and nothing is routed
    assert type(m).forward is Net.forward and modules.route_of(m) is None
    with torch.no_grad():
        m(x)
    assert m.blocks[0].probe.seen == "contiguous"


def _aten_calls(fn) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        fn()
    out: dict[str, int] = {}
    for e in p.events():
        if e.name in ("aten::group_norm", "aten::native_group_norm"):
            out[e.name] = out.get(e.name, 0) + 1
    return out


def test_inside_a_route_group_norm_runs_on_the_channels_last_tensor_itself():
    """On CUDA the composite aten::group_norm copies a channels-last input to NCHW (sd35_medium's routed Decoder:
    26 ms of copies). Inside a route the GroupNorms call native_group_norm on the routed tensor directly; outside
    it, PyTorch's F.group_norm runs as it always does."""
    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        ref = m(x)
        assert _aten_calls(lambda: m(x)) == {"aten::group_norm": 2, "aten::native_group_norm": 2}
        ls = _routes(m, learn=True)
        with ls:
            m(x)   # learns the signature (the original forward)
            calls = _aten_calls(lambda: m(x))
            got = m(x)
        assert calls == {"aten::native_group_norm": 2}, calls
        assert m.blocks[1].probe.seen == "channels_last"
        assert _aten_calls(lambda: m(x)) == {"aten::group_norm": 2, "aten::native_group_norm": 2}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert next(iter(ls.routes.values())).keep_group_norm


def test_group_norm_keeping_layout_is_f_group_norm_on_channels_last_tensors_and_declines_the_rest():
    from engine.cast.layouts import _group_norm_keeping_layout

    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 7).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(8), torch.randn(8)
    got = _group_norm_keeping_layout(x, 4, w, b, 1e-6)
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    assert torch.equal(got, torch.nn.functional.group_norm(x, 4, w, b, 1e-6))
    assert torch.equal(_group_norm_keeping_layout(x, 2), torch.nn.functional.group_norm(x, 2))
    # not a 4-D channels-last tensor, or a call F.group_norm refuses: it runs as it is (and raises its own error)
    assert _group_norm_keeping_layout(x.contiguous(), 4, w, b) is None
    assert _group_norm_keeping_layout(torch.randn(2, 8, 6), 4) is None
    assert _group_norm_keeping_layout(x, 3, w, b) is None
    assert _group_norm_keeping_layout(x, 4, torch.randn(4), b) is None
    assert _group_norm_keeping_layout(x, 0) is None


def test_where_native_group_norm_refuses_channels_last_the_route_falls_back_to_f_group_norm(monkeypatch):
    """CUDA's eager native_group_norm takes NCHW only (torch 2.11 raises "Expected X.is_contiguous(memory_format)"
    on a channels-last tensor; the H100 showed it on the GPU test). Without a cast variant for that signature the
    route must not give up: that GroupNorm goes through F.group_norm (its copy to NCHW), asked once per signature."""
    from engine.cast import layouts

    tried = []

    def refuses(x, *args):
        tried.append(tuple(x.shape))
        raise RuntimeError("Expected X.is_contiguous(memory_format) to be true, but got false.")

    monkeypatch.setattr(layouts, "_native_group_norm", refuses)
    monkeypatch.setattr(layouts, "_REFUSED", set())
    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        ref = m(x)
        ls = _routes(m, learn=True)
        with ls:
            m(x)
            first = m(x)
            calls = _aten_calls(lambda: m(x))
    assert tried == [(2, 8, 16, 16)]   # both blocks' GroupNorms have one signature: asked once, remembered
    assert calls == {"aten::group_norm": 2, "aten::native_group_norm": 2}
    assert ls.summary()["hits"] == 2 and not ls.summary()["failed"]
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-5)


def test_a_refusal_is_asked_again_once_the_routed_entries_change(monkeypatch):
    """The refusal is remembered only while the routed entries stay as they were: a twin added afterwards (the
    H100's GPU test added one to a route that had learnt the refusal, and its GroupNorms kept copying to NCHW)
    serves the next call."""
    from engine.cast import layouts, runtime

    native = torch.ops.aten.native_group_norm.default
    twin = []

    def refuses_without_a_twin(x, *args):
        if not twin:
            raise RuntimeError("Expected X.is_contiguous(memory_format) to be true, but got false.")
        return native(x, *args)

    monkeypatch.setattr(layouts, "_native_group_norm", refuses_without_a_twin)
    monkeypatch.setattr(layouts, "_REFUSED", set())
    m, x = _net(), torch.randn(2, 8, 16, 16)
    owner = object()
    composite = {"aten::group_norm": 2, "aten::native_group_norm": 2}   # F.group_norm (on CUDA: its copy)
    with torch.no_grad():
        ref = m(x)
        ls = _routes(m, learn=True)
        with ls:
            m(x)
            assert _aten_calls(lambda: m(x)) == composite       # refused
            twin.append(True)
            assert _aten_calls(lambda: m(x)) == composite       # remembered: nothing routed changed
            runtime.add_entries(owner, [], "CPU")                 # a cast's entries come or go
            try:
                assert _aten_calls(lambda: m(x)) == {"aten::native_group_norm": 2}
                got = m(x)
            finally:
                runtime.remove_owner(owner)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_route_without_a_group_norm_enters_no_torch_function_mode():
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 1)

        def forward(self, x):
            return self.c2(torch.relu(self.c1(x)))

    m = Plain().eval()
    ls = LayoutSet(m, lambda path, mod: type(mod) is Plain, learn=True)
    assert not next(iter(ls.routes.values())).keep_group_norm


def test_a_route_from_recorded_signatures_serves_only_those():
    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        learned = _routes(m, learn=True)
        with learned:
            m(x)
        sigs = json.loads(json.dumps(learned.signatures()))  # as a manifest holds them
        assert list(sigs) == ["Net"] and sigs["Net"][0]["outputs"][0]["shape"] == [2, 8, 32, 32]
        ls = _routes(m, signatures=sigs)
        with ls:
            m(x)
            assert m.blocks[0].probe.seen == "channels_last"
            m(torch.randn(1, 8, 16, 16))  # another signature: PyTorch's layout
            assert m.blocks[0].probe.seen == "contiguous"
            m(x.half().float())
    s = ls.summary()
    assert s["hits"] == 2 and s["misses"] == 1


def test_unreadable_signatures_route_nothing():
    m = _net()
    ls = _routes(m, signatures={"Net": [{"args": [{"tensor": {"dtype": "nope"}}]}]})
    assert ls.routes == {} and "no readable signature" in ls.skipped[""]
    assert _routes(m, signatures={"Other": []}).routes == {}


@pytest.mark.parametrize("case", ["grad", "hooks", "training", "autocast", "kwargs"])
def test_the_guard_declines_and_pytorch_runs(case):
    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        ls = _routes(m, learn=True)
        with ls:
            m(x)
    sigs = ls.signatures()
    ls = _routes(m, signatures=sigs)
    with ls:
        if case == "grad":  # parameters require grad and grad is on: inference only
            m(x)
        elif case == "hooks":
            h = m.blocks[1].c1.register_forward_hook(lambda *a: None)
            with torch.no_grad():
                m(x)
            h.remove()
        elif case == "training":
            m.train()
            with torch.no_grad():
                m(x)
        elif case == "autocast":
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                m(x)
        else:
            with torch.no_grad():
                m.forward(x=x)
    assert m.blocks[0].probe.seen == "contiguous"
    s = ls.summary()
    assert s["hits"] == 0
    if case == "kwargs":
        assert s["misses"] == 1
    else:
        assert s["declines"] == {{"grad": "grad", "hooks": "hooks", "training": "training mode",
                                  "autocast": "autocast"}[case]: 1}
    with ls, torch.no_grad():  # and with nothing in the way, it serves
        m.eval()
        m(x)
    assert m.blocks[0].probe.seen == "channels_last"


def test_a_forward_that_needs_eager_layout_goes_back_to_pytorch_with_one_warning():
    m, x = _net(NeedsNchw), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        ref = m(x)
        ls = _routes(m, learn=True)
        with ls:
            m(x)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                got = m(x)
                again = m(x)
    assert torch.equal(got, ref) and torch.equal(again, ref)
    said = [str(x.message) for x in w if issubclass(x.category, CastWarning)]
    assert len(said) == 1 and "channels-last route of NeedsNchw (the model) stays on PyTorch" in said[0]
    assert "stays on PyTorch for this signature" in said[0] and "view" in said[0]
    assert ls.summary()["hits"] == 0 and ls.summary()["failed"]


def test_candidates_are_the_classes_holding_convolutions_the_largest_first():
    m = _net()
    assert candidates(m) == ["Net", "Block"]
    assert candidates(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []
    assert "ModuleList" not in candidates(m)


def test_the_outermost_module_of_a_class_is_routed_once():
    m = _net()
    ls = LayoutSet(m, lambda path, mod: isinstance(mod, (Net, Block)), learn=True)
    assert list(ls.routes) == [""]


# ------------------------------------------------------------------------- the export's check


def _timer(faster: bool):
    """A stand-in for time_steady: runs the forward, says 100 for the routed arm if `faster` (else 120) and
    110 for the other (with a little spread for the CI)."""
    n = {"i": 0}

    def timed(fn):
        fn()
        n["i"] += 1
        routed = modules.route_of(MODEL[0]) is not None
        return (100.0 if faster else 120.0) + n["i"] % 3 if routed else 110.0 + n["i"] % 3
    return timed


MODEL: list = []


def _check(cls=Net, faster=True, dtype="float32", reference=False):
    m, x = _net(cls), torch.randn(2, 8, 16, 16)
    MODEL[:] = [m]
    with torch.no_grad():
        eager = m(x).double()
        ref = layout_check.float32_output(m, lambda: m(x)) if reference else None
    return layout_check.check(m, lambda: m(x), candidates(m), eager, eager, dtype, _timer(faster),
                              max_s=0.0, reference=ref)


def test_the_check_keeps_the_first_class_faster_with_confidence_and_its_signatures():
    r = _check()
    c = r["chosen"]
    assert c["class"] == "Net" and c["speedup_ci"][0] > 1.0 and c["rel_l2_err"] < 1e-5
    assert list(c["signatures"]) == ["Net"] and c["hits"] == 1


def test_the_check_keeps_nothing_that_is_not_faster():
    r = _check(faster=False)
    assert r["chosen"] is None and [t["why"] for t in r["tried"]] == ["not faster with confidence"] * 2


def test_the_check_rejects_a_forward_that_computes_something_else_channels_last():
    r = _check(ReadsStrides)
    assert r["chosen"] is None
    t = r["tried"][0]
    assert t["class"] == "ReadsStrides" and "moves" in t["why"] and "speedup" not in t


def test_the_check_counts_a_forward_that_raises_as_not_run():
    r = _check(NeedsNchw)
    assert r["tried"][0]["why"].startswith("no module ran channels-last")


def test_the_drift_bar_is_twice_the_casts_and_never_below_the_dtypes_floor():
    assert layout_check.drift_bar("bfloat16", 0.0) == 1e-2
    assert layout_check.drift_bar("bfloat16", 0.02) == 0.04
    assert layout_check.drift_bar("float32", 0.0) == layout_check.DRIFT_FLOOR_OTHER


def test_a_float32_reference_is_made_in_place_and_everything_is_put_back():
    m = _net().to(torch.bfloat16)
    x = torch.randn(2, 8, 16, 16).to(torch.bfloat16)
    before = {k: (v.dtype, v.clone()) for k, v in m.state_dict().items()}
    with torch.no_grad():
        ref = layout_check.float32_output(m, lambda: m(x))
        want = _net()(x.float()).double()  # the same weights (seed 0) never rounded to bf16
    assert ref is not None and ref.dtype == torch.float64
    after = m.state_dict()
    assert all(after[k].dtype == d and torch.equal(after[k], v) for k, (d, v) in before.items())
    # the reference is the float32 model on the bf16 weights: near the float32 model, far nearer than bf16 eager
    with torch.no_grad():
        bf = m(x).double()
    assert float((ref - want).norm() / want.norm()) < float((bf - want).norm() / want.norm())
    assert layout_check.float32_output(_net(), lambda: None) is None  # nothing 16-bit: no reference


def test_a_torchscript_model_has_no_float32_reference_and_keeps_its_weights():
    """A scripted root refuses Python hooks: the check goes on without a float32 reference (it crashed)."""
    nn = torch.nn
    m = torch.jit.script(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1)).to(torch.bfloat16))
    x = torch.randn(2, 8, 16, 16).to(torch.bfloat16)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        assert layout_check.float32_output(m, lambda: m(x)) is None
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, before[k]) for k, v in m.state_dict().items())


def test_with_a_float32_reference_the_route_must_be_about_as_accurate_as_the_model_without_it():
    ref = torch.ones(1000, dtype=torch.float64)
    eager = ref + 0.01 * torch.randn(1000, dtype=torch.float64)  # eager's own 16-bit error, ~1e-2
    rule = layout_check.judge(eager, "bfloat16", eager, ref)
    as_good = ref + 0.011 * torch.randn(1000, dtype=torch.float64)
    worse = ref + 0.05 * torch.randn(1000, dtype=torch.float64)
    assert "why" not in rule(as_good)
    r = rule(worse)
    assert "from the float32 model's" in r["why"] and r["float32_err"] > 1.5 * r["float32_err_without"]


def test_the_check_with_a_float32_reference_rejects_a_forward_that_computes_something_else():
    # bf16 models: the reference exists; the one that reads NCHW strides is far from it
    import engine.export.layout_check as lc

    m, x = _net(ReadsStrides).to(torch.bfloat16), torch.randn(2, 8, 16, 16).to(torch.bfloat16)
    MODEL[:] = [m]
    with torch.no_grad():
        eager = m(x).double()
        ref = lc.float32_output(m, lambda: m(x))
    r = lc.check(m, lambda: m(x), ["ReadsStrides"], eager, eager, "bfloat16", _timer(True), max_s=0.0,
                 reference=ref)
    assert r["chosen"] is None and "from the float32 model's" in r["tried"][0]["why"]


def test_the_checks_fresh_process_on_a_real_model(tmp_path):
    """`python -m engine.export.layout_check` as the export runs it, on ResNet-50's small build on the CPU
    (`--device cpu`, the plumbing only: the CPU's times are no measurement): it tries the model's own class
    first, routes it, records the signature it proved, and judges the output against the float32 model."""
    import subprocess
    import sys

    from engine.cast.format import write_cast
    from engine.export.package import package

    env = {"gpu": "none", "arch": "sm_90", "torch": "2.11.0", "torch_minor": "2.11", "cuda": "13.0",
           "driver": "x", "nvrtc": "13.0"}
    manifest, files, report = package([], env, {"run": "t", "model": "resnet50"})
    write_cast(tmp_path / "none.cast", manifest, files, report)
    # its small build at batch 1 and 33x33, whose last stage is still 2x2 (at 1x1 a channels-last tensor is also
    # contiguous); ResNet-50 in float16 on a CI core: 1.5 s a forward at 224x224, 85 s for the test; 26 s at 64x64;
    # the check's process took 19.3 s of CPU at batch 2 and 40x40, 14.7 s here (float16 convolutions on an AVX2
    # CPU are PyTorch's slow reference kernel: 53 forwards, 40 of them the timed rounds)
    config = tmp_path / "resnet50.toml"
    config.write_text(Path("configs/models/resnet50.toml").read_text().replace("batch = 2", "batch = 1\nimage_size = 33"))
    p = subprocess.run([sys.executable, "-m", "engine.export.layout_check", "--config", str(config),
                        "--small", "--cast", str(tmp_path / "none.cast"), "--out", str(tmp_path / "r.json"),
                        "--device", "cpu", "--max-s", "0.5", "--tries", "1"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["candidates"][0] == "ResNet" and r["float32_reference"] is True and r["output_dtype"] == "float16"
    t = r["tried"][0]
    assert t["class"] == "ResNet" and t["paths"] == [""] and t["hits"] >= 1 and not t["failed"]
    assert t["float32_err"] <= 1.5 * t["float32_err_without"] + 1e-7
    sig = t["signatures"]["ResNet"][0]
    assert sig["args"][0]["tensor"]["shape"] == [1, 3, 33, 33] and sig["outputs"][0]["shape"] == [1, 1000]


class WritesItsInput(Net):
    def forward(self, x):
        x.mul_(1.0)
        return super().forward(x)


class ReturnsItsInput(Net):
    def forward(self, x):
        super().forward(x)
        return x


@pytest.mark.parametrize("cls,why", [(WritesItsInput, "writes an argument in place"),
                                     (ReturnsItsInput, "returns a view of an argument")])
def test_a_forward_that_writes_or_returns_its_argument_is_never_routed(cls, why):
    m, x = _net(cls), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        ls = _routes(m, learn=True)
        with ls:
            for _ in range(3):
                m(x)
    s = ls.summary()
    assert s["hits"] == 0 and ls.signatures() == {cls.__name__: []}
    assert len(s["failed"]) == 1 and why in s["failed"][0]  # refused once, not learned again at every call


def test_with_graphs_tries_the_eager_winner_under_cuda_graphs_and_keeps_it_where_it_wins():
    won = {"class": "Net", "speedup": 1.2, "speedup_ci": [1.1, 1.3], "signatures": {"Net": [{}]}}
    res = layout_check.with_graphs({"tried": [won], "chosen": won}, lambda t: {"speedup": 1.4,
                                                                                "speedup_ci": [1.3, 1.5]})
    assert res["chosen"]["targets"] == ["eager", "cuda-graphs"]
    res = layout_check.with_graphs({"tried": [dict(won)], "chosen": dict(won)},
                                   lambda t: {"why": "not faster with confidence"})
    assert res["chosen"]["targets"] == ["eager"]
    res = layout_check.with_graphs({"tried": [dict(won)], "chosen": dict(won)}, lambda t: 1 / 0)
    assert res["chosen"]["targets"] == ["eager"] and "ZeroDivisionError" in res["chosen"]["graphs"]["why"]


def test_a_class_not_faster_in_eager_is_kept_for_cuda_graphs_alone_where_it_wins_there():
    """ResNet-50 at batch 32 on the H200: host-bound in eager (channels-last 0.885x), 1.50x under CUDA graphs."""
    eager_only = {"class": "ResNet", "speedup": 0.9, "speedup_ci": [0.88, 0.92], "why": "not faster with confidence",
                  "signatures": {"ResNet": [{}]}}
    refused = {"class": "Other", "why": "no module ran channels-last"}
    res = layout_check.with_graphs({"tried": [refused, eager_only], "chosen": None},
                                   lambda t: {"speedup": 1.5, "speedup_ci": [1.49, 1.51]})
    c = res["chosen"]
    assert c["class"] == "ResNet" and c["targets"] == ["cuda-graphs"] and "why" not in c
    assert c["eager_why"] == "not faster with confidence" and c["graphs"]["speedup"] == 1.5
    res = layout_check.with_graphs({"tried": [dict(eager_only)], "chosen": None},
                                   lambda t: {"why": "not faster with confidence"})
    assert res["chosen"] is None
    from engine.export.report import layout_routes_text

    text = layout_routes_text({"layout_routes": {**c, "classes": ["ResNet"], "rel_l2_err": 1e-4}})
    assert "run channels-last in cuda-graphs, under CUDA graphs 1.50× (1.49–1.51); not in eager (0.90× " \
           "(0.88–0.92): not faster with confidence)" in text


def test_a_copy_of_the_model_made_while_routed_computes_with_its_own_weights():
    """A deep copy made while the route was installed held a copy of the route, which ran the original
    module's forward: the copy computed with the original's weights."""
    import copy

    m, x = _net(), torch.randn(2, 8, 16, 16)
    with torch.no_grad():
        learned = _routes(m, learn=True)
        with learned:
            m(x)
        with _routes(m, signatures=learned.signatures()):
            twin = copy.deepcopy(m)
            twin.blocks[0].c1.weight.add_(1)
            got = twin(x)
        want = twin(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert modules.route_of(twin) is None
