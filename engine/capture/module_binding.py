"""What binds a module's forward to a chain card: the capture records it, the cast's loader reads it.

It lives in the capture layer because the capture computes it (engine.capture.chain_cards, in the
chain-sampling forward); engine.cast.modules re-exports it for the loader.
"""

from __future__ import annotations

from typing import Any

import torch


class ModuleCardError(ValueError):
    """A module-card variant cannot be bound to this module (the message says why)."""


def autocast_state() -> tuple:
    """The autocast state that matters to a plan: (device type, dtype) per device type where it is on."""
    state = []
    for dev in ("cpu", "cuda"):
        if torch.is_autocast_enabled(dev):
            state.append((dev, str(torch.get_autocast_dtype(dev)).removeprefix("torch.")))
    return tuple(state)


# Where an installed cast keeps a module instance's route (engine.cast.modules.attach): not state a forward reads.
ROUTE_ATTR = "_kforge_route"
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__) | {"forward", ROUTE_ATTR}
# Bookkeeping flags frameworks set on modules, which no forward reads: transformers marks initialised modules
# `_is_hf_initialized` (a model built from random weights has it, one loaded by from_pretrained may not).
IGNORED_STATE = frozenset({"_is_hf_initialized"})
_PLAIN = (type(None), bool, int, float, str)


def _plain(v: Any) -> Any:
    """`v` as JSON when it is a plain value (None, bool, int, float, str, dtype, device, tuples and lists
    of them); raises TypeError otherwise."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, (torch.dtype, torch.device)):
        return {"torch": str(v)}
    if isinstance(v, (tuple, list)):  # torch.Size too
        return [_plain(x) for x in v]
    raise TypeError(type(v).__name__)


def module_state(module: torch.nn.Module) -> dict[str, Any] | None:
    """The instance's own attributes besides its parameters, buffers, submodules and nn.Module's
    bookkeeping (eps, with_scale, normalized_shape…), as JSON; None when one is not a plain value (a
    config object, a function, an unregistered tensor), which then cannot be compared.

    Two instances of one class with equal states and equally shaped tensors run the same forward: what
    lets a module card proven on some instances of a class serve the others (a model captured shrunk,
    then run at its real depth)."""
    out = {}
    for name, v in sorted(vars(module).items()):
        if name in _MODULE_INTERNALS or name in IGNORED_STATE:
            continue
        try:
            out[name] = _plain(v)
        except TypeError:
            return None
    return out


def held(v: Any) -> Any:
    """`v` as it is now, for `same` to compare after a forward: lists, tuples and dicts copied item by item, the rest
    held as is (plain values compare by value, other objects by identity)."""
    return _held(v, ())


def _held(v: Any, within: tuple[int, ...]) -> Any:
    if isinstance(v, (list, tuple, dict)) and id(v) in within:
        return v  # a container holding itself: held by identity from there down
    if isinstance(v, (list, tuple)):
        return (type(v), [_held(x, (*within, id(v))) for x in v])
    if type(v) is dict:
        return (dict, {k: _held(x, (*within, id(v))) for k, x in v.items()})
    return v


def held_objects(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """(attribute name, object) of the other objects the instance holds, one level down: a transformers config, a
    state object (`self.stats`). Tensors, modules, classes, callables and plain values are not such objects."""
    out = []
    for k, v in vars(module).items():
        if k in _MODULE_INTERNALS or k in IGNORED_STATE or callable(v) or isinstance(v, (
                *_PLAIN, torch.dtype, torch.device, list, tuple, dict, torch.nn.Module, torch.Tensor, type)):
            continue
        try:  # an object without a __dict__ may answer with its own __getattr__, which may raise anything
            if isinstance(object.__getattribute__(v, "__dict__"), dict):
                out.append((k, v))
        except Exception:  # noqa: BLE001 - no readable __dict__: not such an object
            continue
    return out


def attributes_held(module: torch.nn.Module) -> dict[str, Any]:
    """The instance's own attributes (those `module_state` reads) as they are now, objects held, not described,
    and the attributes of the objects it holds (`held_objects`, as `name.attr`): what `attributes_changed`
    compares after its forward. `module_state` is None for a module holding a tensor or another object, so it
    cannot tell a forward that keeps its output (`self.last = y`) or counts its calls in a held object
    (`self.stats.calls += 1`) from one that changes nothing."""
    out = {name: held(v) for name, v in vars(module).items()
           if name not in _MODULE_INTERNALS and name not in IGNORED_STATE}
    for name, obj in held_objects(module):
        out.update((f"{name}.{a}", held(x)) for a, x in vars(obj).items())
    return out


def _described(v: Any) -> Any:
    """`v` as JSON for `held_description` (`_plain`, and dicts with string keys); raises TypeError otherwise."""
    if type(v) is dict and all(isinstance(k, str) for k in v):
        return {"dict": {k: _described(x) for k, x in v.items()}}
    if isinstance(v, (tuple, list)):
        return [_described(x) for x in v]
    return _plain(v)


def held_description(module: torch.nn.Module) -> dict[str, Any]:
    """What a module card's plan assumes of an instance beyond its `proven_state`, as JSON: the plain attributes
    of each module in its tree (`path:name`, the module itself at path ''), and those of the objects they hold
    one level down (`path:name.attr`: a config's `hidden_act`, `rms_norm_eps`, `use_gate`). `proven_state` is None
    for a module holding a config, so an install compares this instead: a model built with another config,
    whose forward reads it at each call, is not the one proven. Values that are not plain are left out."""
    out: dict[str, Any] = {}
    for path, m in module.named_modules():
        items = [(k, v) for k, v in vars(m).items() if k not in _MODULE_INTERNALS and k not in IGNORED_STATE]
        items += [(f"{k}.{a}", x) for k, obj in held_objects(m) for a, x in vars(obj).items()]
        for k, v in items:
            try:
                out[f"{path}:{k}"] = _described(v)
            except (TypeError, RecursionError):  # not plain, or a list holding itself
                continue
    return out


def held_difference(mine: dict[str, Any], proven: dict[str, Any]) -> str:
    """What differs between two `held_description`s, for a message: `:config.hidden_act 'gelu' (proven 'silu')`."""
    diffs = [f"{k} {mine.get(k, '(none)')!r} (proven {proven.get(k, '(none)')!r})"
             for k in sorted(set(mine) | set(proven)) if mine.get(k) != proven.get(k)]
    return ", ".join(diffs[:3]) or "what it holds"


def same(a: Any, b: Any) -> bool:
    """Whether two `held` values are alike: containers item by item, plain values by value, others by identity."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2 and a[0] is b[0] and \
            a[0] in (list, tuple, dict):  # a container, as `held` keeps it
        x, y = a[1], b[1]
        if isinstance(x, dict):
            return list(x) == list(y) and all(same(x[k], y[k]) for k in x)
        return len(x) == len(y) and all(same(u, w) for u, w in zip(x, y))
    if isinstance(a, (*_PLAIN, torch.dtype, torch.device)) and type(a) is type(b):
        return a == b  # a plain value recomputed alike (`self.scale = 1 / d ** 0.5`) is no change
    return a is b


def arguments_changed(before: Any, args: tuple) -> list[int]:
    """The positions of a forward's arguments that are not what `held(args)` kept before it ran (a list it was
    passed and appended to, a dict it wrote into): a cast that runs its plan instead would leave them as they were."""
    _, items = before
    return [k for k, (a, b) in enumerate(zip(items, args)) if not same(a, held(b))]


def attributes_changed(before: dict[str, Any], module: torch.nn.Module) -> list[str]:
    """The names of the instance's own attributes that are not what they were in `attributes_held`: set, deleted,
    another object (a tensor it keeps), or a container holding other objects (a list appended to)."""
    after = attributes_held(module)
    return [k for k in sorted(set(before) | set(after))
            if k not in before or k not in after or not same(before[k], after[k])]


# Where a proven state records the module's submodules (`proven_state`): no attribute of a module's own.
SUBTREE = "_kforge_submodules"


def class_name(cls: type) -> str:
    """A class's dotted name, as a card records it (`torch.nn.modules.activation.SiLU`)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def module_subtree(module: torch.nn.Module) -> dict[str, Any]:
    """Each submodule below `module` by its path from it: `{"act": {"class": ..., "state": module_state(act)}}`.
    What a forward that calls its children computes is theirs too (a GELU where the proof had a SiLU)."""
    return {path: {"class": class_name(type(m)), "state": module_state(m)}
            for path, m in module.named_modules() if path}


def proven_state(module: torch.nn.Module) -> dict[str, Any] | None:
    """What a module card proves of an instance and an install compares: its `module_state`, with its
    `module_subtree` under SUBTREE; None where the state is."""
    state = module_state(module)
    return None if state is None else {**state, SUBTREE: module_subtree(module)}


def _comparable(proven: dict[str, Any], state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A proven state and an instance's, as they compare: bookkeeping flags aside (which casts written before
    they were ignored still hold), and the submodules only where the proof recorded them (a cast written
    before, whose submodules are not checked)."""
    return ({k: v for k, v in proven.items() if k not in IGNORED_STATE},
            state if SUBTREE in proven else {k: v for k, v in state.items() if k != SUBTREE})


def state_matches(state: dict[str, Any] | None, states: list[dict[str, Any]]) -> bool:
    """Whether an instance's `proven_state` (or `module_state`) equals one of a card's proven `states`."""
    if state is None:
        return False
    return any(a == b for a, b in (_comparable(s, state) for s in states))


def _subtree_difference(tree: dict[str, Any], proven: dict[str, Any]) -> list[str]:
    diffs = []
    for path in [*tree, *(p for p in proven if p not in tree)]:
        mine, theirs = tree.get(path), proven.get(path)
        if mine == theirs:
            continue
        if theirs is None:
            diffs.append(f"submodule {path} ({mine['class']}) is not in the proven module")
        elif mine is None:
            diffs.append(f"submodule {path} is missing (proven {theirs['class']})")
        elif mine["class"] != theirs["class"]:
            diffs.append(f"submodule {path} is {mine['class']} (proven {theirs['class']})")
        elif theirs["state"] is None:
            diffs.append(f"submodule {path}: the proven one held an attribute that is not a plain value")
        else:
            diffs.append(f"submodule {path}: {state_difference(mine['state'], [theirs['state']])}")
    return diffs


def state_difference(state: dict[str, Any] | None, states: list[dict[str, Any]]) -> str:
    """What differs between an instance's state and the first proven one, for a message: `eps 1e-05 (proven
    1e-06)`, `submodule act is …GELU (proven …SiLU)`, or that the instance holds an attribute that cannot be
    compared."""
    if state is None:
        return "an attribute that is not a plain value (it cannot be compared with the proof's)"
    proven, state = _comparable(states[0], state) if states else ({}, state)
    diffs = [f"{k} {state.get(k, '(none)')!r} (proven {proven.get(k, '(none)')!r})"
             for k in sorted(set(state) | set(proven)) if k != SUBTREE and state.get(k) != proven.get(k)]
    diffs += _subtree_difference(state.get(SUBTREE) or {}, proven.get(SUBTREE) or {})
    return ", ".join(diffs[:3]) or "its attributes"


def module_binding(module: torch.nn.Module, args: tuple, inputs: list[torch.Tensor]) -> dict[str, Any]:
    """The `args`/`params` of a module entry for a proven call: each chain input (the tensors `in0..inN`
    were) found by identity among the forward's positional `args`, then the module's parameters and buffers.
    Raises ModuleCardError for an argument that is neither a chain input nor a value the guard can compare."""
    from engine.capture.signature import decode_value, encode_value

    def index(t: Any) -> int | None:
        return next((i for i, x in enumerate(inputs) if x is t), None)

    out_args = []
    for k, a in enumerate(args):
        i = index(a) if isinstance(a, torch.Tensor) else None
        if isinstance(a, torch.Tensor) and i is None:
            raise ModuleCardError("a tensor argument of the forward is not a chain input")
        if i is None:
            try:  # a dict or an object is described only by its repr, which the install cannot read back
                decode_value(encode_value(a))
            except ValueError:
                raise ModuleCardError(f"argument {k} of the forward is a {type(a).__name__}, which the cast's "
                                      "guard cannot compare") from None
        out_args.append({"input": i} if i is not None else {"value": encode_value(a)})
    params = []
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        i = index(t)
        if i is not None:
            params.append({"name": name, "input": i})
    return {"args": out_args, "params": params}
