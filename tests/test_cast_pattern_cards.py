"""Pattern cards from a .cast file (engine.cast.loader + engine.cast.patterns) on the CPU: the cast's
chain variant (the toy MLP's silu(gate) * up) is replaced inside graphs that `cast.compile` makes, with a
Python plan that counts its calls and computes with run_chain; results equal eager's."""

from __future__ import annotations

import pytest
import torch
from test_cast_modules import ENV
from test_chains import MLP, Model, _heavy_ops, _patterns

import engine.cast
from engine.capture.chains import CHAIN_OP, chain_signature, run_chain
from engine.cast import format as cast_format
from engine.cast.format import CastError, write_cast


def _glu_signature():
    torch.manual_seed(0)
    model = Model().to(torch.float32)
    _, pats = _patterns(model, torch.randn(2, 5, 32))
    glu = next(p for p in pats if _heavy_ops(p) == ["silu", "mul"])
    return chain_signature(glu.instances[0])


def _cast(tmp_path, variant):
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [variant]}
    write_cast(tmp_path / "p.cast", manifest, {}, "# test\n")
    return tmp_path / "p.cast"


def _variant(sig, **extra):
    return {"id": "glu", "op": CHAIN_OP, "signature": sig, "signature_text": "silu * mul", "outputs": [],
            "launch_spec": "", "kernels": [], "files": {}, "category": "custom CUDA", "evidence": {},
            "provenance": {}, **extra}


class Counting:
    def __init__(self, signature):
        self.calls, self.signature = 0, signature

    def __call__(self, inputs):
        self.calls += 1
        return run_chain(self.signature, inputs)


def _glu_cast(tmp_path, **extra):
    """The toy MLP's silu(gate) * up as a cast's pattern card with a counting plan; (cast, plan, mlp, x)."""
    sig = _glu_signature()
    plan = Counting(sig)
    cast = engine.cast.load(_cast(tmp_path, _variant(sig, pattern={}, **extra)), env=ENV, plans={"glu": plan})
    torch.manual_seed(3)
    torch._dynamo.reset()
    return cast, plan, MLP(32), torch.randn(2, 5, 32)


def test_a_pattern_card_runs_inside_the_compiled_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # compiled here, not cached
    cast, plan, mlp, x = _glu_cast(tmp_path)
    with torch.no_grad(), cast.enabled():
        want = mlp(x)
        fast = cast.compile(mlp)
        got = fast(x)
        again = fast(x)
    assert plan.calls == 2, "the compiled graph did not call the pattern card's plan"
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(again, want)
    st = cast.stats()
    assert st["patterns"] == {"glu": 2} and st["pattern_problems"] == {}
    # Matches counted in the graphs compiled in this process (a graph served from Inductor's cache is not)
    assert list(st["pattern_matches"].values()) == [1] and st["pattern_misses"] == {}
    assert cast.pattern_set().seconds > 0  # the pass's share of the compile, which bench_compose reports
    cast.remove()


def test_a_chain_variant_names_module_or_pattern(tmp_path):
    sig = _glu_signature()
    with pytest.raises(CastError, match="'module' entry .* or its 'pattern' entry"):
        cast_format.check_manifest({"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION,
                                    "env": ENV, "variants": [_variant(sig)]})


def test_a_graph_compiled_with_the_cast_calls_it_again_each_time_it_is_enabled(tmp_path):
    """Removing the cast took its pattern variants out of their ops' tables for good: a graph compiled in
    one `with cast.enabled()` block missed in every later one (the SD3.5 VAE's GroupNorm → SiLU cards: 0
    hits under torch.compile on the H200, where bench_compose and the export enable the cast per call)."""
    cast, plan, mlp, x = _glu_cast(tmp_path)
    with torch.no_grad():
        want = mlp(x)
        with cast.enabled():
            fast = cast.compile(mlp)
            fast(x)
        for _ in range(3):
            with cast.enabled():
                torch.testing.assert_close(fast(x), want)
        off = fast(x)  # the cast removed: the graph's op misses and computes what the graph would have
    torch.testing.assert_close(off, want)
    assert plan.calls == 4
    st = cast.stats()
    assert st["patterns"] == {"glu": 4}
    (why,) = st["pattern_misses"].values()
    assert why["misses"] == 1 and why["proven_for"] and why["calls_brought"] == why["proven_for"]


def test_a_pattern_not_proven_for_compile_leaves_inductor_its_own_code(tmp_path, monkeypatch):
    """A chain variant proven for eager only (a module card whose export found it slower under compile) is
    not put into compiled graphs: there its op would decline every call and run the chain eagerly, slower
    than Inductor's fused code (Gemma's module cards under torch.compile on the H200)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # compiled here, not cached
    cast, plan, mlp, x = _glu_cast(tmp_path, targets=["eager"])
    cast.pattern_set()
    cast.reset_stats()  # the op is shared by structure with the other tests' casts: count this test's calls
    with torch.no_grad(), cast.enabled():
        want = mlp(x)
        got = cast.compile(mlp)(x)
    torch.testing.assert_close(got, want)
    st = cast.stats()
    assert plan.calls == 0 and st["pattern_misses"] == {}
    assert sum(st["pattern_matches"].values()) == 0  # built, never put in a graph


class _GnSiluBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.conv = torch.nn.GroupNorm(4, 8), torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.nn.functional.silu(self.norm(x)))


def test_a_pattern_holding_an_op_the_cast_also_serves_alone_still_matches(tmp_path, monkeypatch):
    """A cast with a group_norm op variant keeps native_group_norm whole in the compiled graph (its veto);
    its GroupNorm -> SiLU pattern card, traced with GroupNorm decomposed, then matched nothing (the SD3.5
    VAE's casts have both kinds). The pattern is traced again under the veto and matches."""
    from test_cast_compile import CpuCast

    from engine.cast import compose

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(_GnSiluBlock(), _GnSiluBlock()).eval()
    x = torch.randn(2, 8, 4, 4)
    _, pats = _patterns(model, x)
    gn_silu = next(p for p in pats if _heavy_ops(p)[:2] == ["native_group_norm", "silu"])
    sig = chain_signature(gn_silu.instances[0])
    plan = Counting(sig)
    norm = model[0].norm
    owner = CpuCast("gn").install([x, norm.weight.detach(), norm.bias.detach(), 2, 8, 16, 4, 1e-5])
    try:
        backend = compose.backend(owner, patterns=[(sig, plan)])
        torch._dynamo.reset()
        with torch.no_grad():
            want = model(x)
            got = torch.compile(model, backend=backend)(x)
        torch.testing.assert_close(got, want)
        assert backend.vetoed == [(("aten.native_group_norm.default", (("cpu", "torch.float32"),)),)]
        assert sum(sum(m.values()) for m in backend.pattern_matches) == 2, backend.pattern_matches
        assert plan.calls == 2  # both blocks' GroupNorm -> SiLU ran as the card's one call
    finally:
        owner.remove()
        torch._dynamo.reset()


def _gn_silu_at_4_op_variant_at_6(*blocks):
    """A model of `blocks` on 2 x 8 x 4 x 4 inputs, its GroupNorm -> SiLU chain signature, and a CPU cast
    with one group_norm op variant, for 6 x 6 images: (model, x, signature, cast)."""
    from test_cast_compile import CpuCast

    torch.manual_seed(0)
    model = torch.nn.Sequential(*blocks).eval()
    x = torch.randn(2, 8, 4, 4)
    _, pats = _patterns(model, x)
    gn_silu = next(p for p in pats if _heavy_ops(p)[:2] == ["native_group_norm", "silu"])
    norm = model[0].norm
    owner = CpuCast("gn6").install([torch.randn(2, 8, 6, 6), norm.weight.detach(), norm.bias.detach(),
                                    2, 8, 36, 4, 1e-5])
    return model, x, chain_signature(gn_silu.instances[0]), owner


def test_an_op_kept_for_a_pattern_card_of_a_size_no_op_variant_has(tmp_path, monkeypatch):
    """Under static shapes the veto keeps an op whole only for the sizes its op variants serve. The op variant
    here is for 6 x 6 images, the GroupNorm -> SiLU card for 4 x 4: GroupNorm is decomposed at 4 x 4 and the
    pattern, traced under the same veto, matches the decomposition; with no pattern card, a size nobody
    serves is decomposed by Inductor instead of running PyTorch's kernel through a guard miss."""
    from test_cast_compile import ROUTE

    from engine.cast import compose, runtime

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x, sig, owner = _gn_silu_at_4_op_variant_at_6(_GnSiluBlock(), _GnSiluBlock())
    try:
        for patterns, matches in (([(sig, Counting(sig))], 2), (None, 0)):
            backend = compose.backend(owner, patterns=patterns)
            torch._dynamo.reset()
            with torch.no_grad():
                want = model(x)  # eager: two guard misses
                misses = runtime.routes()[ROUTE].misses
                got = torch.compile(model, backend=backend, dynamic=False)(x)
            torch.testing.assert_close(got, want)
            assert sum(sum(m.values()) for m in backend.pattern_matches) == matches, backend.pattern_matches
            assert patterns is not None or runtime.routes()[ROUTE].misses == misses  # no GroupNorm left in it
            assert owner.hits == 0
            if patterns is not None:
                assert patterns[0][1].calls == 2
    finally:
        owner.remove()
        torch._dynamo.reset()


class _LoneNorm(torch.nn.Module):
    """A GroupNorm no SiLU follows (the VAE's attention norm): the GroupNorm -> SiLU pattern never matches it."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, 8)

    def forward(self, x):
        return self.norm(x) * 2


def test_a_size_only_a_pattern_card_has_is_left_to_inductor_where_the_pattern_does_not_match(tmp_path, monkeypatch):
    """The op variant is for 6 x 6, the GroupNorm -> SiLU card for 4 x 4, and the model also has a GroupNorm at
    4 x 4 that no SiLU follows. Kept whole at 4 x 4 for the pattern's sake, that lone GroupNorm could only miss
    the guard and run PyTorch's kernel inside the compiled graph (on the GPU, 10-20x slower than Inductor's
    code). A size only pattern cards have is decomposed like any other: the pattern, traced under the same veto,
    matches the decomposed chain, and the lone GroupNorm is Inductor's."""
    from test_cast_compile import ROUTE

    from engine.cast import compose, runtime

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, x, sig, owner = _gn_silu_at_4_op_variant_at_6(_GnSiluBlock(), _LoneNorm(), _GnSiluBlock())
    plan = Counting(sig)
    try:
        backend = compose.backend(owner, patterns=[(sig, plan)])
        torch._dynamo.reset()
        with torch.no_grad():
            want = model(x)
            misses = runtime.routes()[ROUTE].misses
            got = torch.compile(model, backend=backend, dynamic=False)(x)
        torch.testing.assert_close(got, want)
        assert sum(sum(m.values()) for m in backend.pattern_matches) == 2, backend.pattern_matches
        assert plan.calls == 2  # both GroupNorm -> SiLU ran the card's variant
        # The counting plan computes with eager ops, its GroupNorm a guard miss each; any other miss is a
        # GroupNorm the compiled graph kept whole (before the fix: the lone one, once per forward).
        assert runtime.routes()[ROUTE].misses - misses == plan.calls, "a GroupNorm was kept whole and missed"
        assert owner.hits == 0
    finally:
        owner.remove()
        torch._dynamo.reset()
