"""A cast proven on model A, installed into a model B that differs from A in one construction detail, must never change
what B computes (the install near-miss sweep): tests/install_near_miss_models.py pairs A and B, each captured with the
real chain-card path on the CPU, every module card A binds exported as `export` does and installed into B with eager
(`run_chain`) as its plan; B's output with the cast must equal its output without, bitwise. Where B is A (a control)
the cast must serve it. A miss elsewhere costs only speed.

The whole sweep (every case x 3 seeds, or --seeds N) is scripts/install_near_miss_sweep.py; the test runs each case at
one seed. What it found, each with its own test below."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from install_near_miss_models import CASES
from test_module_return_sweep import ENV, EagerPlan, _bound, captured, difference, exported_cast


def _cast(found: Any, folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """Every bound module card of `found` in one cast file, and each module entry's signature by its id."""
    made = exported_cast(found, folder, "near-miss.cast")
    return None if made is None else (made[0], {v["id"]: v["signature"] for v in made[1]})

def _run(case: Any, model: torch.nn.Module, args: tuple) -> Any:
    torch.manual_seed(1234)  # a Dropout draws alike with and without the cast
    with torch.no_grad(), case.mode():
        return model(*args)


def outcome(name: str, seed: int, folder: Path) -> tuple[list[str], dict[str, Any]]:
    """The findings for CASES[name] at `seed` (the cast changed B's output; a control not served), and what happened:
    {"bound": module cards A bound, "hits": B's hits by path, "warned": the install's warnings}."""
    import engine.cast

    case = CASES[name]
    found = captured(*case.a(seed, torch.Generator().manual_seed(seed)))
    made = _cast(found, folder)
    info: dict[str, Any] = {"bound": len([c for c in found.cards if _bound(c)]), "hits": {}, "declines": {},
                            "warned": []}
    if made is None:
        return [f"{name} seed {seed}: model A bound no module card ({found.notes})"], info
    path, signatures = made
    out = []
    with case.env():
        model, args = case.b(seed, torch.Generator().manual_seed(seed))
        cast = engine.cast.load(path, env=ENV, plans={k: EagerPlan(s) for k, s in signatures.items()})
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                cast.install(model)
            info["warned"] = [str(w.message) for w in seen]
            run = model
            if case.after is not None:
                got = case.after(model)
                run = got if isinstance(got, torch.nn.Module) else model
            try:
                got = _run(case, run, args)
            except Exception as e:  # noqa: BLE001 - the model failing under the cast is a finding too
                got = e
            info["hits"] = {p: s["hits"] for p, s in cast.stats()["modules"].items()}
            info["declines"] = {p: s["declines"] for p, s in cast.stats()["modules"].items() if s["declines"]}
        finally:
            cast.remove()
        want = _run(case, run, args)
    if isinstance(got, Exception):
        out.append(f"{name} seed {seed}: with the cast B raised {type(got).__name__}: {str(got)[:200]}")
    elif (d := difference(got, want)) is not None:
        out.append(f"{name} seed {seed}: the cast changed B's output ({d}); hits {info['hits']}")
    if case.served and (not any(info["hits"].values()) or info["declines"]):
        out.append(f"{name} seed {seed}: B is A, and the cast did not serve it (hits {info['hits']}, declines "
                   f"{info['declines']}, {info['warned']})")
    return out, info


@pytest.mark.parametrize("name", list(CASES))
def test_a_cast_proven_on_a_never_changes_what_b_computes(tmp_path, name):
    found, _ = outcome(name, 0, tmp_path)
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------ what the sweep found
# Each case below was served before its fix, and the cast changed B's output (the sweep's case names say how B
# differs from A). Now: declined, at install with a warning saying what differs, or at the call with a reason.

INNER = ("layers.0.inner", "layers.1.inner")


def _installed_elsewhere(tmp_path: Path, name: str, paths: tuple[str, ...] = INNER) -> dict[str, Any]:
    found, info = outcome(name, 0, tmp_path)
    assert not found, "\n".join(found)
    assert not any(info["hits"].get(p) for p in paths), info
    return info


def _declined_at_install(tmp_path: Path, name: str, why: str, paths: tuple[str, ...] = INNER) -> None:
    info = _installed_elsewhere(tmp_path, name, paths)
    assert any(why in w for w in info["warned"]), info["warned"]


def _declined_at_call(tmp_path: Path, name: str, why: str, paths: tuple[str, ...] = INNER) -> None:
    info = _installed_elsewhere(tmp_path, name, paths)
    assert all(info["declines"].get(p) == {why: 1} for p in paths), info["declines"]


@pytest.mark.parametrize("name, why", [
    ("held function gelu vs silu", ":act {'function': 'torch.nn.functional.silu'"),
    ("held partial approximate", "'keywords': {'dict': {'approximate': 'tanh'}}"),
    ("held lambda", ":act {'function': 'install_near_miss_models.<lambda>', 'code': "),
    ("held callable object", ":act.k 2.0 (proven 1.0)"),
    ("held method of an unregistered module", "'of': {'module': 'torch.nn.modules.activation.GELU', 'state': "
                                              "{'approximate': 'tanh'}}"),
    ("child with a bound-method activation", "act:act {'method': {'function': "
                                             "'install_near_miss_models.GELUActivation._gelu_python'"),
])
def test_a_function_the_module_holds_is_compared_with_the_proven_one(tmp_path, name, why):
    # `self.act = F.gelu` (a partial, a lambda, a callable object, transformers' GELUActivation holding a bound
    # method): no plain value, so the module had no `states`, and what it holds left the function out; a cast proven
    # with F.gelu served a model built with F.silu.
    _declined_at_install(tmp_path, name, why)


@pytest.mark.parametrize("name", ["held function set after install", "held partial changed after install",
                                  "config replaced after install", "nested config changed after install",
                                  "slots config changed after install"])
def test_a_function_or_config_the_module_holds_changed_after_install_runs_the_forward(tmp_path, name):
    # The guard held the plain attributes of the objects a module holds one level down, not the objects themselves
    # (a function swapped, a config replaced), a partial's keywords, a config's own configs, or an object with slots.
    _declined_at_call(tmp_path, name, "held object's attributes changed")


@pytest.mark.parametrize("name, why", [
    ("nested config act", ":config.text_config.act 'silu' (proven 'gelu')"),
    ("slots config", ":config.act 'silu' (proven 'gelu')"),
    ("frozen slots dataclass", ":config.act 'silu' (proven 'gelu')"),
    ("object config in a list", ":config [{'object': 'types.SimpleNamespace', 'attrs': {'act': 'silu'"),
])
def test_a_nested_or_slotted_config_is_compared_with_the_proven_one(tmp_path, name, why):
    # `self.config.text_config.act`, a `__slots__` config, a slotted frozen dataclass, configs in a list: what a
    # module holds was read one level down and from a __dict__ only, so these were not compared at all.
    _declined_at_install(tmp_path, name, why)


@pytest.mark.parametrize("name, why", [
    ("frozenset mode", ":mode {'set': ['\"silu\"']}"),
    ("int scale 2 vs 2.0 (int input)", "scale 2.0 (proven 2)"),
])
def test_a_set_or_a_number_of_another_type_is_compared_with_the_proven_one(tmp_path, name, why):
    # A frozenset of modes was no plain value (not compared); 2 == 2.0 as Python compares them, but `x * 2` of an
    # integer tensor is an integer tensor and `x * 2.0` a float one: the cast returned int64 where B returns float32.
    _declined_at_install(tmp_path, name, why, ("a", "b") if name.startswith("int") else INNER)


@pytest.mark.parametrize("name", ["set mode changed after install", "int scale set to 2.0 after install"])
def test_a_set_changed_in_place_or_a_number_retyped_after_install_runs_the_forward(tmp_path, name):
    # (the second IntScaled is then given the first's float output: a signature not proven, a miss)
    _declined_at_call(tmp_path, name, "attributes changed", ("a",) if name.startswith("int") else INNER)


@pytest.mark.parametrize("name, why", [
    ("class attribute SCALE", ":__class__.SCALE 2.0 (proven 1.0)"),
    ("class attribute ACT", ":__class__.ACT 'silu' (proven 'gelu')"),
])
def test_a_class_attribute_the_forward_reads_is_compared_with_the_proven_one(tmp_path, name, why):
    # `self.SCALE`, `type(self).ACT`: shared by every instance, in no instance's attributes; set on the class
    # before B was built, B was served with A's value.
    _declined_at_install(tmp_path, name, why)


def test_a_class_attribute_set_after_install_runs_the_forward(tmp_path):
    _declined_at_call(tmp_path, "class attribute set after install", "class attributes changed")


@pytest.mark.parametrize("name, why", [
    ("global read by forward", "global:install_near_miss_models.GLOBAL_SCALE 2.0 (proven 1.0)"),
    ("global read by a helper method", "global:install_near_miss_models.HELPER_ACT 'silu' (proven 'gelu')"),
    ("global read by a child's forward", "global:install_near_miss_models.CHILD_APPROX 'tanh' (proven 'none')"),
    ("global helper function rebound", "global:install_near_miss_models.helper_act {'function': "
                                       "'install_near_miss_models._silu_helper'"),
])
def test_a_global_the_forwards_read_is_compared_with_the_proven_one(tmp_path, name, why):
    # The globals a forward reads were held as at install, never compared with the proof's: a model built (or a
    # process started) with another flag was served with A's. A method the forward calls (`self._act(h)`) and a
    # child's forward were not read at all, nor a module-level function the forward calls (rebound by a patch).
    _declined_at_install(tmp_path, name, why)


@pytest.mark.parametrize("name", ["global read by a helper method, set after install",
                                  "global read by a child's forward, set after install",
                                  "global helper function rebound after install"])
def test_a_global_read_by_a_helper_or_a_child_set_after_install_runs_the_forward(tmp_path, name):
    _declined_at_call(tmp_path, name, "globals changed")


def test_a_child_left_in_train_mode_is_compared_with_the_proven_one(tmp_path):
    # A Dropout in train mode in a model set to eval (Monte Carlo dropout): the children's training flags were not
    # compared at install (the module's own flag was), so the cast skipped the dropout.
    _declined_at_install(tmp_path, "child dropout in train mode", "act:training False (proven True)")


def test_a_module_with_children_installed_in_train_mode_and_set_to_eval_after_is_served(tmp_path):
    # The children's training flags were held as at install (train), so a model set to eval after the install was
    # declined at every call ("submodule attributes changed"): now they are held as their module's, or not.
    found, info = outcome("control: block installed in train mode, eval after", 0, tmp_path)
    assert not found and all(info["hits"][p] == 1 for p in INNER) and not info["declines"], info


@pytest.mark.parametrize("name, why", [
    ("subclass of the proven class, same name", "(a install_near_miss_models._subclass_named_norm.<locals>.Norm_, "
                                                "not install_near_miss_models.Norm)"),
    ("class redefined, same module and qualname", ":__class__ {'class': 'install_near_miss_models.Norm', 'code': "),
])
def test_a_class_of_the_proven_name_with_other_code_is_not_served(tmp_path, name, why):
    # The loader matched a proven path's class by its short name: a subclass named alike, overriding the forward,
    # was served with the proven chain, and so was a class redefined under the same module and name.
    _declined_at_install(tmp_path, name, why)


def test_an_attribute_added_after_install_runs_the_forward(tmp_path):
    # `getattr(self, "scale", 1.0)`: the attributes held were those the module had at install; one set since was not,
    # nor one set on the config it holds (`getattr(self.config, "double", False)`).
    _declined_at_call(tmp_path, "optional attribute set after install", "attributes changed")
    _declined_at_call(tmp_path, "config flag read with getattr, set after install", "held object's attributes changed")


def test_a_parameter_registered_as_none_is_compared_with_the_proven_one(tmp_path):
    # `register_parameter("bias", None)` (nn.LayerNorm(bias=False)): parameters are bound by the names the chain
    # reads, so B's bias, read by its forward (`if self.bias is not None`), was not; the cast dropped it.
    _declined_at_install(tmp_path, "registered None bias present", ":bias '(none)' (proven None)")
    _declined_at_call(tmp_path, "registered None bias set after install", "parameters changed")


def test_the_default_dtype_is_compared_with_the_proven_one(tmp_path):
    # `.to(torch.get_default_dtype())` is captured as a cast to the dtype of the day: B run under float64 was served
    # A's float32 chain.
    _declined_at_install(tmp_path, "default dtype", "torch:default_dtype {'torch': 'torch.float64'}")


def test_a_config_held_as_a_named_tuple_binds(tmp_path):
    # `held` keeps a named tuple as a new tuple of its items, and `same` compared it by identity: its forward
    # "changed the module's own attributes (config)" at every call, and the card never bound.
    found = captured(*CASES["namedtuple config"].a(0, torch.Generator().manual_seed(0)))
    assert [c.chain["class"] for c in found.cards if _bound(c)] == ["ConfigAct"], found.notes
    _declined_at_install(tmp_path, "namedtuple config", "config ['silu', 1.0] (proven ['gelu', 1.0])")


def test_a_leaf_route_holds_nothing_of_nn_modules_own_tables(tmp_path):
    # nn.Module's hook tables are OrderedDicts, objects with a __dict__: held as objects a module holds, the guard
    # compared eleven of them at every call of every routed module (about 0.8 µs a call of an RMSNorm on this CPU).
    import engine.cast
    from engine.cast import modules

    model, args = CASES["control: norm"].a(0, torch.Generator().manual_seed(0))
    path, signatures = _cast(captured(model, args), tmp_path)
    cast = engine.cast.load(path, env=ENV, plans={k: EagerPlan(s) for k, s in signatures.items()})
    try:
        cast.install(model)
        route = modules.route_of(model.layers[0].inner)
        assert (route.held, route.tree, route.reads, route.class_reads, route.absent, route.kids) == \
            ([], [], [], [], [], [])
    finally:
        cast.remove()


def test_a_constant_of_a_module_the_forward_imports_is_compared_and_held(tmp_path):
    # `consts.SCALE` (a value of an imported module, read by attribute): only the forward's own module's globals
    # were read, so B built with another SCALE, or SCALE set after install, was served with A's.
    _declined_at_install(tmp_path, "constant of an imported module", "global:install_near_miss_consts.SCALE 2.0 "
                                                                      "(proven 1.0)")
    _declined_at_call(tmp_path, "constant of an imported module set after install", "globals changed")


def test_a_module_held_unregistered_is_compared_with_its_attributes(tmp_path):
    # `self.acts = [nn.GELU()]`: no submodule, so not in the proven subtree; it was described by its class alone, and
    # a GELU("tanh") was served with the exact GELU's chain.
    _declined_at_install(tmp_path, "unregistered module in a list", "'state': {'approximate': 'tanh'}")


def test_a_forward_reading_torchs_grad_mode_runs_in_the_mode_it_was_proven_in(tmp_path):
    # `h * 2 if torch.is_grad_enabled() else h`, proven under no_grad (every capture is): a frozen model run with
    # grad enabled (no parameter requiring grad, so the guard's grad check passed) was served the no_grad branch.
    _declined_at_call(tmp_path, "grad enabled, every parameter frozen", "torch mode")
    # a forward that does not read the mode is served with grad enabled as before
    found, info = outcome("grad enabled, every parameter frozen, control", 0, tmp_path)
    assert not found and all(info["hits"][p] == 1 for p in INNER), info


def test_a_forward_default_argument_changed_is_not_the_proven_class(tmp_path):
    # `forward(self, x, approximate="none")` called with x alone: the default is no code, so a class whose default
    # was changed (or redefined with another) had the proven digest and was served the exact GELU.
    _declined_at_install(tmp_path, "forward default argument changed on the class", ":__class__ {'class': "
                                                                                      "'install_near_miss_models.DefaultArg'")


def test_a_module_level_object_the_forward_reads_is_compared_and_held(tmp_path):
    # `if SETTINGS.act == "gelu"` (a module-level settings object), `GLOBAL_ACT(h)` (a module-level partial): only
    # plain values and functions among the globals were compared and held; B built with another SETTINGS.act, or a
    # partial of another `approximate`, was served with A's chain.
    _declined_at_install(tmp_path, "module-level settings object", "global:install_near_miss_models.SETTINGS.act")
    _declined_at_install(tmp_path, "module-level partial rebound", "global:install_near_miss_models.GLOBAL_ACT")
    _declined_at_call(tmp_path, "module-level settings object changed after install", "held object's attributes "
                                                                                         "changed")


@pytest.mark.parametrize("name, why", [
    ("global of a helper in an imported module", "global:install_near_miss_helpers.APPROX 'tanh' (proven 'none')"),
    ("helper in an imported module rebound", "global:install_near_miss_helpers.act {'function': "
                                             "'install_near_miss_helpers.silu'"),
    ("global read by the parent class's forward (super().forward)", "global:install_near_miss_models.PARENT_SCALE "
                                                                     "2.0 (proven 1.0)"),
])
def test_what_a_helper_of_another_module_or_a_base_class_forward_reads_is_compared(tmp_path, name, why):
    # `helpers.act(h)` (a function of an imported module, reading that module's APPROX) and `super().forward(x)`
    # (the base class's forward, reading a global): neither was read, so neither was compared, nor held per call.
    _declined_at_install(tmp_path, name, why)


def test_a_global_read_by_a_base_class_forward_set_after_install_runs_the_forward(tmp_path):
    _declined_at_call(tmp_path, "global read by the parent class's forward, set after install", "globals changed")


def test_a_global_replaced_by_an_object_whose_equality_raises_runs_the_forward(tmp_path):
    # The guard compares what it holds with `==`: an object put in a held global's place whose `==` raises (an array,
    # a frame) must decline, not raise out of the model's forward.
    import install_near_miss_models as models
    from install_near_miss_models import GlobalObjects, stack

    import engine.cast

    class Raises:
        def __eq__(self, other):
            raise ValueError("ambiguous")

        __hash__ = object.__hash__

    build = stack(lambda d, i: GlobalObjects(d, "settings"))
    model, args = build(0, torch.Generator().manual_seed(0))
    path, signatures = _cast(captured(model, args), tmp_path)
    cast = engine.cast.load(path, env=ENV, plans={k: EagerPlan(s) for k, s in signatures.items()})
    old = models.SETTINGS
    try:
        cast.install(model)
        models.SETTINGS = Raises()
        models.SETTINGS.act = "gelu"
        with torch.no_grad():
            model(*args)
        st = cast.stats()["modules"]
    finally:
        models.SETTINGS = old
        cast.remove()
    assert all(st[p]["hits"] == 0 and sum(st[p]["declines"].values()) == 1 for p in INNER), st


@pytest.mark.parametrize("name, why", [
    ("config values as class attributes of its class", ":config.act 'silu' (proven 'gelu')"),
    ("config is a class", "'attrs': {'act': 'silu'"),
])
def test_a_config_keeping_its_values_on_its_class_is_compared_with_the_proven_one(tmp_path, name, why):
    # `class Cfg: act = "gelu"` held as `Cfg()` (an instance with no attributes of its own) or as `Cfg` itself: an
    # object was described by its own attributes and a class by its name, so B built after `Cfg.act = "silu"` was
    # served A's GELU.
    _declined_at_install(tmp_path, name, why)


def test_a_model_file_the_capture_imported_under_its_own_name_is_served(tmp_path, monkeypatch):
    # engine.config imports a builder's .py file as `kforge_user_model_<stem>`; the user's code imports it as `<stem>`
    # (or runs it as `__main__`). Comparing the classes' and functions' dotted names as they are declined every
    # module card of such a model (the class at each proven path, and all it holds).
    from types import SimpleNamespace

    from engine.capture.module_binding import dotted_key

    found, info = outcome("control: the model's file imported by the capture as kforge_user_model_<stem>", 0,
                          tmp_path)
    assert not found and all(info["hits"][p] == 1 for p in INNER), (found, info)
    assert dotted_key("kforge_user_model_net.Net") == dotted_key("net.Net") == "net.Net"
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__file__="/home/me/net.py"))
    assert dotted_key("__main__.Net") == "net.Net"
