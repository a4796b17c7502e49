"""Graph routes (engine/cast/graphs.py): the guard, the static copies in and out, and what a capture refuses.

On the CPU with a stand-in for torch.cuda.graph whose replay reruns the captured function into the static
output, so every guard decision and copy runs as on the GPU; the CUDA capture itself is tested in
tests/test_cast_graph_routes_gpu.py."""

from __future__ import annotations

from collections import UserDict

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from engine.cast import modules
from engine.cast.graphs import GraphSet


class StandIn:
    device_type = "cpu"

    def __init__(self, fail: bool = False):
        self.captures = self.replays = 0
        self.fail = fail

    def stream(self):
        return 0

    def capturing(self):
        return False

    def capture(self, fn):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        out = fn()
        self.captures += 1

        def replay():
            self.replays += 1
            for a, b in zip(tree_flatten(out)[0], tree_flatten(fn())[0]):
                if isinstance(a, torch.Tensor):
                    a.copy_(b)
        return replay, out


class Config:
    def __init__(self):
        self.attn_implementation = "sdpa"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.scale = 0.5
        self.config = Config()  # as transformers' modules hold their model's config

    def forward(self, x, gate=None, *, bias: float = 0.0):
        h = self.norm(self.lin(x)) * self.scale + bias
        return (h + x, {"gate": h if gate is None else h * gate})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)[0]
        return x


def _x(*shape):
    return torch.randn(*shape or (2, 8))


def _routed(model=None, **kw):
    model = model or Block().eval()
    backend = StandIn(**kw)
    gs = GraphSet(model, lambda path, m: isinstance(m, Block), backend, max_graphs=2)
    return model, gs, backend


def _equal(a, b):
    fa, sa = tree_flatten(a)
    fb, sb = tree_flatten(b)
    return sa == sb and all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(fa, fb))


def test_a_signature_is_captured_on_its_first_call_and_replayed_after_with_the_calls_values():
    model = Net().eval()
    backend = StandIn()
    gs = GraphSet(model, lambda path, m: isinstance(m, Block), backend)
    assert list(gs.paths()) == ["blocks.0", "blocks.1"]
    keys = set(model.state_dict())
    with torch.no_grad(), gs:
        x = _x()
        first = model(x)
        assert backend.captures == 2 and backend.replays == 2  # each capture is checked by one replay
        for _ in range(3):
            x = _x()
            got = model(x)
            gs.remove()
            want = model(x)
            gs.install()
            assert torch.equal(got, want)
    assert backend.replays == 2 + 3 * 2
    st = gs.stats()
    assert st["blocks.0"]["captured"] == 1 and st["blocks.0"]["replays"] == 3
    assert not any("forward" in m.__dict__ or modules.route_of(m) for m in model.modules())  # removed: as before
    assert not hasattr(Block.__dict__["forward"], "__kforge_original__")  # the class's own forward back
    assert set(model.state_dict()) == keys and first.shape == (2, 8)


def test_outputs_are_fresh_tensors_in_the_forwards_structure_and_keyword_arguments_are_in_the_signature():
    model, gs, backend = _routed()
    x, gate = _x(), _x()
    with torch.no_grad():
        want = model(x, gate, bias=1.0)
        with gs:
            model(x, gate, bias=1.0)
            a = model(x, gate, bias=1.0)
            a[0].add_(100)  # the caller owns what it got: the next replay's output is not that tensor
            b = model(x, gate, bias=1.0)
            assert _equal(b, want) and a[0].data_ptr() != b[0].data_ptr()
            model(x, gate, bias=2.0)  # another value of a keyword: another signature, captured
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 2 and st["replays"] == 2


class Cached(Block):
    """A module holding tensors as plain attributes, as rotary embeddings hold their cos/sin caches."""

    def __init__(self):
        super().__init__()
        self.table = torch.randn(8)
        self.pair = [torch.randn(8), torch.randn(8)]
        self.named = {"cos": torch.randn(8)}

    def forward(self, x, gate=None, *, bias: float = 0.0):
        h, extra = super().forward(x, gate, bias=bias)
        return h + self.table + self.pair[1] + self.named["cos"], extra


def test_the_guard_checks_each_parameter_once():
    # Plain-attribute tensors were collected from every entry of a module's __dict__, its _parameters and _buffers
    # tables too: every parameter was checked twice per call (340 of 757 us a call for Gemma 4 E2B's 547 tensors
    # at full depth on a CI core).
    model, gs, _ = _routed(Cached().eval())
    (r,) = gs.routes.values()
    held = {id(t) for _, _, t, _, _ in r.tensor_attrs}
    checked = [id(t) for _, _, t, _, _ in r.tensors]
    assert checked and len(checked) == len(set(checked)) and not held & set(checked)
    assert held == {id(model.table), id(model.pair[0]), id(model.pair[1]), id(model.named["cos"])}


@pytest.mark.parametrize("change, why", [
    (lambda m: m.lin.weight.add_(1.0), "parameters changed"),
    (lambda m: setattr(m.lin.weight, "data", torch.randn(8, 8)), "parameters changed"),
    (lambda m: setattr(m.lin, "weight", nn.Parameter(m.lin.weight.detach().clone())), "parameters changed"),
    (lambda m: setattr(m.norm, "eps", 1e-3), "attributes changed"),
    (lambda m: setattr(m, "scale", 2.0), "attributes changed"),
    (lambda m: setattr(m.config, "attn_implementation", "eager"), "attributes changed"),
    (lambda m: setattr(m, "norm", nn.LayerNorm(8)), "attributes changed"),    # a submodule swapped
    (lambda m: m.register_buffer("extra", torch.zeros(1)), "modules changed"),  # the tree grew
    (lambda m: m.norm.register_forward_hook(lambda *a: None), "hooks"),
    (lambda m: setattr(torch.backends.cudnn, "deterministic", not torch.backends.cudnn.deterministic),
     "kernel switches changed"),
    # tensors held as plain attributes: the graph would read the old one's memory
    (lambda m: setattr(m, "table", torch.randn(8)), "tensor attributes changed"),   # reassigned
    (lambda m: m.table.add_(1.0), "tensor attributes changed"),                      # changed in place
    (lambda m: m.pair.__setitem__(1, torch.randn(8)), "tensor attributes changed"),  # one of a list's replaced
    (lambda m: m.named.__setitem__("cos", torch.randn(8)), "tensor attributes changed"),  # a dict's replaced
])
def test_after_a_change_the_guard_runs_the_original_forward(change, why):
    model, gs, backend = _routed(Cached().eval())
    x = _x()
    det = torch.backends.cudnn.deterministic
    try:
        with torch.no_grad(), gs:
            model(x)
            model(x)
            change(model)
            replays = backend.replays
            got = model(x)
            gs.remove()
            want = model(x)
        assert backend.replays == replays and _equal(got, want)
        assert next(iter(gs.stats().values()))["declines"] == {why: 1}
    finally:
        torch.backends.cudnn.deterministic = det


class Keeps(Block):
    """A forward that keeps a tensor it computed as an attribute (attention weights for later inspection)."""

    def forward(self, x):
        h = self.lin(x)
        self.last = h.detach()
        return h


MASK = torch.ones(8)


class ReadsMask(Block):
    def forward(self, x):
        return self.lin(x) * MASK


def test_a_module_level_tensor_a_forward_reads_is_guarded():
    """A graph reads a global tensor at its capture-time address: reassigned, the route must decline."""
    global MASK
    model, gs, backend = _routed(ReadsMask().eval())
    x = _x()
    keep = MASK
    try:
        with torch.no_grad(), gs:
            model(x)
            model(x)
            MASK = torch.full((8,), 2.0)
            got = model(x)
        gs.remove()
        with torch.no_grad():
            assert _equal(got, model(x))
        st = next(iter(gs.stats().values()))
        assert st["replays"] == 1 and st["declines"] == {"globals changed": 1}
    finally:
        MASK = keep


def test_a_forward_that_keeps_a_tensor_as_an_attribute_is_refused():
    """A replay would not assign it: code reading `module.last` afterwards would see the capture's tensor."""
    model, gs, backend = _routed(Keeps().eval())
    x = _x()
    with torch.no_grad(), gs:
        model(x)
        model(x)
    st = next(iter(gs.stats().values()))
    assert st["replays"] == 0 and st["refused"] == {
        "#1": "the forward changes its module's parameters, buffers or attributes"}


class Lazy(Block):
    """A cache built on the first call and read after (as rotary embeddings build theirs)."""

    def forward(self, x):
        if getattr(self, "cache", None) is None:
            self.cache = torch.ones(8) * 2
        return self.lin(x) * self.cache


def test_a_tensor_attribute_made_on_the_first_call_is_guarded_from_then_on():
    model, gs, backend = _routed(Lazy().eval())
    x = _x()
    with torch.no_grad(), gs:
        model(x)
        got = model(x)
        model.cache = torch.ones(8) * 3  # rebuilt: the graph read the old one
        again = model(x)
    gs.remove()
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 1 and st["replays"] == 1 and st["declines"] == {"tensor attributes changed": 1}
    with torch.no_grad():
        assert _equal(again, model(x)) and not _equal(got, again)


def test_a_list_or_dict_attribute_changed_in_place_declines_and_a_large_one_is_not_compared():
    block = Block().eval()
    block.sizes = [1, 2]                                   # a module's small list
    block.config.rope_scaling = {"type": "linear", "factor": 2.0}  # a config's small dict, one level down
    block.config.id2label = {i: str(i) for i in range(modules._SMALL + 1)}  # too large to compare at each call
    model, gs, backend = _routed(block)
    with torch.no_grad(), gs:
        x = _x()
        model(x)
        model(x)
        model.config.id2label[0] = "changed"  # not compared: replayed as captured
        model(x)
        model.sizes.append(3)
        model(x)
        model.sizes.pop()
        model.config.rope_scaling["factor"] = 4.0
        model(x)
    st = next(iter(gs.stats().values()))
    assert st["replays"] == 2 and st["declines"] == {"attributes changed": 2}, st


DOUBLE = True  # a module-level flag a forward branches on


def _scale(h):  # a helper the forward calls, which reads the flag itself
    return h * 2 if DOUBLE else h


class ReadsAFlag(Block):
    def forward(self, x):
        return _scale(self.lin(x))


def _logged(fn):  # a decorator as transformers' deprecation wrappers are: the forward is the function it wraps
    import functools

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **kwargs)

    return call


class ReadsAFlagDecorated(Block):
    @_logged
    def forward(self, x):
        return _scale(self.lin(x))


@pytest.mark.parametrize("cls", [ReadsAFlag, ReadsAFlagDecorated])
def test_a_module_level_flag_a_forward_reads_is_guarded(monkeypatch, cls):
    model, gs, backend = _routed(cls().eval())
    x = _x()
    with torch.no_grad(), gs:
        model(x)
        model(x)
        monkeypatch.setitem(globals(), "DOUBLE", False)
        got = model(x)
    assert torch.equal(got, model.lin(x))  # the flag's new branch, not the captured one
    st = next(iter(gs.stats().values()))
    assert st["replays"] == 1 and st["declines"] == {"attributes changed": 1}, st


def test_grad_needed_declines_and_no_grad_replays():
    model, gs, backend = _routed()
    x = _x()
    with gs:
        with torch.no_grad():
            model(x)
        out = model(x)  # grad enabled, parameters require grad
        assert out[0].requires_grad
    assert next(iter(gs.stats().values()))["declines"] == {"grad": 1}


def test_a_new_shape_is_its_own_graph_up_to_the_limit():
    model, gs, backend = _routed()
    with torch.no_grad(), gs:
        for rows in (2, 3, 4, 4):
            model(_x(rows, 8))
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 2 and st["declines"] == {"graphs per module used up": 2}


class Writes(Block):
    def forward(self, x):
        x.mul_(2)
        return self.lin(x)


class Identity(Block):
    def forward(self, x):
        return x


class Counts(Block):
    def forward(self, x):
        self.scale = self.scale + 1
        return self.lin(x)


class Noisy(Block):
    def forward(self, x):
        return self.lin(x) + torch.rand_like(x)


class Expands(Block):
    def forward(self, x):
        return self.lin(x)[:, :1].expand(-1, 8)


class Slices(Block):  # a slice of a wider projection, with gaps between its rows (as keys cut from a qkv)
    def forward(self, x):
        return torch.cat([self.lin(x), x], -1)[:, 2:6], self.lin(x).t()


def test_an_output_with_gaps_or_transposed_is_replayed_with_eagers_strides():
    model, gs, backend = _routed(Slices().eval())
    with torch.no_grad():
        for _ in range(3):
            x = _x()
            want = model(x)  # eager: no route installed
            with gs:
                got = model(x)
            assert _equal(got, want) and [g.stride() for g in got] == [w.stride() for w in want]
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 1 and st["replays"] == 2 and not st["refused"], st


@pytest.mark.parametrize("cls, why", [
    (Expands, "an output whose elements overlap in memory (an expanded view)"),
    (Writes, "the forward writes an argument"),
    (Identity, "an output shares storage with an argument or a parameter"),
    (Counts, "the forward changes its module's parameters, buffers or attributes"),
    (Noisy, "the replay differs from the eager call"),
])
def test_forwards_a_replay_cannot_stand_for_are_refused_and_run_eagerly(cls, why):
    model, gs, backend = _routed(cls().eval())
    with torch.no_grad(), gs:
        for _ in range(3):
            model(_x())
    st = next(iter(gs.stats().values()))
    assert st["refused"] == {"#1": why} and st["replays"] == 0 and st["captured"] == 0
    assert st["eager_calls"] == 3


def test_a_forward_that_cannot_be_captured_is_refused_and_its_output_is_the_eager_one():
    model, gs, backend = _routed(fail=True)
    x = _x()
    with torch.no_grad():
        want = model(x)
        with gs:
            got = [model(x) for _ in range(2)]
    assert all(_equal(g, want) for g in got)
    st = next(iter(gs.stats().values()))
    assert st["refused"]["#1"].startswith("not capturable: RuntimeError: operation not permitted")
    assert st["declines"] == {"signature refused": 1}


def test_arguments_the_guard_cannot_key_decline():
    class Cache:
        pass

    class TakesObject(Block):
        def forward(self, x, cache=None):
            return self.lin(x)

    model, gs, backend = _routed(TakesObject().eval())
    with torch.no_grad(), gs:
        model(_x(), Cache())
        model(_x().to(torch.float64).float().to_sparse().to_dense(), None)
    st = next(iter(gs.stats().values()))
    assert st["declines"] == {"a Cache argument": 1} and st["captured"] == 1


def test_the_outermost_selected_module_is_routed_and_module_cards_are_left_alone():
    model = Net().eval()
    model.blocks[1].__dict__["forward"] = model.blocks[1].forward  # an instance forward: a module card, say
    gs = GraphSet(model, lambda path, m: isinstance(m, (nn.ModuleList, Block, nn.Linear)), StandIn())
    assert list(gs.paths()) == ["blocks"] or list(gs.paths()) == []
    gs = GraphSet(model, lambda path, m: isinstance(m, (Block, nn.Linear)), StandIn())
    assert list(gs.paths()) == ["blocks.0", "blocks.1.lin"]
    assert "blocks.1" in gs.skipped


def test_a_replay_reads_the_parameters_values_as_they_are_at_the_call():
    """A write through `.data` keeps the tensor, its version and its address: the graph reads the new values
    there, as the eager forward would."""
    model, gs, backend = _routed()
    x = _x()
    with torch.no_grad(), gs:
        model(x)
        model.lin.weight.data.mul_(3.0)
        got = model(x)
        gs.remove()
        want = model(x)
    assert backend.replays == 2 and _equal(got, want)


def test_bench_graph_routes_names_a_bad_input_in_one_line_and_exits_2(tmp_path, capsys):
    from conftest import load_script

    bench = load_script("bench_graph_routes")
    assert bench.main(["--out", str(tmp_path), "--model", "configs/models/gemma4_e2b.toml", "--modules", "(("]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --modules '((': not a regular expression")
    assert bench.main(["--out", str(tmp_path), "--model", "configs/models/gemma4_e2b.toml", "--modules", "Layer",
                       "--cast", str(tmp_path / "none.cast")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.cast: no such file" in err[0]
    assert bench.main(["--out", str(tmp_path), "--model", str(tmp_path / "nope.toml"), "--modules", "Layer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --model")


class Shared(UserDict):  # as transformers' KVSharingDict: layers write their keys and values for later layers
    pass


class Writer(Block):
    def forward(self, x, shared):
        k = self.lin(x)
        shared["full"] = (k, k * 2)
        return x + self.norm(k)


class Reader(Block):
    def forward(self, x, shared):
        k, v = shared["full"]
        return x + self.lin(k) * v


class SharingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Writer(), Reader(), Reader()])

    def forward(self, x, shared=None):
        shared = Shared() if shared is None else shared
        for layer in self.layers:
            x = layer(x, shared)
        return x, shared


@pytest.mark.parametrize("mapping", [Shared, dict])
def test_entries_a_forward_puts_into_a_mapping_argument_are_put_there_by_a_replay_too(mapping):
    """Gemma 4's layers take a KVSharingDict that one layer writes its keys and values into and later layers
    read: a replay writes fresh copies of what the capture wrote, and readers copy them in as inputs. (A plain
    dict was flattened before, so a replay did not write what the forward wrote.)"""
    model = SharingNet().eval()
    backend = StandIn()
    gs = GraphSet(model, lambda path, m: isinstance(m, Block), backend)
    reused = mapping()
    with torch.no_grad():
        for _ in range(4):
            x = _x()
            with gs:
                got, got_shared = model(x, reused)  # one mapping object across forwards: no stale entry
            want, want_shared = model(x)
            assert torch.equal(got, want)
            assert all(torch.equal(a, b) for a, b in zip(got_shared["full"], want_shared["full"]))
    st = gs.stats()
    # the writer's first call found the mapping empty, its second held the last forward's entry: two signatures
    assert st["layers.0"]["captured"] == 2 and st["layers.0"]["replays"] == 2
    assert all(st[p]["captured"] == 1 and st[p]["replays"] == 3 for p in ("layers.1", "layers.2")), st


class Appends(Block):
    def forward(self, x, seen):
        seen.append(x)
        return self.lin(x)


class Removes(Block):
    def forward(self, x, shared):
        shared.pop("old")
        return self.lin(x)


def test_a_forward_that_changes_a_list_or_removes_a_mapping_entry_is_refused():
    model, gs, _ = _routed(Appends().eval())
    with torch.no_grad(), gs:
        seen: list = []
        for _ in range(2):
            model(_x(), [seen])
    assert next(iter(gs.stats().values()))["refused"] == {"#1": "the forward changes a list or dict inside its arguments"}
    model, gs, _ = _routed(Removes().eval())
    with torch.no_grad(), gs:
        for _ in range(2):
            model(_x(), {"old": _x()})
    assert next(iter(gs.stats().values()))["refused"] == {"#1": "the forward removes an entry of a mapping argument"}


def test_a_graph_captured_with_other_casts_installed_is_not_replayed_for_this_set():
    """A graph holds the kernels whichever casts served while it was captured: installing or removing a cast
    makes the next call another signature, captured afresh, and putting the set back finds the first graph."""
    from engine.cast import runtime

    model, gs, backend = _routed()
    cast = type("Cast", (), {})()  # any cast object
    x = _x()
    with torch.no_grad(), gs:
        model(x)
        model(x)
        runtime.note_serving(cast, True)
        try:
            model(x)
            model(x)
        finally:
            runtime.note_serving(cast, False)
        model(x)
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 2 and st["replays"] == 3
    assert runtime.serving() == frozenset()



def test_the_classes_worth_routing_are_the_model_itself_then_the_repeated_ones_outermost_first():
    from engine.cast.graphs import repeated_classes, route_candidates

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Inner(), Inner()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Layer(), Layer(), Layer()])
            self.head = Inner()  # one more Inner, not inside a layer

    assert repeated_classes(Model()) == ["Layer", "Inner"]  # Linear has no submodules; containers and root out
    assert route_candidates(Model()) == ["Model", "Layer", "Inner"]


def test_the_whole_model_is_routed_as_one_graph_and_nothing_inside_it_is_routed_again():
    model = Net().eval()
    gs = GraphSet(model, lambda path, m: type(m).__name__ in ("Net", "Block"), StandIn())
    assert list(gs.routes) == [""]  # the root: its blocks' kernels are in its graph
    with torch.no_grad():
        for _ in range(3):
            x = _x()
            want = Net.forward(model, x)
            with gs:
                assert torch.equal(model(x), want)
    assert gs.stats()[""]["captured"] == 1 and gs.stats()[""]["replays"] == 2


def test_bench_graph_routes_tries_the_repeated_classes_and_reports_each(tmp_path, monkeypatch):
    """The script's flow on the CPU with the stand-in (not a measurement): --modules auto tries the model's own
    class, then its repeated classes, largest first, and the report has a table per trial with the routes'
    counts."""
    import json

    from conftest import load_script

    bench = load_script("bench_graph_routes")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "BACKEND", StandIn())
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--model", "configs/examples/my_model.toml", "--small", "--modules", "auto",
                       "--max-s", "0"]) == 0
    doc = json.loads((out / "bench_graph_routes.json").read_text())
    assert doc["candidates"] == ["TinyModel", "TinyMLPBlock"] and len(doc["trials"]) == 2
    for t in doc["trials"]:
        assert t["equal"] and t["forwards"] == 10
        assert all(r["captured"] == 1 and r["replays"] > 0 and not r["refused"] for r in t["routes"].values())
    assert list(doc["trials"][0]["routes"]) == [""]  # the whole model as one route
    md = (out / "bench_graph_routes.md").read_text()
    assert "## /^TinyModel$/" in md and "## /^TinyMLPBlock$/" in md and "module(s) routed" in md
    assert "bit for bit equal" in md


def test_inference_mode_and_no_grad_calls_are_different_signatures():
    """A graph captured under inference_mode holds inference tensors, which a call outside it cannot copy into."""
    model, gs, backend = _routed()
    x = _x()
    with gs:
        with torch.inference_mode():
            model(x)
            model(x)
        with torch.no_grad():
            model(x)
            got = model(x)
    gs.remove()
    with torch.no_grad():
        assert _equal(got, model(x))
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 2 and st["replays"] == 2


def test_a_cast_with_graph_routes_routes_its_models_modules_while_installed(tmp_path, monkeypatch):
    """`export --graph-routes` records the class chosen; installing the cast with the model routes its modules
    of that class (after the module cards, whose kernels then serve inside the graphs), removing it puts the
    forwards back, and the cast's stats show the routes."""
    from test_cast_modules import ENV, Counting, Model, _variant

    import engine.cast
    from engine.cast import format as cast_format
    from engine.cast import graphs
    from engine.cast.format import write_cast

    monkeypatch.setattr(graphs, "CudaGraphs", StandIn)
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [_variant()], "source": {"graph_routes": {"classes": ["Layer"], "targets": ["eager"]}}}
    path = tmp_path / "g.cast"
    write_cast(path, manifest, {}, "# test\n")
    torch.manual_seed(1)
    model = Model().to(torch.bfloat16)
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        cast = engine.cast.load(path, env=ENV, plans={"rms": Counting()})
        assert cast.graph_route_classes() == ["Layer"]
        with cast.enabled(model):
            routed = [p for p, m in model.named_modules() if isinstance(modules.route_of(m), graphs.GraphRoute)]
            assert routed == ["layers.0", "layers.1", "layers.2"]
            outs = [model(x) for _ in range(3)]
            st = cast.stats()["graph_routes"]
            summary = cast.stats()["graph_routes_summary"]
            cast.reset_stats()  # counters from now on; the graphs stay and replay at once
            outs.append(model(x))
            again = cast.stats()["graph_routes_summary"]
        assert not any(isinstance(modules.route_of(m), graphs.GraphRoute) for m in model.modules())
    assert all(torch.equal(o, want) for o in outs)
    assert all(s["captured"] == 1 and s["replays"] == 2 for s in st.values()), st
    assert summary == {"classes": ["Layer"], "modules": 3, "replaying": 3, "replays": 6, "eager_calls": 3,
                       "declines": {}, "refused": []}
    assert again["replays"] == 3 and again["eager_calls"] == 0 and again["replaying"] == 3
    # a cast without graph routes routes nothing
    plain = engine.cast.load(tmp_path / "g.cast", env=ENV, plans={"rms": Counting()})
    monkeypatch.setattr(plain, "graph_route_classes", lambda: [])
    with torch.no_grad(), plain.enabled(model):
        assert not any(isinstance(modules.route_of(m), graphs.GraphRoute) for m in model.modules())


def test_a_cast_of_graph_routes_alone_routes_the_whole_model_while_installed(tmp_path, monkeypatch):
    """The export writes a cast with no variant where only graph routes were kept (here the whole model's
    class): loaded, it installs the routes alone, and removing it gives the model back its own forward."""
    from test_cast_modules import ENV, Model

    import engine.cast
    from engine.cast import format as cast_format
    from engine.cast import graphs
    from engine.cast.format import write_cast

    monkeypatch.setattr(graphs, "CudaGraphs", StandIn)
    manifest = {"format": cast_format.FORMAT, "format_version": cast_format.FORMAT_VERSION, "env": ENV,
                "variants": [], "source": {"graph_routes": {"classes": ["Model"], "targets": ["eager"]}}}
    write_cast(tmp_path / "r.cast", manifest, {}, "# test\n")
    torch.manual_seed(1)
    model = Model().to(torch.bfloat16)
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        cast = engine.cast.load(tmp_path / "r.cast", env=ENV)
        assert cast.problem is None and cast.usable() == []
        with cast.enabled(model):
            assert isinstance(modules.route_of(model), graphs.GraphRoute)
            outs = [model(x) for _ in range(3)]
            st = cast.stats()["graph_routes"]
        assert modules.route_of(model) is None
        assert not hasattr(type(model).__dict__.get("forward"), "__kforge_original__")  # its own forward back
    assert all(torch.equal(o, want) for o in outs)
    assert st[""]["captured"] == 1 and st[""]["replays"] == 2, st


class Branches(Block):
    def forward(self, x, y):
        return self.lin(x) if x is y else self.lin(x) + y


def test_aliased_arguments_are_their_own_signature_and_a_forward_that_branches_on_them_is_refused_there():
    model, gs, backend = _routed(Branches().eval())
    x, y = _x(), _x()
    with torch.no_grad(), gs:
        model(x, y)
        model(x, y)  # separate tensors: captured, replayed
        got = model(x, x)  # the same tensor twice: another signature; its capture branches otherwise
        model(x, x)
    gs.remove()
    with torch.no_grad():
        assert _equal(got, model(x, x))
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 1 and st["replays"] == 1
    assert st["refused"] == {"#1": "the replay differs from the eager call"}


def test_the_graph_check_passes_over_classes_that_cannot_replay_and_stops_after_the_timed_tries():
    """Qwen3.5's decoder layers and MoE blocks sync with the host (their routing): a class none of whose
    modules replays costs a few forwards and does not use up a try; the check stops after `tries` timed ones."""
    from engine.export.graph_check import check

    class Capturing(StandIn):
        active = False

        def capture(self, fn):
            Capturing.active = True
            try:
                return super().capture(fn)
            finally:
                Capturing.active = False

    class Syncs(Block):
        def forward(self, x):
            if Capturing.active:  # what CUDA says to a host sync during a capture
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().forward(x)

    class Net2(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([Syncs(), Syncs()])
            self.b = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for m in list(self.a) + list(self.b):
                x = m(x)[0]
            return x

    model = Net2().eval()
    x = _x()
    timed = lambda run: (run(), 100.0)[1]  # noqa: E731  (both arms alike: never faster with confidence)
    out = check(model, lambda: model(x), ["Syncs", "Block", "Linear"], timed, max_s=0.0, backend=Capturing(), tries=1)
    assert [t["class"] for t in out["tried"]] == ["Syncs", "Block"] and out["chosen"] is None
    assert out["tried"][0]["why"] == "no route replays a graph" and "speedup" not in out["tried"][0]
    assert out["tried"][1]["why"] == "not faster with confidence"


def test_a_forward_that_takes_another_path_under_capture_is_refused_and_the_layers_inside_it_route():
    """Gemma 4 on the H200 (2026-12-04c): transformers' is_tracing() counts a CUDA stream capture as tracing,
    so under capture its mask code skips a data-dependent check and builds another mask; the graph of the
    whole model computes something else (another SDPA kernel, and for packed positions another mask). The
    whole-model route must refuse it, and the check must go on to the layers, which take the mask as an
    argument computed in eager."""
    from engine.cast.graphs import route_candidates
    from engine.export.graph_check import check

    capturing = {"now": False}  # what torch.cuda.is_current_stream_capturing() says on a GPU

    class Capturing(StandIn):
        def capture(self, fn):
            def recorded():  # a replay runs what was recorded under capture
                capturing["now"] = True
                try:
                    return fn()
                finally:
                    capturing["now"] = False
            return super().capture(recorded)

    def is_tracing():  # transformers.utils.import_utils.is_tracing, in short
        return torch.jit.is_tracing() or capturing["now"]

    class MaskedNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            if is_tracing():
                x = (x * 0.1) * 10.0  # the same value in exact arithmetic, another in its last bits
            for b in self.blocks:
                x = b(x)[0]
            return x

    model = MaskedNet().eval()
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    assert not torch.equal((x * 0.1) * 10.0, x)
    with torch.no_grad():
        want = model(x)
    classes = route_candidates(model)
    assert classes[0] == "MaskedNet" and "Block" in classes
    timed = lambda run: (run(), 100.0)[1]  # noqa: E731  (both arms alike: a timed trial, never a speedup)
    out = check(model, lambda: model(x), classes, timed, max_s=0.0, backend=Capturing(), tries=1)
    whole, layers = out["tried"][0], out["tried"][1]
    assert whole["class"] == "MaskedNet" and whole["why"] == "no route replays a graph"
    assert whole["refused"] == ["the replay differs from the eager call"] and whole["equal"]
    assert layers["class"] == "Block" and layers["replaying"] == 2 and layers["equal"] and "speedup" in layers
    with torch.no_grad():
        assert torch.equal(model(x), want)  # nothing left routed


def test_under_torch_compile_the_route_hands_dynamo_the_original_forward_without_a_graph_break(tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._dynamo.utils import counters

    model, gs, backend = _routed(Net().eval())
    x = _x()
    torch._dynamo.reset()
    breaks = sum(counters["graph_break"].values())
    with torch.no_grad(), gs:
        got = torch.compile(model, backend="eager")(x)
    gs.remove()
    with torch.no_grad():
        assert torch.allclose(got, model(x))
    assert sum(counters["graph_break"].values()) == breaks and backend.captures == 0


def test_inference_tensors_which_keep_no_version_counter_are_routed_and_a_write_to_one_is_still_seen():
    """Under inference_mode activations (and a model built there, its parameters too) are inference tensors,
    whose `_version` raises: the route read it and failed in the user's forward."""
    with torch.inference_mode():
        torch.manual_seed(0)
        model = Block().eval()
        model_w = Writes().eval()
        x = _x()
    gs = GraphSet(model, lambda path, m: isinstance(m, Block), StandIn())
    gw = GraphSet(model_w, lambda path, m: isinstance(m, Block), StandIn())
    with torch.inference_mode():
        want = model(x)
        with gs:
            got = [model(x) for _ in range(3)]
        with gw:
            for _ in range(2):
                model_w(_x())
    assert all(_equal(g, want) for g in got)
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 1 and st["replays"] == 2
    assert next(iter(gw.stats().values()))["refused"] == {"#1": "the forward writes an argument"}


def test_a_new_cast_never_shares_the_serving_token_of_a_collected_one():
    """Graph routes key their graphs by the casts installed: keyed by id(), a cast collected and a new one at
    the same address would have replayed the old one's graphs."""
    import gc
    import weakref

    from engine.cast import runtime

    class Owner:  # as a Cast: one object per loaded file
        pass

    tokens = []
    for _ in range(20):
        o = Owner()
        runtime.note_serving(o, True)
        tokens.append(runtime.serving())
        runtime.note_serving(o, False)
        gone = weakref.ref(o)
        del o
        if gone() is not None:  # held in a cycle: a full collection (0.3 s each, 20 times, in a CI worker's heap)
            gc.collect()
        assert gone() is None
    assert len(set(tokens)) == 20 and runtime.serving() == frozenset()


class StaticKV:
    """A static KV cache as transformers' StaticLayer keeps one: preallocated, written in place, its length a
    tensor too (`cumulative_length.add_`), so a graph replays every change it makes."""

    def __init__(self, length: int = 16, dim: int = 8):
        self.keys = torch.zeros(1, length, dim)
        self.cumulative_length = torch.zeros((), dtype=torch.long)
        self.max_len = length

    def update(self, k):
        pos = torch.arange(k.shape[1]) + self.cumulative_length
        self.cumulative_length.add_(k.shape[1])
        self.keys.index_copy_(1, pos, k)
        return self.keys


class Counting(StaticKV):
    def update(self, k):
        self.seen = getattr(self, "seen", 0) + 1  # Python state: a replay would not count
        return super().update(k)


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, cache):
        k = self.lin(x)
        keys = cache.update(k)
        filled = (torch.arange(cache.max_len) < cache.cumulative_length).float()
        return (keys * filled[None, :, None]).sum(1, keepdim=True) + k


def _decode(model, cache, xs):
    with torch.no_grad():
        return [model(x, cache) for x in xs]


def test_with_states_a_static_cache_is_read_and_written_in_place_by_the_replays():
    """Decode steps with a static KV cache (opt-in, `states=True`): the first step is captured, the next
    replay, and outputs and cache equal eager's step by step."""
    torch.manual_seed(0)
    model = Attn().eval()
    xs = [torch.randn(1, 1, 8) for _ in range(6)]
    want_cache = StaticKV()
    want = _decode(model, want_cache, xs)
    gs = GraphSet(model, lambda path, m: isinstance(m, Attn), StandIn(), states=True)
    cache = StaticKV()
    with gs:
        got = _decode(model, cache, xs)
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 1 and st["replays"] == 5 and not st["refused"], st
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(cache.keys, want_cache.keys) and int(cache.cumulative_length) == 6


def test_without_states_or_with_python_state_a_cache_is_not_replayed():
    torch.manual_seed(0)
    model = Attn().eval()
    xs = [torch.randn(1, 1, 8) for _ in range(3)]
    plain = GraphSet(model, lambda path, m: isinstance(m, Attn), StandIn())
    with plain:
        _decode(model, StaticKV(), xs)
    assert next(iter(plain.stats().values()))["declines"] == {"a StaticKV argument": 3}
    counting = GraphSet(model, lambda path, m: isinstance(m, Attn), StandIn(), states=True)
    want_cache, cache = Counting(), Counting()
    want = _decode(model, want_cache, xs)
    with counting:
        got = _decode(model, cache, xs)
    st = next(iter(counting.stats().values()))
    assert st["replays"] == 0 and "the forward changes a state object other than in place" in st["refused"].values()
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and cache.seen == 3
    assert torch.equal(cache.keys, want_cache.keys)  # the capture's own runs left no trace in the cache
    with counting:  # its key changes at every call: after STATE_TRIES captures none is tried for it
        _decode(model, cache, xs)
    st = next(iter(counting.stats().values()))
    assert st["declines"] == {"a state object that changes between calls": 3} and cache.seen == 6


def test_graphs_of_a_cache_that_is_gone_make_room_for_a_new_one():
    """A real graph holds no reference to the cache it was captured with (the stand-in's replay runs the
    forward again, so it does: the cache's death is set by hand here)."""
    import gc
    import weakref

    class Gone:
        pass

    torch.manual_seed(0)
    model = Attn().eval()
    x = torch.randn(1, 1, 8)
    gs = GraphSet(model, lambda path, m: isinstance(m, Attn), StandIn(), max_graphs=1, states=True)
    with gs:
        _decode(model, StaticKV(), [x, x])
        dead = Gone()
        ref = weakref.ref(dead)
        del dead
        gc.collect()
        route = next(iter(gs.routes.values()))
        _decode(model, StaticKV(), [x])  # the one graph's cache lives: no room
        assert route.stats.declines == {"graphs per module used up": 1}
        for g in route.graphs.values():
            g.states = (ref,)  # as a real graph's cache, collected
        _decode(model, StaticKV(), [x, x])
    st = next(iter(gs.stats().values()))
    assert st["captured"] == 2 and st["replays"] == 2, st


class Source(nn.Module):
    """Writes the cache and hands its keys on in a mapping, as Gemma 4's last non-shared layers do."""

    def __init__(self):
        super().__init__()
        self.attn = Attn()

    def forward(self, x, cache, shared):
        y = self.attn(x, cache)
        shared["kv"] = cache.keys
        return y


class Sharer(nn.Module):
    """Reads the keys another layer handed on (Gemma 4's KV-shared layers), with the cache among its arguments."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, cache, shared):
        return self.lin(x) + shared["kv"].sum(1, keepdim=True) * cache.cumulative_length


class Shares(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Source(), Sharer()

    def forward(self, x, cache):
        shared: dict = {}
        return self.b(self.a(x, cache, shared), cache, shared)


def test_with_states_a_cache_tensor_handed_on_in_a_mapping_is_passed_by_reference():
    torch.manual_seed(0)
    model = Shares().eval()
    xs = [torch.randn(1, 1, 8) for _ in range(5)]
    want_cache = StaticKV()
    want = _decode(model, want_cache, xs)
    gs = GraphSet(model, lambda path, m: isinstance(m, (Source, Sharer)), StandIn(), states=True)
    cache = StaticKV()
    with gs:
        got = _decode(model, cache, xs)
    st = gs.stats()
    assert all(s["captured"] == 1 and s["replays"] == 4 and not s["refused"] for s in st.values()), st
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(cache.keys, want_cache.keys)


def test_a_copy_of_the_model_made_while_routed_is_a_plain_model():
    """Copying (or pickling) a model while its graph routes were installed raised (the route's lock); a copy
    now runs its own forward with its own weights, and holds no route."""
    import copy
    import pickle

    model = Net().eval()
    gs = GraphSet(model, lambda path, m: isinstance(m, Block), StandIn())
    x = _x()
    with torch.no_grad(), gs:
        model(x)
        twin = copy.deepcopy(model)
        restored = pickle.loads(pickle.dumps(model))
        twin.blocks[0].lin.weight.add_(1)
        got = twin(x)
        assert torch.equal(restored(x), model(x))
    assert torch.equal(got, twin(x))
    assert not any(modules.route_of(m) for m in (*twin.modules(), *restored.modules()))


class _Mul(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, alpha):
        return self.lin(x) * alpha


def test_a_float_zero_argument_is_keyed_with_its_sign():
    """0.0 == -0.0 (and hash alike), so a graph captured with alpha=0.0 was replayed for alpha=-0.0: `h * alpha`
    gave +0 where eager gives -0 (and 1/out +inf for -inf)."""
    model = _Mul().eval()
    backend = StandIn()
    gs = GraphSet(model, lambda path, m: isinstance(m, _Mul), backend)
    x = _x()
    with torch.no_grad(), gs:
        model(x, 0.0)
        got = model(x, -0.0)
        again = model(x, -0.0)
    want = model(x, -0.0)
    assert torch.equal(torch.signbit(got), torch.signbit(want)) and torch.equal(torch.signbit(again), torch.signbit(want))
    assert gs.stats()[""]["captured"] == 2 and gs.stats()[""]["replays"] == 1


def test_forward_mode_ad_declines():
    """A dual input (torch.autograd.forward_ad) requires no grad, so a replay served it, and its fresh outputs carry
    no tangent: the JVP came back None."""
    import torch.autograd.forward_ad as fwAD

    model, gs, backend = _routed()
    x, t = _x(), _x()
    with torch.no_grad(), fwAD.dual_level():
        want = fwAD.unpack_dual(model(fwAD.make_dual(x, t))[0]).tangent
    with torch.no_grad(), gs:
        model(x)
        with fwAD.dual_level():
            got = fwAD.unpack_dual(model(fwAD.make_dual(x, t))[0]).tangent
    assert got is not None and torch.allclose(got, want)
    assert gs.stats()[""]["declines"] == {"forward AD": 1}


class _Filled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) + torch.full((8,), 0.1)  # a tensor of the default dtype


def test_a_changed_default_dtype_declines():
    """`torch.full(shape, 0.1)` is made in the default dtype and promotes the output: after
    torch.set_default_dtype(torch.float64) eager returns float64, and the replay returned the capture's float32."""
    model = _Filled().eval()
    gs = GraphSet(model, lambda path, m: isinstance(m, _Filled), StandIn())
    x = _x()
    was = torch.get_default_dtype()
    with torch.no_grad(), gs:
        model(x)
        try:
            torch.set_default_dtype(torch.float64)
            got = model(x)
        finally:
            torch.set_default_dtype(was)
    assert got.dtype == torch.float64
    assert gs.stats()[""]["declines"] == {"kernel switches changed": 1}


def test_a_nan_float_argument_is_one_signature():
    """NaN != NaN, so each call with alpha=nan was a new signature: captured again, call after call, until the
    module's graphs were used up. NaN is one key; the replay gives eager's NaNs."""
    model = _Mul().eval()
    backend = StandIn()
    gs = GraphSet(model, lambda path, m: isinstance(m, _Mul), backend)
    x = _x()
    with torch.no_grad(), gs:
        for _ in range(4):
            got = model(x, float("nan"))
    assert bool(torch.isnan(got).all())
    assert gs.stats()[""]["captured"] == 1 and gs.stats()[""]["replays"] == 3
