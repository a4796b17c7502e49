"""A cast under torch.compile on the CPU: overrides at the CPU dispatch key with counting plans, a function
compiled by Inductor (C++ codegen) through `engine.cast.compose`. Compiled code reaches the override for a
covered signature and PyTorch's kernel otherwise; under grad the cast declines; Inductor's tables and config
are as before; Inductor's caches never hand a graph compiled for one cast to another (or to none)."""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.nn.functional as F

from engine.capture.signature import bind_arguments, signature_of
from engine.cast import compose, runtime
from engine.cast.guard import first_shape, layout_of, signature_key

GN = torch.ops.aten.native_group_norm.default
ROUTE = ("aten::native_group_norm", "CPU")


class CpuCast:
    """What compose needs of a cast: a digest, and routes it owns (here at the CPU key)."""

    def __init__(self, name: str):
        self.digest = f"{name}-{uuid.uuid4().hex}"  # fresh per run: no earlier run's cache entry matches
        self.plan: runtime.Plan | None = None

    def install(self, args: list) -> CpuCast:
        lay = layout_of(GN)
        sig = signature_of(GN, bind_arguments(GN, args, {}))

        def run(bound):  # PyTorch's own kernel, so results are exact; the hit counter tells who ran
            return runtime.routes()[ROUTE].original.call_boxed(torch._C._dispatch_keyset_full(), *bound)

        self.plan = runtime.Plan(f"gn-{self.digest[:1]}", run)
        runtime.add_entries(self, [(lay.op_name, signature_key(lay, sig, 0), self.plan, first_shape(sig))], "CPU")
        return self

    def remove(self) -> None:
        runtime.remove_owner(self)

    @property
    def hits(self) -> int:
        return self.plan.hits if self.plan is not None else 0


def _gn_args(h=4, w=4):
    x = torch.randn(2, 8, h, w)
    return [x, torch.randn(8), torch.randn(8), 2, 8, h * w, 4, 1e-5]


def f(x, w, b):
    return torch.relu(F.group_norm(x, 4, w, b, 1e-5)) * 2


@pytest.fixture
def casts():
    made: list[CpuCast] = []

    def make(name):
        made.append(CpuCast(name))
        return made[-1]

    torch._dynamo.reset()
    yield make
    for c in made:
        c.remove()
    torch._dynamo.reset()
    assert runtime.routes() == {}


def test_compiled_code_calls_the_override_for_a_covered_signature_only(casts):
    args = _gn_args()
    x, w, b = args[:3]
    other = torch.randn(2, 8, 6, 6)
    expected, expected_other = f(x, w, b), f(other, w, b)
    before = compose.inductor_snapshot()
    # The snapshot also holds the other custom-pass hooks, the pattern matcher's switch and how many
    # of Inductor's own pattern entries are ours (pattern cards live in a pass of their own: none).
    assert {"joint_custom_passes", "pattern_matcher", "inductor_patterns"} <= set(before)
    assert not any(before["inductor_patterns"].values())
    cast = casts("A").install(args)
    backend = compose.backend(cast, dynamic=True)
    compiled = torch.compile(f, backend=backend, dynamic=True)  # one graph for both shapes: the guard decides
    with torch.no_grad():
        got = compiled(x, w, b)
        assert cast.hits == 1
        misses = runtime.routes()[ROUTE].misses
        got_other = compiled(other, w, b)
    assert cast.hits == 1 and runtime.routes()[ROUTE].misses == misses + 1
    assert torch.allclose(got, expected, atol=1e-6) and torch.allclose(got_other, expected_other, atol=1e-5)
    assert backend.vetoed == [(("aten.native_group_norm.default", (("cpu", "torch.float32"),)),)]
    # Inductor's decomposition table, lowerings, fallbacks, layout constraints and config are as before,
    # with the cast still installed and after it is removed.
    assert compose.inductor_snapshot() == before
    cast.remove()
    assert compose.inductor_snapshot() == before
    with torch.no_grad():  # the compiled graph calls the ATen op: PyTorch's kernel once the cast is gone
        assert torch.allclose(compiled(x, w, b), expected, atol=1e-6)
    assert cast.hits == 1


def test_a_symbolic_size_keeps_the_op_only_where_the_concrete_sizes_can_be_a_variants(casts):
    """The batch dim dynamic: a GroupNorm of [s0, 8, 4, 4] may have the variant's sizes, so the op stays and the
    guard decides per call; one of [s0, 8, 6, 6] cannot (6 is no variant's), so Inductor decomposes it rather
    than keep an op whose every call would miss the guard and run PyTorch's kernel."""
    args = _gn_args()
    x, w, b = args[:3]
    other = torch.randn(2, 8, 6, 6)
    cast = casts("A").install(args)
    for t, hits in ((x, 1), (other, 0)):
        torch._dynamo.reset()
        t = t.clone()
        torch._dynamo.mark_dynamic(t, 0)
        want = f(t, w, b)  # eager, with the cast installed: its own hit or miss, counted before
        hits0, misses0 = cast.hits, runtime.routes()[ROUTE].misses
        with torch.no_grad():
            got = compose.compile(cast, f)(t, w, b)
        assert torch.allclose(got, want, atol=1e-5)
        assert cast.hits - hits0 == hits and runtime.routes()[ROUTE].misses == misses0, "a kept op missed the guard"


def test_under_grad_the_cast_declines_in_eager_and_in_compiled_code(casts):
    args = _gn_args()
    x, w, b = args[:3]
    cast = casts("A").install(args)
    xr = x.clone().requires_grad_()
    with torch.enable_grad():
        eager = F.group_norm(xr, 4, w, b, 1e-5)  # autograd needs PyTorch's saved mean/rstd: declined
        assert cast.hits == 0 and runtime.routes()[ROUTE].grad_declines == 1
        (g_eager,) = torch.autograd.grad(eager.sum() + (eager ** 2).sum(), xr)
        out = compose.compile(cast, f)(xr, w, b)
        (g,) = torch.autograd.grad(out.sum(), xr)
    assert cast.hits == 0
    xe = x.clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(f(xe, w, b).sum(), xe)
    assert torch.allclose(g, g_ref, atol=1e-5) and g_eager.shape == x.shape


def _cache_hits() -> int:
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]


def test_caches_are_keyed_by_the_cast(casts, tmp_path, monkeypatch, torch_config):
    from torch._functorch import config as fconfig
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch_config(config, fx_graph_cache=True)
    torch_config(fconfig, enable_autograd_cache=True)
    args = _gn_args()
    x, w, b = args[:3]
    expected = f(x, w, b)

    def run(compiled):
        torch._dynamo.reset()  # Dynamo forgets: what comes back now comes from Inductor's caches
        with torch.no_grad():
            assert torch.allclose(compiled(x, w, b), expected, atol=1e-6)

    a, b_cast = casts("A"), casts("B")
    run(torch.compile(f))                          # no cast: Inductor decomposes group_norm
    a.install(args)
    run(compose.compile(a, f))                     # cast A: not the cached no-cast graph
    assert a.hits == 1
    hits = _cache_hits()
    run(compose.compile(a, f))                     # cast A again: its own graph, from the cache
    assert a.hits == 2 and _cache_hits() > hits
    run(torch.compile(f))                          # no cast, with A installed: the no-cast graph
    assert a.hits == 2
    a.remove()
    b_cast.install(args)
    hits = _cache_hits()
    run(compose.compile(b_cast, f))                # cast B: neither A's graph nor the no-cast one
    assert b_cast.hits == 1 and a.hits == 2 and _cache_hits() == hits


def _relu2(x):
    return torch.relu(x) * 2


def _entered_targets(monkeypatch) -> list:
    """Every runtime.target_scope a compiled call enters, in order (the target its routes are told)."""
    entered: list = []
    inner = runtime.target_scope

    def counting(target):
        entered.append(target)
        return inner(target)

    monkeypatch.setattr(runtime, "target_scope", counting)
    return entered


def test_a_graph_that_calls_nothing_the_cast_routes_runs_as_inductor_compiled_it(casts, tmp_path, monkeypatch):
    """A graph with nothing of the cast in it (ResNet-50's under compile: Inductor decomposes its batch norms)
    is Inductor's own function: no target set around its calls, nothing of ours left to cost time. One that
    calls a routed op keeps the target."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # lowered here, not served from a cache
    args = _gn_args()
    x, w, b = args[:3]
    cast = casts("A").install(args)
    entered = _entered_targets(monkeypatch)
    plain = compose.backend(cast)
    with torch.no_grad():
        got = torch.compile(_relu2, backend=plain)(x)
        torch.compile(_relu2, backend=plain)(x)
    assert torch.equal(got, _relu2(x))
    assert plain.unwrapped == 1 and entered == [], "a graph without the cast's ops ran under a target scope"
    torch._dynamo.reset()
    routed = compose.backend(cast)
    expected = f(x, w, b)  # eager: the cast's own hit
    with torch.no_grad():
        fast = torch.compile(f, backend=routed)
        got = fast(x, w, b)
        fast(x, w, b)
    assert torch.allclose(got, expected, atol=1e-6) and cast.hits == 3
    assert routed.unwrapped == 0 and entered == ["compile", "compile"]


def test_a_graph_of_the_cast_op_that_the_cast_does_not_keep_still_runs_under_the_target(casts, tmp_path,
                                                                                        monkeypatch):
    """Counted by op, not by variant: a GroupNorm of sizes no variant has is decomposed (no call in the graph),
    but one the graph holds as a fallback for any reason (here: plain Inductor, the cast's routes installed
    after) reaches the routes. A graph compiled with the cast not installed still counts the cast's ops."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    args = _gn_args()
    cast = casts("A")
    cast.variants = [type("V", (), {"op": "aten::native_group_norm"})()]  # what a loaded Cast lists
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(GN, (x, None, None, 2, 8, 16, 4, 1e-5)))
    assert compose._routed_calls(graph, compose.routed_names(cast)) == 1
    # a higher-order op's subgraphs are not read: it counts as a call that may reach a route
    hop = torch.fx.Graph()
    y = hop.placeholder("y")
    hop.output(hop.call_function(torch.ops.higher_order.cond, (y, None, None, (y,))))
    assert compose._routed_calls(hop, frozenset()) == 1
    assert compose.routed_names(casts("B")) == frozenset()  # nothing listed, nothing installed
    cast.install(args)
    assert "aten::native_group_norm" in compose.routed_names(casts("C"))  # another cast's installed route


def test_a_graph_served_from_inductors_cache_keeps_the_target(casts, tmp_path, monkeypatch, torch_config):
    """A graph from Inductor's caches is not lowered here, so what it calls is not known: it keeps the
    target around its calls."""
    from torch._functorch import config as fconfig
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch_config(config, fx_graph_cache=True)
    torch_config(fconfig, enable_autograd_cache=True)
    args = _gn_args()
    x = args[0]
    cast = casts("A").install(args)
    first = compose.backend(cast)
    with torch.no_grad():
        torch.compile(_relu2, backend=first)(x)
    torch._dynamo.reset()
    hits = _cache_hits()
    again = compose.backend(cast)
    entered = _entered_targets(monkeypatch)
    with torch.no_grad():
        assert torch.equal(torch.compile(_relu2, backend=again)(x), _relu2(x))
    assert _cache_hits() > hits, "the second compile was not served from Inductor's cache"
    assert first.unwrapped == 1 and again.unwrapped == 0 and entered == ["compile"]


def test_an_op_another_cast_routes_through_the_cpp_router_counts_as_routed(casts):
    """A graph that calls an op some installed C++ route takes keeps the target scope too (another cast's route
    must see the compile's target, not eager's)."""
    from engine.cast import cpp_router

    class Ext:  # the extension's install/uninstall, recorded
        def __init__(self):
            self.calls = []

        def install(self, *a):
            self.calls.append(("install", *a[:3]))

        def uninstall(self, *a):
            self.calls.append(("uninstall", *a))

    ext, other = Ext(), casts("O")
    assert "aten::native_batch_norm" not in compose.routed_names(other)
    cpp_router.install(ext, "aten::native_batch_norm", "CUDA", [])
    try:
        assert "aten::native_batch_norm" in cpp_router.installed_ops()
        assert "aten::native_batch_norm" in compose.routed_names(other)
    finally:
        cpp_router.uninstall(ext, "aten::native_batch_norm", "CUDA")
    assert "aten::native_batch_norm" not in compose.routed_names(other)
    assert ext.calls == [("install", "aten::native_batch_norm", "", "CUDA"),
                         ("uninstall", "aten::native_batch_norm", "", "CUDA")]
