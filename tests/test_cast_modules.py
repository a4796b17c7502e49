"""Module cards in eager (engine.cast.modules) on the CPU: a cast whose module card is the toy model's
RMSNorm, with a Python plan that counts its calls and computes with run_chain (so results are exact).
A proven call runs the plan; anything else (another shape, grad, hooks, a changed parameter, autocast)
runs the module's own forward; removing the cast leaves the model exactly as it was."""

from __future__ import annotations

import functools
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
from test_chains import Model, _patterns

import engine.cast
from engine.capture.chains import CHAIN_OP, chain_signature, run_chain
from engine.cast import format as cast_format
from engine.cast import modules
from engine.cast.format import CastError, CastWarning, write_cast

ENV = {"torch": torch.__version__, "torch_minor": ".".join(torch.__version__.split(".")[:2]), "cuda": "13.0",
       "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0], "driver": "13.0", "nvrtc": "13.0"}
PATHS = [f"layers.{i}.norm1" for i in range(3)]
X = (2, 5, 32)


@functools.cache
def norm_signature():
    """The RMS module card's chain signature (traced on first use: at import it cost each xdist worker ~3 s of
    collection)."""
    torch.manual_seed(0)
    model = Model().to(torch.bfloat16)
    _, pats = _patterns(model, torch.randn(*X, dtype=torch.bfloat16))
    norm = next(p for p in pats if p.kind == "module")
    return chain_signature(norm.instances[0])


def _variant(vid="rms", paths=PATHS, signature=None, module=None):
    return {"id": vid, "op": CHAIN_OP, "signature": norm_signature() if signature is None else signature, "signature_text": "rms chain",
            "outputs": [], "launch_spec": "", "kernels": [], "files": {}, "category": "custom CUDA",
            "evidence": {}, "provenance": {},
            "module": module or {"class": "RMS", "paths": list(paths), "args": [{"input": 0}],
                                 "params": [{"name": "weight", "input": 1}]}}


def _write(tmp_path, name="m.cast", variants=None):
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": variants or [_variant()]}
    path = tmp_path / name
    write_cast(path, manifest, {}, "# test\n")
    return path


class Counting:
    """A module card's plan: counts its calls, computes what the chain computes (eager, exact)."""

    def __init__(self, signature=None):
        self.calls = 0
        self.signature = norm_signature() if signature is None else signature

    def __call__(self, inputs):
        self.calls += 1
        return run_chain(self.signature, inputs)


@pytest.fixture
def model():
    torch.manual_seed(1)
    m = Model().to(torch.bfloat16)
    with torch.no_grad():
        for layer in m.layers:
            layer.norm1.weight.normal_()
    return m


@pytest.fixture
def cast(tmp_path):
    made = []

    def make(name="m.cast", variants=None, plans=None):
        plan = Counting()
        path = _write(tmp_path, name, variants)
        c = engine.cast.load(path, env=ENV, plans=plans or {"rms": plan})
        c.counting = plan
        made.append(c)
        return c

    yield make
    for c in made:
        c.remove()


def _eager(model, *x):
    with torch.no_grad():
        return model(*x)


def test_chain_op_is_the_captures():
    assert cast_format.CHAIN_OP == CHAIN_OP


def test_proven_signature_runs_the_plan_exactly(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    expected = _eager(model, x)
    c = cast()
    with c.enabled(model), torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert c.counting.calls == 3
    st = c.stats()
    assert {p: st["modules"][p]["hits"] for p in PATHS} == {p: 1 for p in PATHS}
    assert st["variants"][0]["hits"] == 3 and st["variants"][0]["id"] == "rms"


def test_another_shape_runs_the_original_forward(model, cast):
    x = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    expected = _eager(model, x)
    c = cast()
    with c.enabled(model), torch.no_grad():
        out = model(x)
        out_f32 = model.layers[0].norm1(x.float())  # another dtype: a miss too
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out_f32.dtype == torch.float32
    assert c.counting.calls == 0
    assert c.stats()["modules"]["layers.0.norm1"]["misses"] == 2
    with c.enabled(model), torch.no_grad():  # a keyword argument, or a non-contiguous input: misses
        model.layers[0].norm1(x=torch.randn(*X, dtype=torch.bfloat16))
        model.layers[0].norm1(torch.randn(2, 32, 5, dtype=torch.bfloat16).transpose(1, 2))
    assert c.counting.calls == 0


def test_grad_declines_and_backward_works(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    with c.enabled(model):
        out = model(x)
        out.float().sum().backward()
    assert c.counting.calls == 0 and out.grad_fn is not None
    assert model.layers[0].norm1.weight.grad is not None
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"grad": 1}


def test_hooks_decline(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    seen = []
    c = cast()
    with c.enabled(model), torch.no_grad():
        h = model.layers[0].norm1.register_forward_hook(lambda m, a, o: seen.append(o))
        model(x)
        h.remove()
        assert c.counting.calls == 2 and len(seen) == 1  # the hooked module ran its own forward
        g = nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
        try:
            model(x)
        finally:
            g.remove()
        assert c.counting.calls == 2
        model(x)
    assert c.counting.calls == 5
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"hooks": 2}


def test_hooks_registered_after_calls_served_are_seen(model, cast):
    """The hook check skips its walk over the tree while no hook has been registered since it last found none
    (modules.HookWatch): a hook registered on a submodule after calls were served must still be seen."""
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    with c.enabled(model), torch.no_grad():
        model(x)
        model(x)
        assert c.counting.calls == 6   # three norms a forward
        h = model.layers[0].norm1.register_forward_pre_hook(lambda m, a: None)
        model(x)
        model(x)
        assert c.counting.calls == 10   # both calls declined there; the other norms still served
        h.remove()
        model(x)
    assert c.counting.calls == 13
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"hooks": 2}


def test_hook_watch_walks_only_after_a_registration(monkeypatch):
    tree = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    watch = modules.HookWatch(tree.modules())
    walks = []
    real = modules.hooks_on
    monkeypatch.setattr(modules, "hooks_on", lambda hooked: walks.append(1) or real(hooked))
    assert not watch() and not watch() and len(walks) == 1
    h = tree[1].register_forward_hook(lambda m, a, o: None)
    assert watch() and watch() and len(walks) == 3   # hooks present: looked at every call
    h.remove()
    assert not watch() and not watch() and len(walks) == 4
    torch.zeros(1, requires_grad=True).register_hook(lambda g: g)   # any registration anywhere: one walk
    assert not watch() and len(walks) == 5
    g = nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        assert watch()
    finally:
        g.remove()
    assert not watch()


def test_changed_parameter_declines(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    norm = model.layers[0].norm1
    with c.enabled(model), torch.no_grad():
        norm.weight.add_(1)  # in place: _version moves
        out = model(x)
        assert c.counting.calls == 2
        model.layers[1].norm1.weight = nn.Parameter(torch.ones(32, dtype=torch.bfloat16))  # replaced
        out = model(x)
        assert c.counting.calls == 3
    torch.testing.assert_close(out, _eager(model, x), rtol=0, atol=0)  # the new weights were used
    declines = c.stats()["modules"]
    assert declines["layers.0.norm1"]["declines"] == {"parameters changed": 2}
    assert declines["layers.1.norm1"]["declines"] == {"parameters changed": 1}


def test_autocast_declines(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    with c.enabled(model), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert c.counting.calls == 0
    assert c.stats()["modules"]["layers.2.norm1"]["declines"] == {"autocast": 1}


def test_removal_restores_forward_and_the_tree_is_untouched(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    tree = [(n, m) for n, m in model.named_modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = {n: dict(m.__dict__) for n, m in tree}
    own = {type(m): type(m).__dict__.get("forward") for _, m in tree}  # each class's own forward, or None
    c = cast()
    c.install(model)
    try:
        norm = model.layers[0].norm1
        assert isinstance(modules.route_of(norm), modules.ModuleRoute) and "forward" not in norm.__dict__
        assert type(norm).forward is not own[type(norm)]  # the class's dispatcher while a route is attached
        assert [(n, m) for n, m in model.named_modules()] == tree
        sd = model.state_dict()
        assert list(sd) == list(state) and all(torch.equal(sd[k], state[k]) for k in state)
        with torch.no_grad():
            model(x)
        assert c.counting.calls == 3
    finally:
        c.remove()
    for n, m in model.named_modules():
        assert "forward" not in m.__dict__ and modules.route_of(m) is None
        assert m.forward.__func__ is type(m).forward
        assert type(m).__dict__.get("forward") is own[type(m)]  # the class's own forward back, or none again
        assert m.__dict__.keys() == attrs[n].keys()
    assert [(n, m) for n, m in model.named_modules()] == tree
    with torch.no_grad():
        model(x)
    assert c.counting.calls == 3  # removed: the plan no longer runs
    assert c.stats()["modules"]["layers.0.norm1"]["hits"] == 1  # counters outlive the install


def test_an_instance_forward_of_other_code_is_kept(model, cast):
    norm = model.layers[0].norm1
    own = norm.forward  # a bound method stored on the instance, as wrapping libraries do
    norm.forward = own
    c = cast()
    with pytest.warns(CastWarning, match="layers.0.norm1 .the instance has its own forward"):
        c.install(model)
    c.remove()
    assert norm.__dict__["forward"] is own


def test_two_casts_cannot_claim_one_module(model, cast, recwarn):
    x = torch.randn(*X, dtype=torch.bfloat16)
    a, b = cast("a.cast"), cast("b.cast")
    a.install(model)
    with pytest.warns(CastWarning, match="3 module path.*claimed by another installed cast"):
        b.install(model)
    with torch.no_grad():
        model(x)
    assert a.counting.calls == 3 and b.counting.calls == 0
    b.remove()  # b never patched anything: a keeps its modules
    with torch.no_grad():
        model(x)
    assert a.counting.calls == 6
    a.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_paths_that_do_not_fit_are_skipped_with_one_warning(model, cast):
    c = cast(variants=[_variant(paths=["layers.0.norm1", "layers.9.norm1", "layers.0.attn"])])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c.install(model)
    lines = [str(x.message) for x in w if issubclass(x.category, CastWarning)]
    assert len(lines) == 1 and "2 module path(s)" in lines[0]
    assert "layers.9.norm1 (no such module)" in lines[0] and "layers.0.attn (a Linear, not RMS)" in lines[0]
    assert list(c.stats()["modules"]) == ["layers.0.norm1"]


def test_many_paths_the_model_lacks_are_counted_not_listed(model, cast):
    # A cast of a whole pipeline loaded into one of its parts (SD3.5's cast on the VAE alone): one short line.
    absent = [f"transformer.blocks.{i}.norm" for i in range(14)]
    c = cast(variants=[_variant(paths=["layers.0.norm1", "layers.0.attn", *absent])])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c.install(model)
    (line,) = [str(x.message) for x in w if issubclass(x.category, CastWarning)]
    assert "15 module path(s) stay on PyTorch: 14 not in this model (transformer.blocks.0.norm, " in line
    assert "transformer.blocks.13" not in line and "layers.0.attn (a Linear, not RMS)" in line


def test_chain_with_two_outputs_is_declined_at_install(model, cast):
    _, pats = _patterns(model, torch.randn(*X, dtype=torch.bfloat16))
    add_norm = next(p for p in pats if len(p.instances[0].outputs) == 2)
    sig = chain_signature(add_norm.instances[0])
    v = _variant(signature=sig, paths=["layers.0"],
                 module={"class": "Layer", "paths": ["layers.0"], "args": [{"input": 0}], "params": []})
    c = cast(variants=[v])
    with pytest.warns(CastWarning, match="2 outputs; a module card needs exactly one"):
        c.install(model)
    assert c.stats()["modules"] == {}


def test_without_a_model_module_cards_stay_off(model, cast):
    c = cast()
    with c.enabled(), torch.no_grad():
        model(torch.randn(*X, dtype=torch.bfloat16))
        assert c.stats()["variants"][0]["active"] is False
    assert c.counting.calls == 0 and c.stats()["modules"] == {}
    with c.enabled(model):
        assert c.stats()["variants"][0]["active"] is True


def test_binding_by_identity(model):
    norm = model.layers[0].norm1
    x = torch.randn(*X, dtype=torch.bfloat16)
    assert modules.module_binding(norm, (x,), [x, norm.weight]) == {
        "args": [{"input": 0}], "params": [{"name": "weight", "input": 1}]}


def test_a_chain_variant_needs_its_module_entry(tmp_path):
    bad = _variant()
    del bad["module"]
    with pytest.raises(CastError, match="lacks its 'module' entry"):
        _write(tmp_path, variants=[bad])
    bad = _variant(module={"class": "RMS", "paths": []})
    with pytest.raises(CastError, match="'paths'"):
        _write(tmp_path, variants=[bad])


def test_a_capture_sees_the_modules_own_calls(model, cast):
    from engine.capture.chains import trace_forward

    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    with c.enabled(model):
        trace = trace_forward(model, lambda: model(x))
    assert c.counting.calls == 0  # the dispatch mode was active: every module ran its own forward
    assert sum(call.op == "aten::rsqrt" for call in trace.calls) == 6


def test_under_torch_compile_the_module_card_is_a_pattern(model, cast):
    """Inside a compiled graph the patched forward steps aside (Dynamo traces the module's own code), so
    a module card must also be replaced as a pattern there, or a cast exported for `compile` would carry
    module cards that never run. The RMS chain has the same op graph in norm1 and norm2 of every layer."""
    x = torch.randn(*X, dtype=torch.bfloat16)
    expected = _eager(model, x)
    c = cast()
    torch._dynamo.reset()
    with torch.no_grad(), c.enabled(model):
        fast = c.compile(model)
        got = fast(x)
    assert c.counting.calls == 6, "the compiled graph did not call the module card's plan"
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=5e-2)  # Inductor's bf16 rounds elsewhere than eager
    st = c.stats()
    assert st["patterns"] == {"rms": 6} and st["pattern_problems"] == {}
    assert all(st["modules"][p]["hits"] == 0 for p in PATHS)  # eager routes stayed out of the trace


class _NormTwice(nn.Module):
    """One RMSNorm on the card's sizes and on others: the chain's op graph twice in one compiled graph."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x, wide):
        return self.norm(x), self.norm(wide)


def _norm_at_two_sizes(model, cast, other_shape, dynamic_batch=False):
    """One RMSNorm at the card's sizes and at `other_shape`, compiled through a fresh cast (its pattern op's
    counts reset: the op is shared by structure with the other tests' casts); (cast, module, x, other)."""
    x, other = torch.randn(*X, dtype=torch.bfloat16), torch.randn(*other_shape, dtype=torch.bfloat16)
    twice = _NormTwice(model.layers[0].norm1)
    want = _eager(twice, x, other)
    c = cast()
    c.pattern_set()
    c.reset_stats()
    torch._dynamo.reset()
    if dynamic_batch:
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(other, 0)
    with torch.no_grad(), c.enabled(model):
        got = c.compile(twice, dynamic=None if dynamic_batch else False)(x, other)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=5e-2)  # Inductor's bf16 rounds elsewhere than eager
    return c, twice, x, other


def test_a_match_of_sizes_no_variant_has_keeps_inductors_code(model, cast, tmp_path, monkeypatch):
    """A chain's op graph recurs at other sizes (Gemma's RMSNorm: its q/k norms and its hidden-state norms).
    A match no variant can serve ran the chain eagerly on every call instead of Inductor's fused code: Gemma
    under torch.compile with one chain variant (2 of 28 matches its sizes) ran at 0.24x of torch.compile
    alone on the H200. Only the card's sizes become its op; the other match is counted, left to Inductor."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # compiled here, not cached
    c, twice, x, wide = _norm_at_two_sizes(model, cast, (4, 5, 32))
    st = c.stats()
    assert c.counting.calls == 1, "the card's own sizes no longer reach its plan"
    assert sum(st["pattern_matches"].values()) == 1
    (why,) = st["pattern_misses"].values()
    assert why["misses"] == 0, f"a match of other sizes was replaced and missed at run time: {why}"
    assert why["size_declines"] == 1
    # Another cast's variant for the other sizes, in the op's shared table, does not change what this cast's
    # compile replaces: a graph gets what its cache key (this cast's patterns) names.
    import copy

    wide_sig = copy.deepcopy(norm_signature())
    wide_sig["args"][0].update(shape=[4, 5, 32], stride=[160, 32, 1])
    wide_plan = Counting(wide_sig)
    other = cast("other.cast", variants=[_variant("rms_w", signature=wide_sig)], plans={"rms_w": wide_plan})
    other.pattern_set()
    c.reset_stats()
    torch._dynamo.reset()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-2"))  # compiled again, not served
    with torch.no_grad(), c.enabled(model):
        c.compile(twice, dynamic=False)(x, wide)
    assert c.counting.calls == 2 and wide_plan.calls == 0


def test_a_symbolic_size_is_left_to_the_guard_but_a_concrete_one_that_differs_is_not(model, cast, tmp_path,
                                                                                    monkeypatch):
    """With the batch dim dynamic, the norm of [s0, 5, 32] can have the card's sizes (the runtime guard decides
    per call) but that of [s0, 7, 32] cannot: its concrete 7 differs from every variant's 5, so it keeps
    Inductor's code rather than a pattern op that would miss every call."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # compiled here, not cached
    c, *_ = _norm_at_two_sizes(model, cast, (2, 7, 32), dynamic_batch=True)
    st = c.stats()
    assert c.counting.calls == 1 and sum(st["pattern_matches"].values()) == 1
    (why,) = st["pattern_misses"].values()
    assert why["misses"] == 0 and why["size_declines"] == 1


# ---------------------------------------------------------------------- instances the capture did not see


def _proven_on_layer0(model, **extra):
    from engine.capture.module_binding import module_state

    norm = model.layers[0].norm1
    cls = type(norm)
    return _variant(paths=["layers.0.norm1"], module={
        "class": "RMS", "class_path": f"{cls.__module__}.{cls.__qualname__}", "paths": ["layers.0.norm1"],
        "args": [{"input": 0}], "params": [{"name": "weight", "input": 1}], "states": [module_state(norm)], **extra})


def test_a_card_proven_on_one_instance_serves_the_others_alike(model, cast):
    # A model captured shrunk (one layer) and run at its real depth: the other norms are the same class with
    # the same attributes and tensors, so the card serves them too (every layer's norm1 and norm2), exactly.
    x = torch.randn(*X, dtype=torch.bfloat16)
    want = _eager(model, x)
    c = cast(variants=[_proven_on_layer0(model)])
    with c.enabled(model):
        got = _eager(model, x)
    assert torch.equal(got, want)
    assert sorted(c.stats()["modules"]) == sorted(f"layers.{i}.norm{j}" for i in range(3) for j in (1, 2))
    assert c.counting.calls == 6


def test_an_instance_with_other_attributes_is_not_served(model, cast):
    model.layers[2].norm1.eps = 1e-5  # an attribute the proven instance does not have: maybe another forward
    c = cast(variants=[_proven_on_layer0(model)])
    c.install(model)
    assert "layers.2.norm1" not in c.stats()["modules"] and "layers.1.norm1" in c.stats()["modules"]


def test_a_card_without_states_serves_only_its_paths(model, cast):
    variant = _proven_on_layer0(model)
    del variant["module"]["states"]
    c = cast(variants=[variant])
    c.install(model)
    assert list(c.stats()["modules"]) == ["layers.0.norm1"]


def test_an_instance_with_an_opaque_attribute_is_not_served(model, cast):
    from engine.capture.module_binding import module_state

    model.layers[1].norm1.helper = lambda t: t  # not a plain value: cannot be compared
    assert module_state(model.layers[1].norm1) is None
    c = cast(variants=[_proven_on_layer0(model)])
    c.install(model)
    assert "layers.1.norm1" not in c.stats()["modules"] and "layers.2.norm1" in c.stats()["modules"]


def test_a_proven_path_whose_module_is_configured_otherwise_stays_on_pytorch(model, cast):
    # The cast's kernel bakes in what the proof's module did (its eps…): the same path in a model built with
    # another setting is not the card's, and the warning says which attribute differs.
    variant = _proven_on_layer0(model)
    model.layers[0].norm1.eps = 1e-5
    c = cast(variants=[variant])
    with pytest.warns(CastWarning, match=r"layers\.0\.norm1 \(rms: its attributes differ .*eps 1e-05 \(proven"):
        c.install(model)
    assert "layers.0.norm1" not in c.stats()["modules"]


def test_an_attribute_changed_after_install_declines(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    for layer in model.layers:
        layer.norm1.eps = layer.norm2.eps = 1e-6  # a plain attribute, as RMSNorms hold (this one unread)
    c = cast(variants=[_proven_on_layer0(model)])
    with c.enabled(model):
        model.layers[1].norm2.eps = 1e-3  # set after install: the next call is not the proof's module any more
        got = _eager(model, x)
    assert torch.equal(got, _eager(model, x))
    assert c.counting.calls == 5
    assert c.stats()["modules"]["layers.1.norm2"]["declines"] == {"attributes changed": 1}


def test_a_list_attribute_changed_in_place_after_install_declines(model, cast):
    x = torch.randn(*X, dtype=torch.bfloat16)
    for layer in model.layers:
        layer.norm1.window = [4, 4]  # a list attribute, as some modules hold (unread here)
        layer.norm2.window = [4, 4]
    c = cast(variants=[_proven_on_layer0(model)])
    with c.enabled(model):
        model.layers[1].norm2.window[0] = 8  # the same list object, changed in place
        got = _eager(model, x)
    assert torch.equal(got, _eager(model, x))
    assert c.stats()["modules"]["layers.1.norm2"]["declines"] == {"attributes changed": 1}


def test_a_module_level_value_the_forward_reads_is_guarded(model, cast, monkeypatch):
    """A value in the module's file that its forward reads (a flag it branches on) is not in its arguments or
    attributes: the route holds it as at install, and a call after it changed runs the original forward."""
    import sys

    x = torch.randn(*X, dtype=torch.bfloat16)
    mod = sys.modules[type(model.layers[0].norm1).__module__]
    monkeypatch.setattr(mod, "rsqrt", 1, raising=False)  # a module-level value under a name its code reads
    assert (mod.__dict__, "rsqrt") in modules.forward_globals([type(model.layers[0].norm1)])
    c = cast()
    with c.enabled(model):
        _eager(model, x)
        calls = c.counting.calls
        monkeypatch.setattr(mod, "rsqrt", 2)
        _eager(model, x)
    assert calls and c.counting.calls == calls
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"globals changed": 1}


def test_training_mode_declines(model, cast):
    # Captures run in eval; a forward may take another path in training mode (dropout…), so the card's
    # proof does not cover it, grad or not.
    x = torch.randn(*X, dtype=torch.bfloat16)
    model.eval()
    c = cast(variants=[_proven_on_layer0(model, training=False)])
    model.train()
    with c.enabled(model):
        got = _eager(model, x)
    assert c.counting.calls == 0 and torch.equal(got, _eager(model, x))
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"training mode": 1}
    model.eval()
    with c.enabled(model):
        _eager(model, x)
    assert c.counting.calls == 6


def test_transformers_bookkeeping_flag_does_not_decide_what_is_served(model, cast):
    # A model built from random weights carries `_is_hf_initialized` on its modules, one loaded from a
    # checkpoint may not; casts written before the flag was ignored hold it in their states.
    old = _proven_on_layer0(model)
    old["module"]["states"] = [{**s, "_is_hf_initialized": True} for s in old["module"]["states"]]
    model.layers[2].norm2._is_hf_initialized = False
    c = cast(variants=[old])
    c.install(model)
    assert sorted(c.stats()["modules"]) == sorted(f"layers.{i}.norm{j}" for i in range(3) for j in (1, 2))


# ---------------------------------------------------------------------- enabling a cast around compiled calls


def test_enabling_the_cast_around_each_compiled_call_does_not_recompile(model, cast):
    """Dynamo guards on the object in a patched module's `forward`. A new route at every install made each
    `with cast.enabled(model)` invalidate the compiled graph; after 8 recompiles Dynamo ran the forward
    uncompiled (Gemma under torch.compile + cast: 0.52x of torch.compile alone on the H200). One route per
    module and cast, reused at every install, keeps one graph per state."""
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    fast = torch.compile(model, backend=backend)
    with torch.no_grad():
        expected = model(x)
        for _ in range(12):
            with c.enabled(model):
                got = fast(x)
            plain = fast(x)
    assert len(graphs) == 2, f"{len(graphs)} compiles for two states (cast on, cast off)"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(plain, expected, rtol=0, atol=0)
    torch._dynamo.reset()


def test_routes_kept_for_reuse_hold_neither_the_model_nor_the_cast(tmp_path):
    import gc
    import weakref

    path = _write(tmp_path)

    def fresh():
        torch.manual_seed(1)
        return Model().to(torch.bfloat16), engine.cast.load(path, env=ENV, plans={"rms": Counting()})

    m, c = fresh()
    with c.enabled(m):
        pass
    assert modules._ROUTES.get(m.layers[0].norm1), "no route kept for the next install"
    gone = weakref.ref(m.layers[0].norm1)
    del m
    gc.collect()
    assert gone() is None, "a route kept for reuse holds its module alive"

    m, c = fresh()
    with c.enabled(m):
        pass
    gone = weakref.ref(c)
    del c
    gc.collect()
    assert gone() is None, "a route kept for reuse holds its cast alive"
    assert all(r.owner is None for r in modules._ROUTES.get(m.layers[0].norm1, []))


def test_the_model_check_names_the_variants_that_never_ran_in_the_forward(model, cast):
    """export's whole-model check records, per variant set, what ran in one forward: a set no faster than a
    smaller one often holds variants whose guard never matched (here: proven for a shape the model never
    runs), and the check's summary says which instead of leaving it to guesswork."""
    import copy

    from engine.export.e2e import ran_in_forward
    from engine.export.package import tried_summary

    wide = copy.deepcopy(norm_signature())
    wide["args"][0].update(shape=[2, 7, 32], stride=[224, 32, 1])
    c = cast(variants=[_variant(), _variant("rms_7", signature=wide)],
             plans={"rms": Counting(), "rms_7": Counting(wide)})
    with c.enabled(model), torch.no_grad():
        c.reset_stats()
        model(torch.randn(*X, dtype=torch.bfloat16))
    ran = ran_in_forward(c.stats(), ["rms", "rms_7"])
    assert ran == {"hits_per_forward": {"rms": 3}, "never_ran": ["rms_7"]}
    line = tried_summary({"variants": ["rms", "rms_7"], "speedup": 1.02, "speedup_ci": [1.01, 1.03], **ran})
    assert line == "2 variant(s): 1.020x (95% CI 1.010-1.030); 1 never ran in the forward (rms_7)"
    # Under reduce-overhead only the warm-up and the capture run Python (a replay counts no hit): the check
    # counts over those calls, per forward, and says so; Gemma's chain variants were reported as never run.
    with c.enabled(model), torch.no_grad():
        c.reset_stats()
        for _ in range(2):
            model(torch.randn(*X, dtype=torch.bfloat16))
    ran = ran_in_forward(c.stats(), ["rms", "rms_7"], forwards=2)
    assert ran["hits_per_forward"] == {"rms": 3} and ran["never_ran"] == ["rms_7"]
    assert "replays run none" in ran["hits_counted_over"]


def test_a_model_built_under_inference_mode_is_served(cast):
    """Its parameters are inference tensors, which keep no version counter: binding read `_version` and
    `cast.enabled(model)` raised."""
    with torch.inference_mode():
        torch.manual_seed(1)
        m = Model().to(torch.bfloat16)
        x = torch.randn(*X, dtype=torch.bfloat16)
        want = m(x)
    c = cast()
    with torch.inference_mode(), c.enabled(m):
        got = m(x)
    assert c.counting.calls == len(PATHS) and torch.equal(got, want)


def test_under_torch_compile_nothing_of_an_installed_route_is_guarded(model, cast):
    """An eager-only cast installed while the user runs torch.compile ran Gemma 4 at 0.986x of compile alone
    on the H200: Dynamo guarded every module whose instance `forward` was our route, at every call (about 1 us
    each; scripts/probe_route_guards.py). Hooked in through the class's dispatcher, Dynamo traces the class's
    own forward and guards nothing of the route."""
    import logging

    x = torch.randn(*X, dtype=torch.bfloat16)
    texts = []

    class Keep(logging.Handler):
        def emit(self, record):
            texts.append(record.getMessage())

    log = logging.getLogger("torch._dynamo.guards")
    keep = Keep()
    torch._logging.set_logs(guards=True)
    log.addHandler(keep)
    c = cast()
    try:
        torch._dynamo.reset()
        with torch.no_grad(), c.enabled(model):
            expected = model(x)
            assert c.counting.calls == 3
            got = torch.compile(model, backend="eager")(x)
    finally:
        log.removeHandler(keep)
        torch._logging.set_logs()
        torch._dynamo.reset()
    guards = "\n".join(texts)
    assert "norm1" in guards  # the modules are guarded as any module is
    assert "ModuleRoute" not in guards and modules.ROUTE_ATTR not in guards
    assert c.counting.calls == 3  # the compiled model ran the class's forward, traced
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _Route:
    def __init__(self, module, calls):
        self.cls, self.calls, self.module = type(module), calls, weakref.ref(module)

    def __call__(self, x):
        self.calls.append(self.cls.__name__)
        return x * 0


def test_a_route_serves_only_instances_of_its_own_class_and_each_class_gets_its_forward_back():
    class Base(nn.Module):
        def forward(self, x):
            return x + 1

    class Sub(Base):  # its own forward calls the parent's: that must reach Base's forward, not Sub's route
        def forward(self, x):
            return super().forward(x) * 2

    class Heir(Base):  # inherits Base's forward
        pass

    own = Base.__dict__["forward"], Sub.__dict__["forward"]
    x = torch.ones(2)
    calls = []
    b1, b2, s, h = Base(), Base(), Sub(), Heir()
    routes = {m: _Route(m, calls) for m in (b1, s, h)}
    for m, r in routes.items():
        assert modules.attach(m, r) is None
    assert modules.attach(b1, _Route(b1, calls)) == "another route is attached"
    assert torch.equal(b1(x), x * 0) and torch.equal(s(x), x * 0) and torch.equal(h(x), x * 0)
    assert calls == ["Base", "Sub", "Heir"]
    assert torch.equal(b2(x), x + 1)  # no route: the class's forward
    assert torch.equal(modules.class_forward(Sub)(s, x), (x + 1) * 2) and calls == ["Base", "Sub", "Heir"]
    assert "forward" in Heir.__dict__  # the dispatcher is put on the instance's own class

    modules.detach(h, routes[h])
    assert "forward" not in Heir.__dict__ and torch.equal(h(x), x + 1)
    modules.detach(s, routes[s])
    assert Sub.__dict__["forward"] is own[1]
    assert modules.detach(b1, _Route(b1, calls)) is False  # not the one attached: left in place
    assert Base.__dict__["forward"] is not own[0]
    modules.detach(b1, routes[b1])
    assert Base.__dict__["forward"] is own[0] and torch.equal(b1(x), x + 1)
    assert not any(modules.ROUTE_ATTR in m.__dict__ for m in (b1, b2, s, h))


def test_a_class_whose_forward_cannot_be_replaced_is_not_routed_and_says_why():
    class Frozen(type):
        def __setattr__(cls, name, value):
            raise TypeError(f"{cls.__name__} is frozen")

    class Locked(nn.Module, metaclass=type("FrozenModuleMeta", (Frozen, type(nn.Module)), {})):
        def forward(self, x):
            return x + 1

    m = Locked()
    why = modules.attach(m, _Route(m, []))
    assert why == "its class's forward cannot be replaced (TypeError: Locked is frozen)"
    assert modules.route_of(m) is None and torch.equal(m(torch.ones(1)), torch.full((1,), 2.0))


def test_a_module_collected_with_its_route_attached_gives_its_class_its_forward_back():
    import gc

    class Dropped(nn.Module):
        def forward(self, x):
            return x + 1

    own = Dropped.__dict__["forward"]
    kept, dropped = Dropped(), Dropped()
    modules.attach(kept, _Route(kept, []))
    modules.attach(dropped, _Route(dropped, []))
    del dropped
    gc.collect()
    assert Dropped.__dict__["forward"] is not own  # one instance still holds a route
    modules.detach(kept, modules.route_of(kept))
    assert Dropped.__dict__["forward"] is own
    again = Dropped()
    modules.attach(again, _Route(again, []))
    del again  # the last one goes without a detach
    gc.collect()
    assert Dropped.__dict__["forward"] is own


def test_hook_watch_walks_every_time_without_the_handle_counter(monkeypatch):
    tree = nn.Sequential(nn.Linear(2, 2))
    watch = modules.HookWatch(tree.modules())
    monkeypatch.delattr(torch.utils.hooks.RemovableHandle, "next_id")
    assert not watch() and not watch()
    tree[0]._forward_hooks[0] = lambda m, a, o: None   # as a torch with no counter would register it
    assert watch()


def test_a_copy_of_the_model_made_while_installed_computes_with_its_own_weights(model, cast):
    """A deep copy (an EMA twin, a model forked for fine-tuning) made while the cast was installed copied the
    route in each module's __dict__, and the copied route called the original module's forward: the copy
    computed with the original's weights, also after the cast was removed and installed again. A shallow copy
    shares the route object itself. The copies now run their class's own forward, and pickling works."""
    import copy
    import pickle

    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    with c.enabled(model), torch.no_grad():
        twin, shallow = copy.deepcopy(model), copy.copy(model.layers[0].norm1)
        blob = pickle.dumps(model)
        for layer in twin.layers:
            layer.norm1.weight.add_(1)
        got = twin(x)
        shallow._parameters = dict(shallow._parameters)  # its own table, then its own parameter
        shallow.weight = nn.Parameter(shallow.weight + 1)
        got_shallow = shallow(x)
    want = _eager(twin, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_shallow, _eager(shallow, x), rtol=0, atol=0)
    with c.enabled(model), torch.no_grad():  # installed again: the copy still runs its own forward
        torch.testing.assert_close(twin(x), want, rtol=0, atol=0)
        assert modules.route_of(twin.layers[0].norm1) is None
        assert c.install(twin).stats()["modules"]  # and the copy can be routed itself
    restored = pickle.loads(blob)
    assert all(modules.route_of(m) is None for m in restored.modules())
    torch.testing.assert_close(_eager(restored, x), _eager(model, x), rtol=0, atol=0)


class _Outer(nn.Module):
    """A module whose card reads a parameter through a submodule (as an MLP's card reads its projections')."""

    def __init__(self):
        super().__init__()
        self.norm = Model().layers[0].norm1

    def forward(self, x):
        return self.norm(x)


def test_a_submodule_replaced_after_install_declines(cast):
    """A submodule swapped after install (PEFT wraps a Linear so, a user swaps an activation) was not seen:
    the parameter check looked at the old submodule, which still held its weight, so the plan ran with the
    replaced module's weights."""
    torch.manual_seed(2)
    model = nn.Sequential(_Outer()).to(torch.bfloat16)
    x = torch.randn(*X, dtype=torch.bfloat16)
    card = {"class": "_Outer", "paths": ["0"], "args": [{"input": 0}], "params": [{"name": "norm.weight", "input": 1}]}
    c = cast(variants=[_variant(module=card)])
    with c.enabled(model), torch.no_grad():
        model(x)
        assert c.counting.calls == 1
        fresh = Model().layers[0].norm1.to(torch.bfloat16)
        fresh.weight.normal_()
        model[0].norm = fresh
        got = model(x)
    torch.testing.assert_close(got, _eager(model, x), rtol=0, atol=0)
    assert c.counting.calls == 1 and c.stats()["modules"]["0"]["declines"] == {"modules changed": 1}


def test_a_parameter_given_other_metadata_over_the_same_memory_declines(model, cast):
    """`weight.data = weight.data.view(dtype)` (or `.t()`) keeps the Parameter, its address and its version
    counter: the check passed and the plan got a tensor of another dtype or strides than it was proven for."""
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    norm = model.layers[0].norm1
    with c.enabled(model), torch.no_grad():
        v, ptr = norm.weight._version, norm.weight.data_ptr()
        norm.weight.data = norm.weight.data.view(torch.float16)
        assert (norm.weight._version, norm.weight.data_ptr()) == (v, ptr)
        norm(x)
    assert c.counting.calls == 0
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"parameters changed": 1}


class _Switched(nn.Module):
    """A forward that branches on a plain attribute of its own (as `self.use_fast`)."""

    def __init__(self):
        super().__init__()
        self.norm = Model().layers[0].norm1
        self.weight = self.norm.weight
        self.normalize = True

    def forward(self, x):
        return self.norm(x) if self.normalize else x


def test_a_plain_attribute_changed_after_install_declines_also_without_recorded_states(cast):
    """A card whose capture recorded no `states` (one of the module's attributes was not a plain value: a
    transformers config) guarded none of its attributes: after `module.normalize = False` the plan still ran.
    Its plain attributes are now held to their values at install as a recorded state's are."""
    torch.manual_seed(3)
    model = nn.Sequential(_Switched()).to(torch.bfloat16)
    model[0].config = object()   # what keeps a capture from recording states
    x = torch.randn(*X, dtype=torch.bfloat16)
    card = {"class": "_Switched", "paths": ["0"], "args": [{"input": 0}], "params": [{"name": "weight", "input": 1}]}
    c = cast(variants=[_variant(module=card)])
    with c.enabled(model), torch.no_grad():
        model(x)
        assert c.counting.calls == 1
        model[0].normalize = False
        got = model(x)
    torch.testing.assert_close(got, x, rtol=0, atol=0)
    assert c.counting.calls == 1 and c.stats()["modules"]["0"]["declines"] == {"attributes changed": 1}


def test_a_norm_module_card_declines_while_deterministic_algorithms_are_on(model, cast):
    # The RMSNorm chain holds a mean: its kernels may round otherwise from run to run.
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with c.enabled(model), torch.no_grad():
            model(x)
            declines = c.stats()["modules"]["layers.0.norm1"]["declines"]
    finally:
        torch.use_deterministic_algorithms(was)
    assert c.counting.calls == 0 and declines == {"deterministic algorithms": 1}


def test_an_enabled_block_leaves_a_cast_installed_before_it_installed(model, cast):
    """A user who called install() and later used an enabled() block lost the whole cast when the block ended."""
    x = torch.randn(*X, dtype=torch.bfloat16)
    c = cast()
    c.install(model)
    try:
        with c.enabled(model), torch.no_grad():
            model(x)
        assert c.installed
        with torch.no_grad():
            model(x)
        assert c.counting.calls == 6  # still served after the block
    finally:
        c.remove()
    assert not c.installed
    with c.enabled(model):
        assert c.installed
    assert not c.installed  # a block that installed it removes it


class _Dropped(nn.Module):
    """A block whose forward ends in a Dropout child (identity in eval, so the chain of its proof is the norm's)."""

    def __init__(self):
        super().__init__()
        self.norm = Model().layers[0].norm1
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.norm(x))


def test_a_submodule_set_to_train_mode_after_install_declines(cast):
    """Monte Carlo dropout: the model in eval, its Dropout modules alone set back to train. The route checked the
    routed module's own training flag only, so the plan (proven in eval: no dropout) kept serving and the
    dropout never ran."""
    torch.manual_seed(4)
    model = nn.Sequential(_Dropped()).to(torch.bfloat16).eval()
    x = torch.randn(*X, dtype=torch.bfloat16)
    card = {"class": "_Dropped", "paths": ["0"], "args": [{"input": 0}],
            "params": [{"name": "norm.weight", "input": 1}], "training": False}
    c = cast(variants=[_variant(module=card)])
    with c.enabled(model), torch.no_grad():
        model(x)
        assert c.counting.calls == 1
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.train()
        got = model(x)
    assert c.counting.calls == 1 and (got == 0).any()
    assert c.stats()["modules"]["0"]["declines"] == {"submodule attributes changed": 1}


class _Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 1.0

    def forward(self, x):
        return x * self.k


def test_a_submodule_attribute_changed_after_install_declines(cast):
    """Install compares the submodules' attributes with the proof's; one changed afterwards (a child's `eps`,
    `approximate`, a factor) was not seen and the plan kept computing with the old value."""
    torch.manual_seed(5)
    model = nn.Sequential(_Outer()).to(torch.bfloat16)
    model[0].norm.scale = _Scale()   # a grandchild, read by nothing: the route must still hold its attributes
    model[0].norm.scale.k = 1.0
    x = torch.randn(*X, dtype=torch.bfloat16)
    card = {"class": "_Outer", "paths": ["0"], "args": [{"input": 0}], "params": [{"name": "norm.weight", "input": 1}]}
    c = cast(variants=[_variant(module=card)])
    with c.enabled(model), torch.no_grad():
        model(x)
        model[0].norm.scale.k = 2.0
        model(x)
        del model[0].norm.scale.k
        model(x)
    assert c.counting.calls == 1
    assert c.stats()["modules"]["0"]["declines"] == {"submodule attributes changed": 2}


def test_forward_mode_ad_declines(model, tmp_path):
    """torch.autograd.forward_ad: a dual input requires no grad, so the guard served, and a kernel's outputs carry
    no tangent: `unpack_dual(norm(make_dual(x, t))).tangent` was None where eager gives the JVP."""
    import torch.autograd.forward_ad as fwAD

    # a kernel's plan: its outputs are written by a launch, outside autograd of any kind
    c = engine.cast.load(_write(tmp_path), env=ENV, plans={"rms": lambda i: run_chain(norm_signature(), [t.detach() for t in i])})
    x, t = torch.randn(*X, dtype=torch.bfloat16), torch.randn(*X, dtype=torch.bfloat16)
    norm = model.layers[0].norm1
    with torch.no_grad(), fwAD.dual_level():
        want = fwAD.unpack_dual(norm(fwAD.make_dual(x, t))).tangent
    with c.enabled(model), torch.no_grad():
        with fwAD.dual_level():
            got = fwAD.unpack_dual(norm(fwAD.make_dual(x, t))).tangent
        norm(x)  # outside the dual level: served
    assert got is not None and torch.equal(got, want)
    assert c.stats()["modules"]["layers.0.norm1"]["declines"] == {"forward AD": 1}
    assert c.stats()["modules"]["layers.0.norm1"]["hits"] == 1


class _Wrapped(torch.Tensor):
    """A wrapper tensor subclass without storage of its own (as a quantized weight or a DTensor is)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(t):
            return t.inner if isinstance(t, _Wrapped) else t

        out = func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})
        return _Wrapped(out) if func is torch.ops.aten.detach.default else out


def test_a_parameter_that_is_a_tensor_subclass_is_not_bound(model, cast):
    """A weight held as a wrapper subclass has the proven shape, dtype and strides but data_ptr() 0: the card
    bound it and served, and a kernel would have read its weight from address 0."""
    x = torch.randn(*X, dtype=torch.bfloat16)
    norm = model.layers[1].norm1
    norm.weight = nn.Parameter(_Wrapped(norm.weight.detach()), requires_grad=False)
    assert norm.weight.data_ptr() == 0
    want = _eager(model, x)
    c = cast()
    with pytest.warns(CastWarning, match=r"layers\.1\.norm1 \(rms: weight is a tensor subclass \(_Wrapped\)"):
        c.install(model)
    try:
        with torch.no_grad():
            got = model(x)
    finally:
        c.remove()
    assert torch.equal(got, want)
    assert "layers.1.norm1" not in c.stats()["modules"] and c.counting.calls == 2
