"""The loader runs a variant only under the targets its export kept it for (eager, CUDA graphs, a
torch.compile mode), on the CPU: a hand-written cast of three native_group_norm variants (one per shape)
whose plans are PyTorch's own kernel at the CPU key, so results are exact and the hit counters tell who
ran. A variant without recorded targets runs where the cast's one whole-model check measured it (a cast
exported before targets), or everywhere where no whole-model check is recorded (a script's cast)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

import engine.cast
from engine.capture.signature import bind_arguments, signature_of, signature_text
from engine.cast import compose, runtime
from engine.cast import format as cast_format
from engine.cast.format import write_cast
from engine.verify.tolerance import may_reorder

GN = torch.ops.aten.native_group_norm.default
ROUTE = ("aten::native_group_norm", "CPU")
ENV = {"torch": torch.__version__, "torch_minor": ".".join(torch.__version__.split(".")[:2]), "cuda": "13.0",
       "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0], "driver": "13.0", "nvrtc": "13.0"}
SIDES = {"eager-only": 4, "compile-only": 6, "legacy": 8}  # variant id -> the spatial side of its input
TARGETS = {"eager-only": ["eager", "cuda-graphs"], "compile-only": ["compile"], "legacy": None}


def _args(side: int) -> list:
    torch.manual_seed(side)
    return [torch.randn(2, 8, side, side), torch.randn(8), torch.randn(8), 2, 8, side * side, 4, 1e-5]


def _variant(vid: str) -> dict:
    sig = signature_of(GN, bind_arguments(GN, _args(SIDES[vid]), {}))
    v = {"id": vid, "op": "aten::native_group_norm", "signature": sig, "signature_text": signature_text(sig),
         "outputs": [], "launch_spec": "", "kernels": [], "files": {}, "category": "custom CUDA",
         "evidence": {}, "provenance": {}}
    if TARGETS[vid] is not None:
        v["targets"] = TARGETS[vid]
    return v


def f(x, w, b):
    return torch.relu(F.group_norm(x, 4, w, b, 1e-5)) * 2


def _pytorch(bound):
    return runtime.routes()[ROUTE].original.call_boxed(torch._C._dispatch_keyset_full(), *bound)


@pytest.fixture
def cast_file(tmp_path, monkeypatch):
    """The cast's file; its routes go to the CPU key, through the Python router."""
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "python")
    monkeypatch.setattr(runtime, "add_entries", functools.partial(runtime.add_entries, dispatch_key="CPU"))
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [_variant(v) for v in SIDES]}
    write_cast(tmp_path / "t.cast", manifest, {}, "# test\n")
    return tmp_path / "t.cast"


@pytest.fixture
def cast(cast_file):
    """The cast loaded with plans that run PyTorch's kernel."""
    c = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES})
    torch._dynamo.reset()
    yield c
    c.remove()
    torch._dynamo.reset()
    assert runtime.routes() == {}


def _hits(c) -> dict[str, int]:
    return {v["id"]: v["hits"] for v in c.stats()["variants"]}


def _call_each(fn) -> None:
    for side in SIDES.values():
        x, w, b = _args(side)[:3]
        with runtime.suspended():  # the reference: PyTorch alone, not counted
            expected = f(x, w, b)
        torch.testing.assert_close(fn(x, w, b), expected, rtol=0, atol=1e-5)


def test_in_eager_only_variants_kept_for_eager_run(cast):
    with cast.enabled(), torch.no_grad():
        _call_each(f)
        assert cast.stats()["target_declines"]["aten::native_group_norm"] == 1  # compile-only's call
    assert _hits(cast) == {"eager-only": 1, "compile-only": 0, "legacy": 1}


def test_under_compile_only_variants_kept_for_that_mode_run(cast):
    # Static shapes: eager-only's shape has no variant proven for compile, so Inductor decomposes that call
    # (its own code, never a guard miss into PyTorch's kernel); dynamic shapes keep the op for every size and
    # the router declines eager-only's call at run time.
    with cast.enabled(), torch.no_grad():
        _call_each(cast.compile(f))
        assert cast.stats()["target_declines"].get("aten::native_group_norm", 0) == 0
    assert _hits(cast) == {"eager-only": 0, "compile-only": 1, "legacy": 1}
    torch._dynamo.reset()
    with cast.enabled(), torch.no_grad():
        _call_each(cast.compile(f, dynamic=True))
        assert cast.stats()["target_declines"]["aten::native_group_norm"] == 1  # eager-only's call
    assert _hits(cast) == {"eager-only": 0, "compile-only": 2, "legacy": 2}
    torch._dynamo.reset()
    with cast.enabled(), torch.no_grad():  # eager calls after (and outside) the compiled graph: eager's set
        _call_each(f)
    assert _hits(cast) == {"eager-only": 1, "compile-only": 2, "legacy": 3}


def test_a_mode_nothing_was_kept_for_decomposes_as_inductor_would(cast):
    # compile:max-autotune-no-cudagraphs: only the legacy variant (no targets) may run, so the op stays
    # ATen (it covers float32 on the CPU); with the legacy variant gone, nothing of the cast is kept.
    with cast.enabled():
        assert compose.coverage(cast, "compile:max-autotune-no-cudagraphs")
        assert compose.coverage(cast, "compile")
        assert compose.backend(cast, mode="max-autotune-no-cudagraphs").target == "compile:max-autotune-no-cudagraphs"
        assert compose.backend(cast, mode="reduce-overhead").target == "compile:reduce-overhead"
        assert compose.backend(cast).target == "compile"
        runtime.remove_owner(cast)  # keep only the eager-only variant's entry
        entry = next(v.plan.entry for v in cast.variants if v.id == "eager-only")
        runtime.add_entries(cast, [entry])
        assert compose.coverage(cast, "eager") and not compose.coverage(cast, "compile")
        backend = compose.backend(cast)
        with torch.no_grad():
            _call_each(torch.compile(f, backend=backend))
    assert backend.vetoed and all(v == () for v in backend.vetoed)
    assert _hits(cast)["eager-only"] == 0


_SEEN_TARGETS: list[str] = []


@torch.library.custom_op("kforge_test::target_probe", mutates_args=())
def _target_probe(x: torch.Tensor) -> torch.Tensor:
    """An op compiled code calls as it is (Inductor cannot look inside): records the target it runs under."""
    _SEEN_TARGETS.append(runtime.current_target())
    return x.clone()


@_target_probe.register_fake
def _(x):
    return torch.empty_like(x)


def _probed(x, w, b):
    return _target_probe(f(x, w, b))


def test_a_cast_with_nothing_for_a_mode_compiles_as_torch_compile_itself(cast_file):
    """An eager-only cast under torch.compile: cast.compile is torch.compile's own compile, one compile shared
    with a plain torch.compile of the same function (Dynamo's code, not a second draw of Inductor), called under
    the mode's target, so what the compiled code calls through ATen declines the eager-only variants, graph
    breaks included. cast.backend() is Inductor's own compile with its graphs under the target. A mode that
    has variants, or a variant held to no target (every mode, max-autotune too), still gets the cast's backend."""
    from torch._dynamo.utils import counters

    eager_only = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES}, only={"eager-only"})
    torch._dynamo.reset()
    try:
        assert compose.nothing_under(eager_only, None) and compose.nothing_under(eager_only, "reduce-overhead")
        assert compose.nothing_under(eager_only, "max-autotune")
        assert eager_only.active_by_target()["eager"] == ["eager-only"]  # it is there for eager
        own = compose.backend(eager_only)  # Inductor's own compile configuration
        assert isinstance(own, compose.InductorBackend) and own == torch._TorchCompileInductorWrapper(None, None, None)
        x, w, b = _args(4)[:3]
        with eager_only.enabled(), torch.no_grad():
            g0 = counters["stats"]["unique_graphs"]
            _SEEN_TARGETS.clear()
            out = eager_only.compile(_probed)(x, w, b)
            g1 = counters["stats"]["unique_graphs"]
            torch.compile(_probed)(x, w, b)
            assert counters["stats"]["unique_graphs"] == g1 > g0  # the plain compile found the same code
            assert _SEEN_TARGETS == ["compile", "eager"]  # cast.compile's call under compile, the plain one not
            _SEEN_TARGETS.clear()
            torch._dynamo.reset()
            torch.compile(_probed, backend=own)(x, w, b)  # the backend object: its graphs under the target
            assert _SEEN_TARGETS == ["compile"]
            # mode and options together (torch.compile alone refuses both): the mode's options under the user's
            torch._dynamo.reset()
            eager_only.compile(_probed, mode="max-autotune-no-cudagraphs", options={"max_autotune": False})(x, w, b)
        with runtime.suspended():
            torch.testing.assert_close(out, f(x, w, b), rtol=0, atol=1e-5)
        assert _hits(eager_only)["eager-only"] == 0
    finally:
        eager_only.remove()
        torch._dynamo.reset()
    both = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES}, only={"eager-only", "compile-only"})
    try:
        assert not compose.nothing_under(both, None) and compose.nothing_under(both, "reduce-overhead")
        assert isinstance(compose.backend(both), compose.CastBackend)
    finally:
        both.remove()
    legacy = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES}, only={"legacy"})
    try:  # a variant held to no target runs under every mode, max-autotune included
        assert not compose.nothing_under(legacy, "max-autotune") and not compose.nothing_under(legacy, None)
    finally:
        legacy.remove()


def test_while_a_cuda_graph_is_captured_the_target_is_cuda_graphs(monkeypatch):
    assert runtime.current_target() == "eager"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert runtime.current_target() == "cuda-graphs"
    assert not runtime.allowed(frozenset({"eager"})) and runtime.allowed(frozenset({"eager", "cuda-graphs"}))
    with runtime.target_scope("compile:reduce-overhead"):  # compiled code: its mode, captured or not
        assert runtime.current_target() == "compile:reduce-overhead"
        assert not runtime.allowed(frozenset({"cuda-graphs"}))
    assert runtime.current_target() == "cuda-graphs"


def test_stats_say_which_variants_run_under_which_target(cast):
    st = cast.stats()
    assert st["targets"]["eager"] == ["eager-only", "legacy"]
    assert st["targets"]["cuda-graphs"] == ["eager-only", "legacy"]
    assert st["targets"]["compile"] == ["compile-only", "legacy"]
    assert st["targets"]["compile:reduce-overhead"] == ["legacy"]
    assert {v["id"]: v["targets"] for v in st["variants"]} == {
        "eager-only": ["cuda-graphs", "eager"], "compile-only": ["compile"], "legacy": None}
    text = cast.summary()
    assert "1 without recorded targets (no whole-model check recorded: run under every target)" in text
    assert "  compile: 2 variant(s)" in text and "  compile:reduce-overhead: 1 variant(s)" in text


def test_any_target_runs_every_variant_in_eager_for_its_own_checks(cast_file):
    # audit --verify and confirmation call each variant's public op in eager, whatever it was kept for.
    c = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES}, any_target=True)
    try:
        with c.enabled(), torch.no_grad():
            _call_each(f)
        assert _hits(c) == {"eager-only": 1, "compile-only": 1, "legacy": 1}
        assert c.stats()["targets"]["compile:reduce-overhead"] == list(SIDES)
    finally:
        c.remove()


@pytest.fixture
def old_export(tmp_path, monkeypatch):
    """A cast as exports wrote them before targets were recorded: no targets per variant, one whole-model
    check in eager under `source.model_check` (the H200's sd35_medium cast of 2026-11-30 is one)."""
    monkeypatch.setenv("KFORGE_CAST_ROUTER", "python")
    monkeypatch.setattr(runtime, "add_entries", functools.partial(runtime.add_entries, dispatch_key="CPU"))
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "source": {"model": "m", "model_check": {"mode": "eager", "speedup": 1.97,
                                                         "speedup_ci": [1.95, 1.99], "eager_ms": 97.9,
                                                         "cast_ms": 49.8}},
                "variants": [_variant("legacy")]}
    write_cast(tmp_path / "old.cast", manifest, {}, "# test\n")
    c = engine.cast.load(tmp_path / "old.cast", env=ENV, plans={"legacy": _pytorch})
    torch._dynamo.reset()
    yield c
    c.remove()
    torch._dynamo.reset()


def test_a_cast_exported_before_targets_runs_only_where_its_one_check_measured_it(old_export):
    """Such a cast used to run everywhere; under torch.compile the H200 sd35_medium one made the model
    0.827× (0.823–0.829) as fast as torch.compile alone. It was proven in eager only: it now runs there."""
    c = old_export
    x, w, b = _args(SIDES["legacy"])[:3]
    with runtime.suspended():
        expected = f(x, w, b)
    with c.enabled(), torch.no_grad():
        torch.testing.assert_close(f(x, w, b), expected, rtol=0, atol=1e-5)
        assert _hits(c) == {"legacy": 1}
        assert not compose.coverage(c, "compile")  # nothing of it for Inductor to call: it decomposes as usual
        torch.testing.assert_close(c.compile(f)(x, w, b), expected, rtol=0, atol=1e-5)
    assert _hits(c) == {"legacy": 1}  # the compiled call ran Inductor's code
    st = c.stats()
    assert st["targets"]["eager"] == ["legacy"] and st["targets"]["compile"] == []
    assert st["targets"]["cuda-graphs"] == []
    assert {v["id"]: v["targets"] for v in st["variants"]} == {"legacy": ["eager"]}
    assert "1 without recorded targets (held to the cast's one whole-model check: eager)" in c.summary()


def test_torch_compile_may_hand_the_cast_backend_its_own_mode_but_no_other(cast_file):
    """torch.compile(model, backend=b, mode=…) passes the mode on to a backend object, as transformers'
    generate() does with CompileConfig(backend=b) (mode "reduce-overhead" unless set): the backend's own mode
    compiles, another is a one-line error naming the fix; the same for the backend that is Inductor's own."""
    x, w, b = _args(6)[:3]
    for only in ({"compile-only"}, {"eager-only"}):  # the cast's backend; Inductor's own (nothing for compile)
        c = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES}, only=only)
        torch._dynamo.reset()
        try:
            with c.enabled(), torch.no_grad():
                b_ro = c.backend(mode="max-autotune-no-cudagraphs")
                out = torch.compile(f, backend=b_ro, mode="max-autotune-no-cudagraphs")(x, w, b)
                with runtime.suspended():
                    torch.testing.assert_close(out, f(x, w, b), rtol=0, atol=1e-5)
                torch._dynamo.reset()
                with pytest.raises(Exception, match=r"made for mode 'default' was asked for mode 'reduce-overhead' "
                                                    r"by torch.compile: make it with cast.backend\(mode='reduce-overhead'\)"):
                    torch.compile(f, backend=c.backend(), mode="reduce-overhead")(x, w, b)
        finally:
            c.remove()
            torch._dynamo.reset()


def test_transformers_generate_compiles_decoding_through_the_cast_backend(cast_file):
    """transformers' generate() with a static cache compiles its decoding step itself (on a GPU by default;
    `_compile_all_devices` here on the CPU) with CompileConfig's backend and mode ("reduce-overhead"). The cast's
    backend made for that mode goes there as it is, whether it is the cast's (a variant runs under every target)
    or Inductor's own (nothing of the cast for the mode), and the tokens are those of uncompiled decoding."""
    from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    lm = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        want = lm.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static", disable_compile=True)
    for only, kind in (({"legacy"}, compose.CastBackend), ({"eager-only"}, compose.InductorBackend)):
        c = engine.cast.load(cast_file, env=ENV, plans={v: _pytorch for v in SIDES}, only=only)
        torch._dynamo.reset()
        try:
            b = c.backend(mode="reduce-overhead")
            assert isinstance(b, kind)
            cc = CompileConfig(backend=b)
            cc._compile_all_devices = True  # transformers compiles only on accelerators unless told
            from torch._dynamo.utils import counters

            g0 = counters["stats"]["unique_graphs"]
            with c.enabled(), torch.no_grad():
                got = lm.generate(ids, max_new_tokens=4, do_sample=False, cache_implementation="static",
                                  compile_config=cc)
            assert torch.equal(got, want)
            assert counters["stats"]["unique_graphs"] > g0  # the decoding step was compiled (through b)
            if kind is compose.CastBackend:
                assert b.vetoed  # the decoding step went through the cast's backend
        finally:
            c.remove()
            torch._dynamo.reset()


# With torch.use_deterministic_algorithms(True) on, a cast runs no kernel that may round otherwise from run to run
# (a reduction's, a norm's, a matmul's, attention's: verification held their second run to a tolerance, not bit
# for bit). The user asked for the same bits every run; PyTorch's kernels give them. Elementwise kernels still run.

@pytest.fixture
def deterministic():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def _call(c):
    """The model's output and the cast's stats, read while it is enabled (a removed route's counters go with it)."""
    x, w, b = _args(SIDES["legacy"])[:3]
    with c.enabled(), torch.no_grad():
        return f(x, w, b), c.stats()


def test_a_norm_kernel_is_declined_while_deterministic_algorithms_are_on(cast, deterministic):
    out, stats = _call(cast)
    assert _hits(cast)["legacy"] == 0
    assert stats["determinism_declines"] == {"aten::native_group_norm": 1}
    x, w, b = _args(SIDES["legacy"])[:3]
    with runtime.suspended():
        assert torch.equal(out, f(x, w, b))


def test_it_runs_again_once_they_are_off(cast):
    _, stats = _call(cast)
    assert _hits(cast)["legacy"] == 1 and stats["determinism_declines"] == {}


def test_which_cards_may_reorder():
    assert may_reorder("aten::native_group_norm") and may_reorder("aten::sum.dim_IntList")
    assert may_reorder("aten::mm") and may_reorder("aten::_scaled_dot_product_flash_attention")
    assert not may_reorder("aten::relu") and not may_reorder("aten::add.Tensor")
    chain = {"chain": {"nodes": [{"op": "aten::mul.Tensor"}, {"op": "aten::mean.dim"}]}}
    assert may_reorder("kforge::chain", chain)   # a chain holding a reduction
    assert not may_reorder("kforge::chain", {"chain": {"nodes": [{"op": "aten::mul.Tensor"}]}})
