"""What binds a module's forward to a chain card: the capture records it, the cast's loader reads it.

It lives in the capture layer because the capture computes it (engine.capture.chain_cards, in the
chain-sampling forward); engine.cast.modules re-exports it for the loader.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import logging
import sys
import types
import weakref
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


# The interpreter a code digest was taken under (`code_digest`): bytecode differs between Python versions.
PYTHON = f"py{sys.version_info[0]}.{sys.version_info[1]}"
_FUNCTIONS = (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType,
              types.BuiltinMethodType, types.MethodWrapperType, types.WrapperDescriptorType,
              types.MethodDescriptorType)
_DEPTH = 3  # objects held inside held objects, described this many levels down (a config's text_config)


def _const(c: Any) -> str:
    if isinstance(c, types.CodeType):
        return code_digest(c)
    if isinstance(c, frozenset):  # its repr's order follows string hashing, which differs per process
        return "frozenset(" + repr(sorted(map(repr, c))) + ")"
    return repr(c)


def code_digest(code: types.CodeType) -> str:
    """A digest of what a function's code does (its bytecode, constants, nested code and the names it reads),
    tagged with the interpreter (`PYTHON`): two functions of one name and other code (a class redefined in a
    notebook, two lambdas) differ."""
    h = hashlib.sha1(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update("\0".join(map(_const, code.co_consts)).encode())
    return f"{PYTHON}:{h.hexdigest()[:16]}"


def class_forward(cls: type) -> Any:
    """The forward `cls` has without any cast: its own or inherited, with a cast's dispatcher seen through."""
    f = cls.forward
    return getattr(f, "__kforge_original__", f)


def _own_classes(cls: type) -> list[type]:
    """`cls` and its bases below nn.Module: the classes whose code and attributes are the module's own."""
    out = []
    for c in cls.__mro__:
        if c is torch.nn.Module or c is object:
            break
        out.append(c)
    return out


def class_digest(cls: type) -> str:
    """`code_digest` of every function `cls` and its bases below nn.Module define (methods, properties, static and
    class methods), with their default arguments (`forward(self, x, approximate="none")`), by name: a subclass overriding a method, or a class redefined with other code under the same
    name, is not the proven class."""
    parts = []
    for c in _own_classes(cls):
        for name, v in sorted(c.__dict__.items()):
            if name == "forward":
                v = getattr(v, "__kforge_original__", v)  # a cast's dispatcher is no code of the class
            fns = [v.fget, v.fset] if isinstance(v, property) else [getattr(v, "__func__", v)]
            parts += [f"{c.__qualname__}.{name}={code_digest(f.__code__)}"
                      f"{_text(describe([f.__defaults__, f.__kwdefaults__]))}" for f in fns
                      if isinstance(f, types.FunctionType)]
    return f"{PYTHON}:{hashlib.sha1(chr(10).join(parts).encode()).hexdigest()[:16]}"


def object_attributes(v: Any) -> list[tuple[str, Any]] | None:
    """The attributes of an object a module holds (a config, a callable object): its __dict__, or its slots (a
    `__slots__` class, a slotted dataclass); None for functions, classes, modules, tensors and enums. Read without
    the object's own `__getattr__`, which may raise anything."""
    if isinstance(v, (*_FUNCTIONS, type, torch.nn.Module, torch.Tensor, enum.Enum, types.ModuleType)):
        return None
    try:
        d = object.__getattribute__(v, "__dict__")
    except Exception:  # noqa: BLE001 - no readable __dict__
        d = None
    out = list(d.items()) if isinstance(d, dict) else []
    slots = []
    for c in type(v).__mro__:
        names = c.__dict__.get("__slots__") or ()
        slots += [n for n in ((names,) if isinstance(names, str) else names) if n not in ("__dict__", "__weakref__")]
    for n in slots:
        try:
            out.append((n, object.__getattribute__(v, n)))
        except Exception:  # noqa: BLE001 - a slot never set
            continue
    return out if isinstance(d, dict) or slots else None


def class_attributes(cls: type, skip: Any = ()) -> list[tuple[type, str, Any]]:
    """(defining class, name, value) of the attributes of `cls` and its bases (below nn.Module and object) that are
    no functions, properties or other descriptors, and no dunders: a config's values kept on its class
    (`class Cfg: act = "gelu"`), read through an instance that has none of its own. Names in `skip` (the instance's
    own) and the first definition of each name only."""
    out, seen = [], set(skip)
    for c in cls.__mro__:
        if c is object or c is torch.nn.Module:
            break
        for name, x in c.__dict__.items():
            if name in seen or (name.startswith("__") and name.endswith("__")) or hasattr(type(x), "__get__"):
                continue
            seen.add(name)
            out.append((c, name, x))
    return out


def describe(v: Any, depth: int = _DEPTH, ancestors: frozenset = frozenset()) -> Any:
    """`v` as JSON, for `held_description`: plain values as they are (an int and a float stay apart in the JSON's
    text), containers item by item, sets sorted, an enum by its class and name, a class by its dotted name, a
    function by its name, a digest of its code, its defaults and what its closure holds, a partial by its function
    and arguments, a bound method by its function (and its object where that is no module), another object by its
    class and attributes (`depth` levels down), and what cannot be described by its type."""
    if isinstance(v, enum.Enum):
        return {"enum": class_key(type(v)), "name": v.name}
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, (torch.dtype, torch.device)):
        return {"torch": str(v)}
    if isinstance(v, (tuple, list, dict, set, frozenset)):
        if id(v) in ancestors:  # a container holding itself
            return {"opaque": class_key(type(v))}
        within = ancestors | {id(v)}
        if isinstance(v, (tuple, list)):
            return [describe(x, depth, within) for x in v]
        if isinstance(v, dict):
            if all(isinstance(k, str) for k in v):
                return {"dict": {k: describe(x, depth, within) for k, x in v.items()}}
            return {"items": [[describe(k, depth, within), describe(x, depth, within)] for k, x in v.items()]}
        return {"set": sorted(json.dumps(describe(x, depth, within), sort_keys=True) for x in v)}
    if isinstance(v, type):  # a class held (as a config, or a class to build): its name, and its values
        out = {"class": class_key(v)}
        if depth > 0 and id(v) not in ancestors and not issubclass(v, (torch.nn.Module, BaseException)):
            inner = ancestors | {id(v)}
            out["attrs"] = {k: describe(x, depth - 1, inner) for _, k, x in class_attributes(v)}
        return out
    if isinstance(v, functools.partial):
        return {"partial": describe(v.func, depth, ancestors), "args": describe(list(v.args), depth, ancestors),
                "keywords": describe(dict(v.keywords), depth, ancestors)}
    if isinstance(v, types.MethodType):  # the object it is bound to: a module by its class and plain attributes
        return {"method": describe(v.__func__, depth, ancestors), "of": describe(v.__self__, depth - 1, ancestors)}
    if isinstance(v, types.FunctionType):
        out = {"function": dotted_key(f"{v.__module__}.{v.__qualname__}"), "code": code_digest(v.__code__)}
        if v.__defaults__:
            out["defaults"] = describe(list(v.__defaults__), depth, ancestors)
        if v.__kwdefaults__:
            out["kwdefaults"] = describe(dict(v.__kwdefaults__), depth, ancestors)
        if v.__closure__ and depth > 0 and id(v) not in ancestors:
            cells = []
            for c in v.__closure__:
                try:
                    cells.append(describe(c.cell_contents, depth - 1, ancestors | {id(v)}))
                except ValueError:  # an empty cell
                    cells.append(None)
            out["closure"] = cells
        return out
    if isinstance(v, _FUNCTIONS):  # a builtin (torch's F.gelu), a method of a builtin type
        return {"function": dotted_key(f"{getattr(v, '__module__', None) or type(v).__name__}."
                                       f"{getattr(v, '__qualname__', getattr(v, '__name__', '?'))}")}
    if isinstance(v, torch.nn.Module):  # one it holds unregistered (in a list): no submodule, so not in `states`
        return {"module": class_key(type(v)), "state": module_state(v)}
    attrs = object_attributes(v) if not isinstance(v, torch.Tensor) else None
    if attrs is not None and depth > 0 and id(v) not in ancestors:
        inner = ancestors | {id(v)}
        attrs += [(k, x) for _, k, x in class_attributes(type(v), dict(attrs))]
        return {"object": class_key(type(v)), "attrs": {k: describe(x, depth - 1, inner) for k, x in attrs}}
    return {"opaque": class_key(type(v))}


def _held_into(out: dict[str, Any], key: str, v: Any, depth: int, ancestors: frozenset) -> None:
    """`out[key]`, the description of `v`; an object (a config) by its class, and its attributes as `key.attr`."""
    attrs = object_attributes(v) if depth > 0 and id(v) not in ancestors else None
    if attrs is None:
        try:
            out[key] = describe(v, depth, ancestors)
        except RecursionError:  # containers nested deeper than the interpreter recurses
            out[key] = {"opaque": class_key(type(v))}
        return
    out[key] = {"object": class_key(type(v))}
    # with the values its class keeps that it has none of its own of (`class Cfg: act = "gelu"`)
    for a, x in attrs + [(k, x) for _, k, x in class_attributes(type(v), dict(attrs))]:
        _held_into(out, f"{key}.{a}", x, depth - 1, ancestors | {id(v)})


def held_description(module: torch.nn.Module) -> dict[str, Any]:
    """What a module card's plan assumes of an instance beyond its `proven_state`, as JSON, for each module of its
    tree (`path:...`, the module itself at path ''): its class, with a digest of its code (`path:__class__`: a
    subclass of the same name, a class redefined); its attributes (`path:name`, `describe`: a function it holds,
    a partial, an enum, a set), and those of the objects it holds (`path:name.attr`, `_DEPTH` levels down: a
    config's `hidden_act`, its `text_config.rope_theta`, a slotted dataclass's fields); the class attributes its
    code reads (`path:__class__.NAME`); a submodule's training flag, as its module's or not (`path:training`: a
    Dropout left in train mode in a model set to eval); and the plain module-level values the forwards read
    (`global:module.NAME`, `forward_globals`); each parameter or buffer registered as None (`path:bias`); and
    torch's default dtype (`torch:default_dtype`). `proven_state` is None for a module holding a config or a function,
    and says nothing of its class's code, its class attributes or globals, so an install compares this too: a
    model built otherwise, whose forward reads what differs at each call, is not the one proven."""
    out: dict[str, Any] = {}
    classes = []
    for path, m in module.named_modules():
        cls = type(m)
        classes.append(cls)
        out[f"{path}:__class__"] = {"class": class_key(cls), "code": class_digest(cls)}
        if path:
            out[f"{path}:training"] = m.training == module.training
        # a parameter or buffer registered as None (`nn.LayerNorm(bias=False)`): one that is a tensor is read where
        # the proof read none (`if self.bias is not None`)
        out.update((f"{path}:{k}", None) for table in (m._parameters, m._buffers) for k, t in table.items()
                   if t is None)
        for k, v in vars(m).items():
            if k not in _MODULE_INTERNALS and k not in IGNORED_STATE:
                _held_into(out, f"{path}:{k}", v, _DEPTH, frozenset())
        for c, k in class_reads(cls):
            if k not in vars(m):
                out[f"{path}:__class__.{k}"] = describe(c.__dict__[k])
    for g, k in forward_globals(dict.fromkeys(classes)):
        _held_into(out, f"global:{dotted_key(str(g.get('__name__')) + '.' + k)}", g[k], _DEPTH, frozenset())
    # what a factory without a dtype makes, and a forward casting to `torch.get_default_dtype()`
    out["torch:default_dtype"] = describe(torch.get_default_dtype())
    # torch's modes the forwards read (`if torch.is_grad_enabled():`), as the proven call ran: compared at each call
    # (an install runs in whatever mode its caller is in), not at install
    read = set().union(*(forward_names(cls) for cls in dict.fromkeys(classes)))
    out.update((f"{MODE}torch.{n}", f()) for n, f in MODES.items() if n in read)
    return out


# torch's modes a forward may branch on (what a module that checkpoints or caches under grad only reads), held in a
# held description as `mode:torch.NAME` where the forwards' code reads them by name
MODE = "mode:"
MODES = {"is_grad_enabled": torch.is_grad_enabled, "is_inference_mode_enabled": torch.is_inference_mode_enabled}


def _text(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def _codes(v: Any) -> Any:
    """The code digests in a description."""
    if isinstance(v, dict):
        for k, x in v.items():
            if k == "code" and isinstance(x, str):
                yield x
            else:
                yield from _codes(x)
    elif isinstance(v, list):
        for x in v:
            yield from _codes(x)


def _codeless(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _codeless(x) for k, x in v.items() if k != "code"}
    if isinstance(v, list):
        return [_codeless(x) for x in v]
    return v


def held_matches(mine: dict[str, Any], helds: list[dict[str, Any]]) -> bool:
    """Whether an instance's `held_description` is one of a card's proven ones, compared as JSON text (an int and a
    float of one value differ: `x * 2` of an integer tensor is an integer tensor, `x * 2.0` a float one). Code
    digests taken under another Python are left out of the comparison (bytecode differs between versions): there
    the names of classes and functions are compared, not their code."""
    here = _text(mine)
    for h in helds:
        if any(not c.startswith(PYTHON + ":") for c in _codes(h)):
            if _text(_codeless(mine)) == _text(_codeless(h)):
                return True
        elif here == _text(h):
            return True
    return False


def held_difference(mine: dict[str, Any], proven: dict[str, Any]) -> str:
    """What differs between two `held_description`s, for a message: `:config.hidden_act 'gelu' (proven 'silu')`."""
    diffs = [f"{k} {mine.get(k, '(none)')!r} (proven {proven.get(k, '(none)')!r})"
             for k in sorted(set(mine) | set(proven))
             if k not in mine or k not in proven or _text(mine[k]) != _text(proven[k])]
    return ", ".join(diffs[:3]) or "what it holds"


def same(a: Any, b: Any) -> bool:
    """Whether two `held` values are alike: containers item by item, plain values by value, others by identity."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2 and a[0] is b[0] and \
            isinstance(a[0], type) and issubclass(a[0], (list, tuple, dict)):  # a container, as `held` keeps it
        # (a named tuple too: a config held as one is a new tuple of equal items after each call)
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


# The module name engine.config imports a builder's .py file under (`kforge_user_model_<stem>`): the user's own code
# imports the same file as `<stem>`, or runs it as `__main__`.
USER_MODULE = "kforge_user_model_"


def dotted_key(dotted: str) -> str:
    """A dotted name (`module.Class`, `module.function`) as captures and installs compare it: the module that
    engine.config imports a model's file as (`kforge_user_model_net.Net`) is the file's own (`net.Net`), as the
    user's code imports it, or runs it as `__main__`. (Which code it is, a class's digest says: `class_digest`.)"""
    if dotted.startswith("__main__."):
        f = getattr(sys.modules.get("__main__"), "__file__", None)
        if isinstance(f, str) and f.endswith(".py"):
            dotted = f"{f.replace(chr(92), '/').rsplit('/', 1)[-1].removesuffix('.py')}.{dotted[len('__main__.'):]}"
    return dotted.removeprefix(USER_MODULE)


def class_key(cls: type) -> str:
    """`dotted_key` of a class's dotted name."""
    return dotted_key(class_name(cls))


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
    proven = {k: v for k, v in proven.items() if k not in IGNORED_STATE}
    state = state if SUBTREE in proven else {k: v for k, v in state.items() if k != SUBTREE}
    return _keyed(proven), _keyed(state)


def _keyed(state: dict[str, Any]) -> dict[str, Any]:
    """A state with its submodules' classes as `dotted_key`s (a capture's module name is not the user's)."""
    tree = state.get(SUBTREE)
    if not isinstance(tree, dict):
        return state
    return {**state, SUBTREE: {p: {**e, "class": dotted_key(e["class"])} if isinstance(e, dict) and
                               isinstance(e.get("class"), str) else e for p, e in tree.items()}}


def state_matches(state: dict[str, Any] | None, states: list[dict[str, Any]]) -> bool:
    """Whether an instance's `proven_state` (or `module_state`) equals one of a card's proven `states`, as JSON text:
    an attribute 2 where the proof had 2.0 differs (`x * self.scale` of an integer tensor is another dtype)."""
    if state is None:
        return False
    return any(_text(a) == _text(b) for a, b in (_comparable(s, state) for s in states))


def _subtree_difference(tree: dict[str, Any], proven: dict[str, Any]) -> list[str]:
    diffs = []
    for path in [*tree, *(p for p in proven if p not in tree)]:
        mine, theirs = tree.get(path), proven.get(path)
        if _text(mine) == _text(theirs):
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
             for k in sorted(set(state) | set(proven)) if k != SUBTREE and
             (k not in state or k not in proven or _text(state[k]) != _text(proven[k]))]
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


# ----------------------------------------------------------------- what a forward reads besides its module's attributes

_MISSING = object()
_SMALL = 32  # lists and dicts of plain values up to this many items are guarded (compared at each call)
_SCALARS = (type(None), bool, int, float, str, torch.dtype, torch.device)


def plain_value(v: Any) -> bool:
    """A value a guard compares at each call: a scalar, or a small list, tuple, set or dict of them (a config's
    `rope_scaling`, a module's list of window sizes). Larger containers are not compared (a config's
    `id2label` of 1,000 classes would cost microseconds per call)."""
    if isinstance(v, _SCALARS):
        return True
    if isinstance(v, (list, tuple, set, frozenset)):
        return len(v) <= _SMALL and all(plain_value(x) for x in v)
    if type(v) is dict:
        return len(v) <= _SMALL and all(isinstance(k, _SCALARS) and plain_value(x) for k, x in v.items())
    return False


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):  # comprehensions, lambdas and nested functions
            names |= _code_names(c)
    return names


def _cell_function(cell: Any) -> bool:
    try:
        return isinstance(cell.cell_contents, types.FunctionType)
    except ValueError:  # an empty cell
        return False


def _class_attr(cls: type, name: str) -> tuple[type, Any] | None:
    """(the class defining it, the value) of a class attribute `name` of `cls` or its bases below nn.Module."""
    for c in _own_classes(cls):
        if name in c.__dict__:
            return c, c.__dict__[name]
    return None


def _methods(v: Any) -> list[Any]:
    """The functions behind a class attribute: a method, a property's getter, a static or class method."""
    if isinstance(v, property):
        return [v.fget]
    return [getattr(v, "__func__", v)]


def _visit_forward(cls: type, depth: int, visit_global: Any) -> set[str]:
    """Every name the forward of `cls` reads (its code's names), with the methods of its class and its bases it
    reaches by name (`self._act(h)`, a property, the base's forward that `super().forward(x)` runs) visited too:
    `visit_global(function, names, depth, visit)` is called for each function."""
    seen: set[int] = set()
    names: set[str] = set()

    def visit(fn: Any, left: int) -> None:
        code = getattr(fn, "__code__", None)
        if not isinstance(code, types.CodeType) or id(fn) in seen:
            return
        seen.add(id(fn))
        # a decorated forward (transformers' deprecation wrappers): the function it wraps is the forward
        inner = [getattr(fn, "__wrapped__", None)] + [c.cell_contents for c in fn.__closure__ or ()
                                                       if _cell_function(c)]
        for f in inner:
            if isinstance(f, types.FunctionType):
                visit(f, left)
        own = _code_names(code)
        names.update(own)
        for name in sorted(own):  # each class's definition: `super().forward(x)` runs the base's
            for c in _own_classes(cls):
                if name in c.__dict__:
                    for f in _methods(c.__dict__[name]):
                        if isinstance(f, types.FunctionType):
                            visit(f, left)
        visit_global(fn, own, left, visit)

    visit(class_forward(cls), depth)
    return names


def global_read(v: Any) -> bool:
    """A module-level value a guard holds: a plain value (`plain_value`), a function or a partial (by identity: a
    helper the forward calls, which a library patching a model rebinds), or another object with attributes (a
    settings object: `if SETTINGS.act == "gelu"`), a logger aside (its level is no configuration of the forward)."""
    return plain_value(v) or isinstance(v, (types.FunctionType, functools.partial)) or (
        not isinstance(v, (logging.Logger, logging.LoggerAdapter)) and object_attributes(v) is not None)


def forward_globals(classes: Any, depth: int = 2, every: bool = False) -> list[tuple[dict, str]]:
    """(module namespace, name) of every plain module-level value or function (`global_read`) the forwards of these
    classes read (and those of the modules they import that they read by attribute: `consts.SCALE`, `helpers.act`),
    the methods of their class they call (`self._act(h)`), and the functions they call, `depth` calls deep: a
    flag a forward branches on (`if USE_FAST:`), which neither the arguments nor the module's attributes show. A
    name that is also an attribute name (`self.eps`) is read from the namespace where it is a global there too:
    guarding it costs only a lookup. `every`: every name the code reads in each namespace, whatever it holds now
    (a global may be set later)."""
    out: list[tuple[dict, str]] = []
    found: set[tuple[int, str]] = set()

    def visit_global(fn: Any, names: set[str], left: int, visit: Any) -> None:
        g = getattr(fn, "__globals__", None)
        if not isinstance(g, dict):
            return
        for name in sorted(names):
            if name.startswith("__") and name.endswith("__"):  # `type(self).__name__`: an attribute, not a global
                continue
            v = g.get(name, _MISSING)
            if (every or (v is not _MISSING and global_read(v))) and (id(g), name) not in found:
                found.add((id(g), name))
                out.append((g, name))
            if left > 0 and isinstance(v, types.FunctionType):
                visit(v, left - 1)
            # `consts.SCALE`: a plain value of a module it imports (the names its code reads that the module holds).
            # Not torch's own: its dtypes and constants are no configuration (and `x.float()` reads `float`)
            if isinstance(v, types.ModuleType) and v.__dict__ is not g and \
                    not (v.__name__ == "torch" or v.__name__.startswith("torch.")):
                d = v.__dict__
                for a in sorted(names):
                    if a not in d or (a.startswith("__") and a.endswith("__")):
                        continue
                    if (id(d), a) not in found and (every or global_read(d[a])):
                        found.add((id(d), a))
                        out.append((d, a))
                    if left > 0 and isinstance(d[a], types.FunctionType):  # `helpers.act(h)`: what it reads
                        visit(d[a], left - 1)

    for cls in classes:
        _visit_forward(cls, depth, visit_global)
    return out


_CLASS_READS: weakref.WeakKeyDictionary[type, list[tuple[type, str]]] = weakref.WeakKeyDictionary()


def class_reads(cls: type) -> list[tuple[type, str]]:
    """(defining class, name) of the class attributes that are no functions, properties or descriptors which the
    forward of `cls` (and the methods of its class it calls) reads by name (`self.SCALE`, `type(self).ACT`): a
    value every instance shares, which `module_state` cannot see. Found once per class."""
    got = _CLASS_READS.get(cls)
    if got is None:
        got = []
        for name in sorted(_visit_forward(cls, 0, lambda *a: None)):
            found = _class_attr(cls, name)
            if found is None or name.startswith("__"):
                continue
            c, v = found
            if isinstance(v, (*_FUNCTIONS, property, staticmethod, classmethod)) or hasattr(type(v), "__get__"):
                continue
            got.append((c, name))
        _CLASS_READS[cls] = got
    return got


_NAMES: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()


def forward_names(cls: type, depth: int = 2) -> frozenset[str]:
    """Every name the forward of `cls` reads: its code's, the methods of its class it calls and the module-level
    functions it calls, `depth` calls deep (`torch.is_grad_enabled` reads `is_grad_enabled`). Found once per class."""
    got = _NAMES.get(cls)
    if got is None:
        def into(fn: Any, names: set[str], left: int, visit: Any) -> None:
            g = getattr(fn, "__globals__", None)
            if left > 0 and isinstance(g, dict):
                for name in names:
                    if isinstance(g.get(name), types.FunctionType):
                        visit(g[name], left - 1)
        got = _NAMES[cls] = frozenset(_visit_forward(cls, depth, into))
    return got
