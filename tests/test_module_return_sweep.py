"""A module card serves its module only where the module's forward returns the one tensor its chain makes (the
module-return sweep): small models (tests/module_return_models.py) captured with the real chain-card path on the CPU,
every module card they bind exported as `export` does and installed with eager (`run_chain`) as its plan; the model's
output with the cast must equal its output without, leaf for leaf and bitwise. A bound card that changes the output
is a finding; so is a legitimate module card (an RMSNorm, a LayerNorm, a gate) that no longer binds or is not served.

The whole sweep (every pattern x 3 seeds, or --seeds N) is scripts/module_return_sweep.py; the test runs each pattern
at one seed. What it found, each with its own test below: forwards returning anything but the chain's output bound
(a tuple, a dict, None, the input...); a module called twice in a row bound with the chain of both calls; a forward
keeping a tensor on its module, or writing into an argument it was passed, bound as if it changed nothing; a dict
argument bound by its repr, which made cast.install raise."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from module_return_models import LEGIT, PATTERNS

ENV = {"torch": torch.__version__, "torch_minor": ".".join(torch.__version__.split(".")[:2]), "cuda": "13.0",
       "gpu": "NVIDIA H200", "arch": "sm_90", "compute_capability": [9, 0], "driver": "13.0", "nvrtc": "13.0"}


def _bound(card: Any) -> bool:
    """A module card the capture bound (a card whose sampling forward differed keeps kind 'module', unbound)."""
    return card.chain.get("kind") == "module" and "args" in card.chain


def captured(model: torch.nn.Module, args: tuple) -> Any:
    """The chain cards of one forward of `model`, sampled and bound as a capture binds them (ChainCards)."""
    from engine.capture.chain_cards import MemberTrace, chain_cards, sample_chains
    from engine.capture.recorder import CaptureMode, ModulePaths

    paths = ModulePaths(model, {})
    mode = CaptureMode(path_of=paths.current, weight_of=paths.weight, samples=0, sample_budget_bytes=0,
                       sink=None, use_cuda_events=False)
    trace = MemberTrace(paths.current, mode, entered=paths.entered)
    with paths, torch.no_grad(), mode, trace:
        model(*args)
    trace.resolve_times()
    found = chain_cards(trace, model, paths.weight, 1.0, samples=1, sample_budget_bytes=1 << 30,
                        total_budget_bytes=1 << 30)
    with tempfile.TemporaryDirectory() as folder:  # the samples are not what is checked here
        sample_chains(lambda: model(*args), found, trace.calls, Path(folder), model=model)
    return found


class EagerPlan:
    """A module card's plan that computes what its chain computes (eager, exact), counting its calls."""

    def __init__(self, signature: dict[str, Any]):
        self.signature, self.calls = signature, 0

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        from engine.capture.chains import run_chain

        self.calls += 1
        return run_chain(self.signature, inputs)


def difference(a: Any, b: Any, where: str = "output") -> str | None:
    """Where two model outputs differ (structure, type, or a tensor's values bitwise), or None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} with the cast, {type(b).__name__} without"
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{where}: {a.dtype}{list(a.shape)} with the cast, {b.dtype}{list(b.shape)} without"
        return None if torch.equal(a, b) else f"{where}: values differ"
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} with the cast, {type(b).__name__} without"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} with the cast, {list(b)} without"
        pairs = [(a[k], b[k], f"{where}[{k!r}]") for k in a]
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items with the cast, {len(b)} without"
        pairs = [(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
    elif hasattr(a, "__dataclass_fields__"):
        pairs = [(getattr(a, k), getattr(b, k), f"{where}.{k}") for k in a.__dataclass_fields__]
    else:
        return None if a == b else f"{where}: {a!r} with the cast, {b!r} without"
    return next((d for x, y, w in pairs if (d := difference(x, y, w)) is not None), None)


def served(model: torch.nn.Module, args: tuple, found: Any, folder: Path) -> tuple[Any, dict[str, int], list[str]]:
    """The model's output with every bound module card of `found` exported, loaded with an eager plan and
    installed: (output, hits per module path, the install's warnings)."""
    import warnings

    from test_chain_lane import RMS_CHAIN_CU, RMS_CHAIN_SPEC

    import engine.cast
    from engine.cast.format import write_cast
    from engine.export.package import ExportVariant, package

    cand = {"id": "cand-1", "source": RMS_CHAIN_CU, "launch_spec": RMS_CHAIN_SPEC, "proposer": "test",
            "status": "verified"}
    rows = [c.row() for c in found.cards if c.chain.get("kind") == "module"]
    manifest, files, report = package([ExportVariant(r, {**cand, "id": f"cand-{i}"}, None, "// ptx", "sm_90")
                                       for i, r in enumerate(rows)], ENV, {"run": "r"})
    entries = [v for v in manifest["variants"] if v.get("module")]
    if not entries:
        with torch.no_grad():
            return model(*args), {}, []
    path = folder / "sweep.cast"
    write_cast(path, manifest, files, report)
    cast = engine.cast.load(path, env=ENV, plans={v["id"]: EagerPlan(v["signature"]) for v in entries})
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            cast.install(model)
        with torch.no_grad():
            out = model(*args)
        hits = {p: s["hits"] for p, s in cast.stats()["modules"].items()}
    finally:
        cast.remove()
    return out, hits, [str(w.message) for w in seen]


def problems(name: str, seed: int, folder: Path) -> tuple[list[str], int]:
    """Every finding for PATTERNS[name] at `seed`, and how many module cards the capture bound."""
    def build() -> tuple[torch.nn.Module, tuple]:  # the same model and inputs, never run before
        return PATTERNS[name](seed, torch.Generator().manual_seed(seed))

    found = captured(*build())
    bound = [c for c in found.cards if _bound(c)]
    model, args = build()
    with torch.no_grad():
        want = model(*args)
    out = []
    try:
        got, hits, warned = served(*build(), found, folder)
    except Exception as e:  # noqa: BLE001 - the model failing under the cast is a finding too
        return [f"{name} seed {seed}: with the cast the model raised {type(e).__name__}: {str(e)[:200]}; bound "
                f"{[c.chain.get('class') for c in bound]}"], len(bound)
    if (d := difference(got, want)) is not None:
        out.append(f"{name} seed {seed}: the cast changed the model's output ({d}); bound "
                   f"{[c.chain.get('class') for c in bound]}")
    if name in LEGIT:
        if not bound:
            notes = [v for k, v in found.notes.items() if k.startswith("module card")]
            out.append(f"{name} seed {seed}: no module card bound ({notes or 'no module card found'})")
        elif not any(hits.values()):
            out.append(f"{name} seed {seed}: its module card was never served ({warned})")
    return out, len(bound)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_a_bound_module_card_never_changes_what_the_model_returns(tmp_path, name):
    found, _ = problems(name, 0, tmp_path)
    assert not found, "\n".join(found)


def _notes(found: Any) -> list[str]:
    return [v for k, v in found.notes.items() if k.startswith("module card")]


def test_a_module_that_returns_a_tuple_ships_as_a_pattern_card_and_the_notes_say_why(tmp_path):
    # `h = sigmoid(x * w); y = h * x + 1; return h, y`: h is read inside the chain, so y is its one output, and the
    # card bound as the Gate's module card: served, `h, y = gate(x)` got the tensor y and unpacked it along dim 0,
    # wrong values and no error. What a forward returns must be, by identity, the tensor the chain makes.
    model, args = PATTERNS["returns (h, y)"](0, torch.Generator().manual_seed(0))
    found = captured(model, args)
    (card,) = [c for c in found.cards if c.chain.get("module_class") == "Gate" and c.chain.get("modules")]
    assert card.chain["kind"] == "pattern" and "args" not in card.chain
    assert card.chain["unbound"] == "its forward returns a tuple, not the chain's output tensor alone (a cast " \
                                    "would return that tensor)"
    (note,) = _notes(found)
    assert note.startswith("no module binding, ships as a pattern card: its forward returns a tuple")
    got, hits, _ = served(*PATTERNS["returns (h, y)"](0, torch.Generator().manual_seed(0)), found, tmp_path)
    assert hits == {}


@pytest.mark.parametrize("name, why", [
    ("returns {y}", "returns a dict"),
    ("returns Output", "returns a Output object"),
    ("returns (y, y)", "returns a tuple"),
    ("returns None, result in a list", "returns None"),
    ("returns its input, keeps a statistic", "returns a tensor that is not the chain's output (an input, a "
                                             "parameter, or a tensor made by a call outside the chain)"),
])
def test_a_forward_returning_anything_but_the_chain_output_is_not_bound(name, why):
    found = captured(*PATTERNS[name](0, torch.Generator().manual_seed(0)))
    assert not [c for c in found.cards if _bound(c)]
    assert any(why in n for n in _notes(found)), found.notes


def test_one_instance_returning_more_than_the_output_unbinds_the_card_of_its_class():
    # Two instances of one class, one of which returns (y, h) (a flag set after construction): the card is proven
    # on both, so neither is served; the other instance alone would have been served with the tensor.
    found = captured(*PATTERNS["return differs between instances"](0, torch.Generator().manual_seed(0)))
    (card,) = [c for c in found.cards if c.chain.get("module_class") == "PerInstance" and c.chain.get("modules")]
    assert card.chain["kind"] == "pattern" and "returns a tuple" in card.chain["unbound"]


@pytest.mark.parametrize("name", ["rms bf16", "view made last", "returns y.data"])
def test_a_forward_returning_its_chain_output_still_binds(name):
    # The output by identity: the tensor its last member made, a view the forward makes last (the view is the
    # member), `.data` (an `aten::detach` member under the trace).
    found = captured(*PATTERNS[name](0, torch.Generator().manual_seed(0)))
    assert [c.chain["paths"] for c in found.cards if _bound(c)] == [
        ["layers.0.inner", "layers.1.inner"]]
    assert not _notes(found)


GATE_MODEL = '''
import torch


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32))

    def forward(self, x):
        h = torch.sigmoid(x * self.w)
        return h, h * x + 1.0


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g1, self.lin1, self.g2, self.lin2 = Gate(), torch.nn.Linear(32, 32), Gate(), torch.nn.Linear(32, 32)

    def forward(self, x):
        h1, y = self.g1(x)
        h2, y = self.g2(self.lin1(y))
        return self.lin2(y), h1, h2


def build(device, dtype):
    torch.manual_seed(0)
    model = Model().to(device=device, dtype=dtype).eval()
    return model, (torch.randn(2, 5, 32, device=device, dtype=dtype),)
'''


def test_a_capture_of_a_module_returning_a_tuple_says_it_ships_as_a_pattern_card(tmp_path):
    # The whole capture (its captured forward samples and binds the chains the warm-up planned): the same check.
    from card_helpers import capture_source

    result = capture_source(tmp_path, "gate", GATE_MODEL)
    gates = [c for c in result.chains if c.chain.get("module_class") == "Gate" and c.chain.get("modules")]
    assert gates and all(c.chain["kind"] == "pattern" for c in gates), [c.chain for c in gates]
    assert any("its forward returns a tuple" in v for k, v in result.notes.items() if k.startswith("module card")), \
        result.notes


def test_a_module_called_twice_in_a_row_is_a_module_card_of_one_call():
    # `for _ in range(2): x = self.child(x)`: no other module's call between the two, so the trace saw one invocation,
    # the chain of both calls was the child's module card, and the cast ran both at each call (GELU four times).
    found = captured(*PATTERNS["gelu called twice in a row"](0, torch.Generator().manual_seed(0)))
    (card,) = [c for c in found.cards if _bound(c)]
    assert card.chain["ops"] == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
    assert card.captured_calls == 4 and card.chain["paths"] == ["layers.0.inner.child", "layers.1.inner.child"]


def test_a_block_called_twice_in_a_row_whose_chain_spans_both_calls_is_not_bound():
    # A block making no call of its own (norm then activation children), called twice in a row: its calls are its
    # children's, so the trace cannot tell the two calls apart, and the chain of both was bound to the block.
    found = captured(*PATTERNS["norm+act block called twice in a row"](0, torch.Generator().manual_seed(0)))
    (card,) = [c for c in found.cards if c.chain.get("module_class") == "NormAct" and c.chain.get("modules")]
    assert card.chain["kind"] == "pattern" and "runs on into the next call of its module's forward" in \
        card.chain["unbound"]
    assert [c.chain["class"] for c in found.cards if _bound(c)] == ["RMS"]


@pytest.mark.parametrize("name, changed", [("keeps its output as an attribute", "last"),
                                           ("appends its output to a list it keeps", "history")])
def test_a_forward_that_keeps_a_tensor_on_its_module_is_not_bound(name, changed):
    # `self.last = y; return y`: the module holds a tensor, so its state has no plain description (None before and
    # after the forward) and the check of changed attributes saw none; a cast skipped the forward, and the caller
    # reading `inner.last` got the previous call's tensor (or, in a model not run before, an AttributeError).
    found = captured(*PATTERNS[name](0, torch.Generator().manual_seed(0)))
    assert not [c for c in found.cards if _bound(c)]
    assert any(f"its forward changes the module's own attributes (0.inner: {changed})" in n for n in _notes(found)), \
        found.notes


def test_a_plain_attribute_set_to_the_same_value_at_each_call_is_no_change():
    found = captured(*PATTERNS["sets a plain attribute alike at each call"](0, torch.Generator().manual_seed(0)))
    assert [c.chain["class"] for c in found.cards if _bound(c)] == ["ScaleSetEachCall"]


def _exported(found: Any) -> tuple[dict[str, Any], dict[str, bytes], str]:
    from test_chain_lane import RMS_CHAIN_CU, RMS_CHAIN_SPEC

    from engine.export.package import ExportVariant, package

    (card,) = [c for c in found.cards if _bound(c)]
    cand = {"id": "cand-1", "source": RMS_CHAIN_CU, "launch_spec": RMS_CHAIN_SPEC, "proposer": "test",
            "status": "verified"}
    return package([ExportVariant(card.row(), cand, None, "// ptx", "sm_90")], ENV, {"run": "r"})



def exported_cast(found: Any, folder: Path, name: str = "sweep.cast") -> tuple[Path, list[dict[str, Any]]] | None:
    """Every bound module card of `found` in one cast file (as `export` writes it), and its module entries."""
    from test_chain_lane import RMS_CHAIN_CU, RMS_CHAIN_SPEC

    from engine.cast.format import write_cast
    from engine.export.package import ExportVariant, package

    rows = [c.row() for c in found.cards if _bound(c)]
    if not rows:
        return None
    cand = {"source": RMS_CHAIN_CU, "launch_spec": RMS_CHAIN_SPEC, "proposer": "test", "status": "verified"}
    manifest, files, report = package([ExportVariant(r, {**cand, "id": f"cand-{i}"}, None, "// ptx", "sm_90")
                                       for i, r in enumerate(rows)], ENV, {"run": "r"})
    entries = [v for v in manifest["variants"] if v.get("module")]
    path = folder / name
    write_cast(path, manifest, files, report)
    return path, entries

def test_an_exported_module_card_records_that_its_return_was_checked_and_audit_names_casts_without():
    # A cast exported before the capture checked returns may hold a module card that returns a tuple; the loader
    # still serves it (declining every module card of every older cast would cost all their speed), and audit says
    # its return value was not checked.
    import copy

    from engine.cast.format import CastError, check_manifest
    from engine.export.report import audit_document, audit_text

    manifest, _, _ = _exported(captured(*PATTERNS["rms fp32"](0, torch.Generator().manual_seed(0))))
    assert manifest["variants"][0]["module"]["returns"] == "output"
    check_manifest(manifest)
    assert "return value" not in audit_text(audit_document(manifest, {}), "new.cast")
    old = copy.deepcopy(manifest)
    del old["variants"][0]["module"]["returns"]
    check_manifest(old)
    assert "return value: not checked against the chain's output (the cast predates that check)" in \
        audit_text(audit_document(old, {}), "old.cast")
    assert "what it holds" not in audit_text(audit_document(manifest, {}), "new.cast")
    del old["variants"][0]["module"]["held"]  # nor what its instances held (a config read at each call)
    check_manifest(old)
    assert "what it holds: not compared with the proof's (the cast predates that record)" in \
        audit_text(audit_document(old, {}), "old.cast")
    bad = copy.deepcopy(manifest)
    bad["variants"][0]["module"]["held"] = {":eps": 1e-6}
    with pytest.raises(CastError, match="'held' is not a list of attribute tables"):
        check_manifest(bad)
    bad = copy.deepcopy(manifest)
    bad["variants"][0]["module"]["returns"] = "tuple"
    with pytest.raises(CastError, match="'returns' is not 'output'"):
        check_manifest(bad)


@pytest.mark.parametrize("name, why", [
    ("appends its output to a list argument", "its forward changes argument 1 it was passed (a list appended to or "
                                              "written into), which the cast's kernel would skip"),
    ("puts its output in a dict argument", "argument 1 of the forward is a dict, which the cast's guard cannot "
                                           "compare"),
])
def test_a_forward_that_writes_into_an_argument_it_was_passed_is_not_bound(name, why):
    # `forward(x, cache)` putting its output in the list or dict its caller passes and reads: served, the caller's
    # `cache[0]` raised IndexError (a list compares by value, and a fresh [] equals the proven one); a dict was
    # bound by its repr, `{"repr": "{}"}`, which no install can read back: cast.install raised ValueError.
    found = captured(*PATTERNS[name](0, torch.Generator().manual_seed(0)))
    assert not [c for c in found.cards if _bound(c)]
    assert any(why in n for n in _notes(found)), found.notes


def test_a_cast_whose_module_entry_holds_an_unreadable_argument_installs_without_it(tmp_path):
    # A cast exported before the capture refused such arguments: its entry stays on PyTorch, with a warning, and
    # the other entries install (cast.install raised ValueError and installed nothing).
    import warnings

    import engine.cast
    from engine.cast.format import write_cast

    manifest, files, report = _exported(captured(*PATTERNS["rms fp32"](0, torch.Generator().manual_seed(0))))
    (entry,) = manifest["variants"]
    entry["module"]["args"].append({"value": {"repr": "{}"}})
    path = tmp_path / "old.cast"
    write_cast(path, manifest, files, report)
    cast = engine.cast.load(path, env=ENV, plans={entry["id"]: EagerPlan(entry["signature"])})
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            cast.install(PATTERNS["rms fp32"](0, torch.Generator().manual_seed(0))[0])
        assert cast.stats()["modules"] == {}
    finally:
        cast.remove()
    assert any("argument 1 is a value the guard cannot compare ({'repr': '{}'})" in str(w.message) for w in seen), \
        [str(w.message) for w in seen]


def test_a_flag_of_a_config_the_module_holds_set_after_install_runs_the_forward(tmp_path):
    # `return (y, h) if self.config.return_gate else y`: served as proven while the flag is off; set after install,
    # the route went on returning the tensor where the forward returns a tuple (the guard held the module's own
    # plain attributes and its submodules', not those of a config object it holds).
    from module_return_models import configured

    import engine.cast
    from engine.cast.format import write_cast

    manifest, files, report = _exported(captured(*configured(0, torch.Generator().manual_seed(0))))
    path = tmp_path / "configured.cast"
    write_cast(path, manifest, files, report)
    (entry,) = manifest["variants"]
    model, args = configured(0, torch.Generator().manual_seed(0))
    cast = engine.cast.load(path, env=ENV, plans={entry["id"]: EagerPlan(entry["signature"])})
    try:
        cast.install(model)
        with torch.no_grad():
            model(*args)  # the flag off: served, as proven
        model.layers[0].inner.config.return_gate = True  # the config both layers hold
        with torch.no_grad():
            got = model(*args)
        st = cast.stats()["modules"]
    finally:
        cast.remove()
    with torch.no_grad():
        want = model(*args)
    assert difference(got, want) is None
    assert {p: (s["hits"], s["declines"]) for p, s in st.items()} == {
        p: (1, {"held object's attributes changed": 1}) for p in ("layers.0.inner", "layers.1.inner")}


@pytest.mark.parametrize("changed", [{"act": "silu"}, {"scale": 2.0}])
def test_a_model_built_with_another_config_than_the_proven_one_runs_its_forward(tmp_path, changed):
    # The module holds a config and reads it at each call. Its `states` cannot be recorded (a config is no plain
    # value), so the install held the config as it found it: a cast proven with `act="gelu"` served a model built
    # with `act="silu"` with the GELU chain, and one built with `scale=2.0` with scale 1.0.
    from module_return_models import config_act

    import engine.cast
    from engine.cast.format import CastWarning, write_cast

    manifest, files, report = _exported(captured(*config_act(0, torch.Generator().manual_seed(0))))
    (entry,) = manifest["variants"]
    assert entry["module"]["held"] == [entry["module"]["held"][0]]  # both layers hold the one config
    assert entry["module"]["held"][0][":config.act"] == "gelu"
    path = tmp_path / "config.cast"
    write_cast(path, manifest, files, report)
    model, args = config_act(0, torch.Generator().manual_seed(0), **changed)
    plan = EagerPlan(entry["signature"])
    cast = engine.cast.load(path, env=ENV, plans={entry["id"]: plan})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cast.install(model)
    try:
        with torch.no_grad():
            got = model(*args)
        st = cast.stats()["modules"]
    finally:
        cast.remove()
    with torch.no_grad():
        want = model(*args)
    assert difference(got, want) is None
    assert plan.calls == 0 and st == {}
    (k, v), = changed.items()
    msgs = [str(w.message) for w in seen if issubclass(w.category, CastWarning)]
    assert any(f"what it holds differs from the proven module's: :config.{k} {v!r}" in m for m in msgs), msgs

    # the same config as proven: served
    model, args = config_act(0, torch.Generator().manual_seed(0))
    cast = engine.cast.load(path, env=ENV, plans={entry["id"]: EagerPlan(entry["signature"])})
    try:
        cast.install(model)
        with torch.no_grad():
            got = model(*args)
        st = cast.stats()["modules"]
    finally:
        cast.remove()
    with torch.no_grad():
        want = model(*args)
    assert difference(got, want) is None
    assert {p: s["hits"] for p, s in st.items()} == {"layers.0.inner": 1, "layers.1.inner": 1}


def test_a_forward_that_counts_its_calls_in_an_object_it_holds_is_no_module_card():
    # `self.stats.calls += 1`: the module's own attributes were compared before and after its forward, not those
    # of the objects it holds, so it bound, and a cast serving it would leave the count where it was.
    from module_return_models import counting

    found = captured(*counting(0, torch.Generator().manual_seed(0)))
    assert not [c for c in found.cards if _bound(c)]
    notes = [v for k, v in found.notes.items() if k.startswith("module card CountingGate")]
    assert notes and "stats.calls" in notes[0], found.notes


def test_what_a_module_holds_is_described_without_raising_for_odd_objects():
    # The capture reads the attributes of every object a module holds, at each forward of each module: an object
    # whose __getattr__ raises something else than AttributeError, or a list holding itself, must not break it.
    from engine.capture.module_binding import attributes_held, class_name, held_description

    class Odd:
        __slots__ = ("x",)

        def __getattr__(self, name):
            raise KeyError(name)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            loop: list = []
            loop.append(loop)
            self.odd, self.loop, self.cfg = Odd(), loop, type("Cfg", (), {})()
            self.cfg.eps, self.cfg.loop = 1e-5, loop

    m = Holder()
    from engine.capture.module_binding import class_digest

    # the odd object by its class (its slot unset, its __getattr__ not asked), the list holding itself down to where
    # it holds itself, the config's plain attribute by value
    assert held_description(m) == {
        ":__class__": {"class": class_name(Holder), "code": class_digest(Holder)}, ":odd": {"object": class_name(Odd)},
        ":loop": [{"opaque": "builtins.list"}], ":cfg": {"object": class_name(type(m.cfg))}, ":cfg.eps": 1e-5,
        ":cfg.loop": [{"opaque": "builtins.list"}], "torch:default_dtype": {"torch": "torch.float32"}}
    assert set(attributes_held(m)) >= {"odd", "loop", "cfg", "cfg.eps", "cfg.loop"}


def test_a_list_holding_an_object_that_holds_the_list_is_held_without_recursing():
    from engine.capture.module_binding import attributes_held

    class Node:
        pass

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            n = Node()
            self.items = [n]
            n.back = self.items

    attributes_held(Holder())  # returns (it recursed without end before)
