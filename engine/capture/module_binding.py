"""What binds a module's forward to a chain card: the capture records it, the cast's loader reads it.

It lives in the capture layer because the capture computes it (engine.capture.chain_cards, in the
chain-sampling forward); engine.cast.modules re-exports it for the loader.
"""

from __future__ import annotations

import collections
import collections.abc
import ctypes
import enum
import functools
import hashlib
import json
import logging
import random
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


class _Copy:
    """A container as `held` copied it: its exact type and its items (held in turn), or, for one too large to copy
    at every call (`_BIG`), its identity and length."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: type, items: Any):
        self.kind, self.items = kind, items


class _Unknown:
    """What `held` keeps of an object whose state cannot be read (an iterator, `itertools.count()`): alike to nothing,
    so a forward that may advance it is taken to change it."""

    __slots__ = ()


_AS_IS = frozenset({*_PLAIN, torch.Tensor, torch.nn.Parameter, torch.dtype, torch.device})  # held as they are
_BIG_ARRAY = 1 << 16  # a numpy array with more bytes is held by identity
_BIG = 256  # a container with more items is held by identity and length (a cache growing by a key still shows)


def held(v: Any, objects: bool = False, within: tuple[int, ...] = ()) -> Any:
    """`v` as it is now, for `same` to compare after a forward: lists, tuples, deques, dicts (OrderedDict, defaultdict,
    Counter), sets and bytearrays copied item by item, and the objects and modules among their items with their own
    attributes (`self.trackers[0].calls`, one level: `objects`); Python generators (`random.Random`) by their state,
    small numpy arrays by their bytes (`self.hist[k] += 1`),
    iterators as unknown, the rest held as is (plain values compare by value, other objects by identity)."""
    if type(v) in _AS_IS or isinstance(v, (*_PLAIN, torch.Tensor, type)):
        return v
    if objects and (isinstance(v, torch.nn.Module) or _object(v)):  # an item of a container the module holds
        return _Copy(type(v), {"(id)": id(v), **{k: held(x, False, within) for k, x in vars(v).items()
                                                 if k not in _MODULE_INTERNALS}})
    if isinstance(v, torch.nn.Module):
        return v
    if isinstance(v, (list, tuple, collections.deque, dict, set, frozenset, bytearray)):
        if len(v) > _BIG or id(v) in within:  # too large, or a container holding itself: by identity and length
            return _Copy(type(v), (id(v), len(v)))
        inner = (*within, id(v))
        if isinstance(v, dict):
            return _Copy(type(v), {k: held(x, True, inner) for k, x in v.items()})
        if isinstance(v, (set, frozenset)):
            return _Copy(type(v), frozenset(v))
        if isinstance(v, bytearray):
            return _Copy(bytearray, bytes(v))
        return _Copy(type(v), [held(x, True, inner) for x in v])
    if isinstance(v, random.Random):
        return _Copy(type(v), v.getstate())
    if type(v).__name__ == "ndarray" and getattr(v, "nbytes", _BIG_ARRAY + 1) <= _BIG_ARRAY:  # numpy, by its bytes
        return _Copy(type(v), (v.shape, str(v.dtype), v.tobytes()))
    if isinstance(v, collections.abc.Iterator):
        return _Unknown()
    return v


def _object(v: Any) -> bool:
    """Whether `v` is an object whose attributes `held_objects` reads (a config, a state object)."""
    if isinstance(v, (*_PLAIN, torch.dtype, torch.device, list, tuple, dict, torch.nn.Module, torch.Tensor, type)):
        return False
    try:  # an object without a __dict__ may answer with its own __getattr__, which may raise anything
        return isinstance(object.__getattribute__(v, "__dict__"), dict) and not callable(v)
    except Exception:  # noqa: BLE001 - no readable __dict__: not such an object
        return False


def held_objects(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """(attribute name, object) of the other objects the instance holds, one level down: a transformers config, a
    state object (`self.stats`). Tensors, modules, classes, callables and plain values are not such objects."""
    return [(k, v) for k, v in vars(module).items()
            if k not in _MODULE_INTERNALS and k not in IGNORED_STATE and _object(v)]


def _closure(f: Any) -> list[Any]:
    """The contents of a function's closure cells (an empty cell: none)."""
    out = []
    for c in getattr(f, "__closure__", None) or ():
        try:
            out.append(c.cell_contents)
        except ValueError:
            out.append(_EMPTY)
    return out


_EMPTY = object()


def attributes_held(module: torch.nn.Module) -> dict[str, Any]:
    """What the instance holds as it is now, for `attributes_changed` to compare after its forward: its own attributes
    (those `module_state` reads), objects held, not described; the attributes of the objects it holds (`held_objects`,
    as `name.attr`) and of the objects those hold (`name.attr.sub`); what the functions it holds keep in their
    closures (`name.<closure>`); which tensors and submodules it registers (`_buffers.last`: `self.last = y` on a
    registered buffer replaces the entry); how many hooks it has; and each submodule's own attributes (`path:name`).
    `module_state` is None for a module holding a tensor or another object, so it cannot tell a forward that keeps
    its output (`self.last = y`) or counts its calls in a held object (`self.stats.calls += 1`, or two objects down)
    from one that changes nothing."""
    out = {}
    d = module.__dict__
    for name, v in d.items():
        if name in _MODULE_INTERNALS or name in IGNORED_STATE:
            continue
        out[name] = held(v)
        if type(v) in _AS_IS:
            continue
        if type(v) is types.FunctionType:
            if v.__closure__:
                out[f"{name}.<closure>"] = held(_closure(v))
        elif _object(v):
            for a, x in vars(v).items():
                out[f"{name}.{a}"] = held(x)
                if type(x) not in _AS_IS and _object(x):
                    out.update((f"{name}.{a}.{b}", held(y)) for b, y in vars(x).items())
        elif isinstance(v, torch.nn.Module):  # a module kept outside its submodules (a back-reference to its owner)
            out.update((f"{name}.{a}", held(x)) for a, x in vars(v).items() if a not in _MODULE_INTERNALS)
    for table in ("_parameters", "_buffers", "_modules"):
        out.update((f"{table}.{k}", v) for k, v in d[table].items())
    for table in ("_parameters", "_buffers"):  # a tensor's Python attributes (`self.w.calls += 1`)
        out.update((f"{table}.{k}.__dict__", held(v.__dict__)) for k, v in d[table].items()
                   if v is not None and v.__dict__)
    out["(hooks)"] = "%d %d %d %d" % tuple(len(d[h]) for h in _HOOKS)  # noqa: UP031 - the fastest
    classes = {type(module)}
    if d["_modules"]:
        for path, m in module.named_modules():
            if path:
                out.update((f"{path}:{k}", held(v)) for k, v in vars(m).items()
                           if k not in _MODULE_INTERNALS and k not in IGNORED_STATE)
                classes.add(type(m))
    for c in classes:  # what the forwards it runs reach: its own and its submodules'
        out.update(reached_held(c))
    return out


def reached_held(cls: type) -> dict[str, Any]:
    """What the forward of `cls` reaches besides its instance, as it is now (`forward_scope`): the module-level values
    it reads (`global CACHE`), the attributes of the objects and of the classes of its own module among them
    (`global FLAGS.calls`, `global Cls.calls`), its class's own attributes (`class Cls.calls`: `type(self).calls += 1`,
    a cache shared by every instance) and what its closures hold (`closure`)."""
    scope = forward_scope(cls)
    out: dict[str, Any] = {}
    for c, skip in scope.classes:
        for a, x in c.__dict__.items():
            if a not in skip and _data(a, x):
                out[f"class {c.__qualname__}.{a}"] = held(x)
    for g, name in scope.names:
        v = g.get(name, _EMPTY)
        out[f"global {name}"] = held(v)
        if _object(v):
            out.update((f"global {name}.{a}", held(x)) for a, x in vars(v).items())
        elif isinstance(v, type) and v.__module__ == g.get("__name__"):
            out.update((f"global {name}.{a}", held(x)) for a, x in _class_data(v))
    for f in scope.closures:
        out[f"closure {f.__qualname__}"] = held(_closure(f))
    return out


def _data(k: str, v: Any) -> bool:
    """Whether a class attribute is data (not a function, descriptor or dunder): `calls = 0`, `cache = {}`."""
    return not (k.startswith("__") and k.endswith("__")) and not callable(v) and not isinstance(
        v, (property, staticmethod, classmethod, types.MemberDescriptorType, types.GetSetDescriptorType))


def _class_data(cls: type) -> list[tuple[str, Any]]:
    """A class's own data attributes (`_data`)."""
    return [(k, v) for k, v in vars(cls).items() if _data(k, v)]


class _Scope:
    """What `forward_scope` found of a class's forward: the functions with closures, the module-level names, the
    classes (each with the names of its attributes that are not data), and what it does besides computing."""

    __slots__ = ("closures", "names", "classes", "effect", "code_names")

    def __init__(self, closures: list[types.FunctionType], names: list[tuple[dict, str]],
                 classes: list[tuple[type, frozenset[str]]], effect: str | None, code_names: frozenset[str]):
        self.closures, self.names, self.classes, self.effect = closures, names, classes, effect
        self.code_names = code_names  # every name the code holds (globals, attributes, methods it calls)


_SCOPES: weakref.WeakKeyDictionary[type, _Scope] = weakref.WeakKeyDictionary()

# Names whose call prints, warns, logs or writes a file: a forward calling one does what no kernel does.
TALKS = frozenset({"print", "warn", "warnings", "warning", "warning_once", "warn_once", "info", "info_once", "debug",
                   "critical", "exception", "logger", "logging", "stdout", "stderr", "breakpoint", "pprint",
                   "open", "write", "writelines"})
# Names whose call seeds or sets a generator's state: `torch.manual_seed(0)` at each call leaves the state the second
# call finds as the first left it, so no comparison around one forward shows it.
SEEDS = frozenset({"manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all",
                   "set_state", "fork_rng"})
# Methods that change the container they are called on (read from the bytecode where a module-level name holds it).
MUTATORS = frozenset({"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
                      "remove", "appendleft", "extendleft", "sort", "reverse", "__setitem__", "__delitem__"})
# Names that read the process's environment, which no guard holds (a value set after install).
ENVIRONMENT = frozenset({"environ", "getenv"})
# Names whose call changes a process-wide torch setting (what every later call computes with).
SETTINGS = frozenset({"set_default_dtype", "set_default_device", "set_default_tensor_type", "set_num_threads",
                      "set_num_interop_threads", "set_float32_matmul_precision", "use_deterministic_algorithms",
                      "set_flush_denormal", "set_printoptions", "set_autocast_enabled"})
REGISTERS = frozenset({"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                       "register_full_backward_pre_hook", "register_backward_hook", "register_hook",
                       "register_buffer", "register_parameter", "register_module", "add_module",
                       "register_module_forward_hook", "register_module_forward_pre_hook"})


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):  # comprehensions, lambdas and nested functions
            names |= _code_names(c)
    return names


def _draws(v: Any) -> bool:
    """Whether a module-level value draws from Python's or NumPy's generators (`random`, `from random import random`,
    `np`, a `random.Random`)."""
    if isinstance(v, types.ModuleType):
        return v.__name__ in ("random", "numpy", "numpy.random")
    return isinstance(v, random.Random) or isinstance(getattr(v, "__self__", None), random.Random)


def forward_scope(cls: type, depth: int = 2) -> _Scope:
    """The forward of `cls`, and the functions it calls by a module-level name, a method name of its class or an
    attribute of another module it reads (`helpers.count()`), `depth` calls deep (outside torch), as found once per
    class: their module-level names that hold a value now (not modules or functions), the classes of
    `cls` below nn.Module, and `effect`: why the code does something besides computing, read from its bytecode, or
    None. It writes a global (`global CALLS; CALLS += 1`), a closure cell (`nonlocal count`), or a class attribute
    (`Cls.table = ...` on the first call: the capture's forwards come later and change nothing); it prints, warns or
    logs (TALKS), registers hooks or tensors (REGISTERS), seeds a generator (SEEDS), changes a torch setting (SETTINGS,
    or an attribute set on what a module-level name holds: `torch.backends.cudnn.benchmark = True`), or reads Python's or NumPy's
    generators (`random.random()`, a layer drop): what a cast skips, where the capture's forwards may not show it.
    Names are matched wherever the code holds them, taken or not: declining costs only speed."""
    got = _SCOPES.get(cls)
    if got is None:
        classes = [c for c in cls.__mro__ if c not in (torch.nn.Module, object)]
        forward = cls.forward  # a cast's dispatcher: the class's own forward
        got = _SCOPES[cls] = _scan(getattr(forward, "__kforge_original__", forward), classes, depth)
    return got


def _scan(root: Any, classes: list[type], depth: int = 2) -> _Scope:
    """`forward_scope` of the function `root` (a forward, or a function a module holds), with `classes` the classes
    whose methods it may call and whose data attributes it may set."""
    import dis

    functions: list[types.FunctionType] = []
    seen: set[int] = set()

    def visit(fn: Any, left: int) -> None:
        if not isinstance(fn, types.FunctionType) or id(fn) in seen:
            return
        seen.add(id(fn))
        functions.append(fn)
        for f in [getattr(fn, "__wrapped__", None), *_closure(fn)]:  # a decorated forward: what it wraps
            visit(f, left)
        if left > 0:
            names = _code_names(fn.__code__)
            # other modules it reads (`helpers.count(...)`): their functions it may call by attribute
            spaces = [v.__dict__ for n in names if isinstance(v := fn.__globals__.get(n), types.ModuleType)
                      and not v.__name__.startswith("torch")]
            for name in names:
                f = fn.__globals__.get(name)
                if isinstance(f, (list, tuple, dict)) and len(f) <= _BIG:  # a table of functions (`HANDLERS[k](y)`)
                    for x in (f.values() if isinstance(f, dict) else f):
                        if isinstance(x, types.FunctionType) and not (x.__module__ or "").startswith("torch"):
                            visit(x, left - 1)
                if not isinstance(f, types.FunctionType):  # a method it may call (`self._count()`), a property
                    f = next((c.__dict__[name] for c in classes if name in c.__dict__), None)
                    f = f.fget if isinstance(f, property) else getattr(f, "__func__", f)  # static, class methods
                if not isinstance(f, types.FunctionType):
                    f = next((d[name] for d in spaces if isinstance(d.get(name), types.FunctionType)), None)
                if isinstance(f, types.FunctionType) and not (f.__module__ or "").startswith("torch"):
                    visit(f, left - 1)

    visit(root, depth)
    class_attrs = {k for c in classes for k, _ in _class_data(c)}
    names, effect = [], None
    for fn in functions:
        g = fn.__globals__
        code_names = _code_names(fn.__code__)
        for name in sorted(code_names):
            v = g.get(name, _EMPTY)
            if v is _EMPTY:
                continue
            if effect is None and _draws(v):
                effect = f"it reads {name}, which draws from Python's or NumPy's random numbers"
            if not isinstance(v, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
                names.append((g, name))
            if isinstance(v, type) and v.__module__ == g.get("__name__"):
                class_attrs |= {k for k, _ in _class_data(v)}
        talks = sorted(code_names & TALKS)
        registers = sorted(code_names & REGISTERS)
        if effect is None and talks:
            effect = f"it prints, warns or logs ({', '.join(talks)})"
        if effect is None and registers:
            # named in its code, reached or not (transformers' rotary embeddings call register_buffer only for the
            # dynamic rope types): "may", or every Llama-family user reads of an effect that does not happen
            effect = f"it registers hooks or tensors ({', '.join(registers)}), or may: its code calls it"
        seeds = sorted(code_names & SEEDS)
        if effect is None and seeds:
            effect = f"it seeds or sets a generator ({', '.join(seeds)})"
        env = sorted(code_names & ENVIRONMENT)
        if effect is None and env:
            effect = f"it reads the environment ({', '.join(env)}), which no guard holds"
        settings = sorted(code_names & SETTINGS)
        if effect is None and settings:
            effect = f"it changes a torch setting ({', '.join(settings)})"
        if effect is None:
            chain: list[str] = []  # the attribute loads just before an instruction, from a LOAD_GLOBAL on
            chains: list[list[str]] = []  # `chain` after each instruction
            code = list(dis.get_instructions(fn.__code__))
            for k, ins in enumerate(code):
                if ins.opname in ("STORE_ATTR", "DELETE_ATTR") and chain and chain[0].startswith("global "):
                    # an attribute of what a module-level name holds (`torch.backends.cudnn.benchmark = True`,
                    # `FLAGS.calls = 0`, `Cls.table = [...]`)
                    effect = f"it sets an attribute of the {chain[0]} ({'.'.join([*chain[1:], ins.argval])})"
                    break
                if ins.opname in ("LOAD_METHOD", "LOAD_ATTR") and ins.argval in MUTATORS and chain:
                    # a container a module-level name holds, changed by its method (`SEEN.append(n)`,
                    # `CACHE.setdefault(k, v)`): at the first call only, maybe, which no later forward shows
                    effect = f"it may change the {chain[0]} ({'.'.join([*chain[1:], ins.argval])})"
                    break
                if ins.opname in ("STORE_SUBSCR", "DELETE_SUBSCR") and k >= 2 and chains[k - 2] and \
                        code[k - 1].opname in ("LOAD_FAST", "LOAD_CONST", "LOAD_DEREF"):
                    effect = f"it may change the {chains[k - 2][0]} (an item: `{chains[k - 2][0][7:]}[k] = v`)"
                    break
                chain = [f"global {ins.argval}"] if ins.opname == "LOAD_GLOBAL" else \
                    [*chain, ins.argval] if ins.opname == "LOAD_ATTR" and chain else []
                chains.append(chain)
                if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                    effect = f"it sets the global {ins.argval}"
                elif ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in fn.__code__.co_freevars:
                    effect = f"it sets the closure variable {ins.argval}"
                elif ins.opname in ("STORE_ATTR", "DELETE_ATTR") and ins.argval in class_attrs:
                    effect = f"it may set the class attribute {ins.argval}"
                if effect is not None:
                    break
    # per class, the names that are not data now (functions, descriptors): skipped at each call without a look
    skips = [(c, frozenset(k for k, v in vars(c).items() if not _data(k, v))) for c in classes]
    return _Scope([f for f in functions if f.__closure__], names, skips,
                  effect and f"its forward does more than compute: {effect}",
                  frozenset().union(*(_code_names(f.__code__) for f in functions)))


_HELD_SCANS: weakref.WeakKeyDictionary[types.FunctionType, str | None] = weakref.WeakKeyDictionary()
_CALLED = TALKS | SEEDS | SETTINGS | REGISTERS


def _held_scan(f: types.FunctionType) -> str | None:
    if f not in _HELD_SCANS:
        _HELD_SCANS[f] = _scan(f, []).effect
    return _HELD_SCANS[f]


def held_callable_effect(module: torch.nn.Module) -> str | None:
    """What a function the instance (or a submodule) holds does besides computing, where its forward may call it
    (`self.report = print`, `self.say = functools.partial(logger.info, ...)`, `self.post = lambda y: ...`): the
    builtin's name (TALKS, SEEDS, SETTINGS, REGISTERS) or the function's `_scan`, found once per function; and what a
    method of an object it holds does, where the forward's code names the method (`self.sampler.draw()`)."""
    for m in module.modules():
        names = forward_scope(type(m)).code_names
        items = [(k, v) for k, v in m.__dict__.items() if k not in _MODULE_INTERNALS]
        # and the functions it keeps in a list or dict (`self.fns["noise"](y)`), one level down
        items += [(f"{k}[{j!r}]", x) for k, v in items if isinstance(v, (list, tuple, dict)) and len(v) <= _BIG
                  for j, x in (v.items() if isinstance(v, dict) else enumerate(v)) if callable(x)]
        for k, v in items:
            if _object(v):
                for n in names:
                    f = next((c.__dict__[n] for c in type(v).__mro__ if n in c.__dict__), None)
                    f = f.fget if isinstance(f, property) else f
                    if isinstance(f, types.FunctionType) and (e := _held_scan(f)) is not None:
                        return e.replace("it ", f"{k}.{n} ", 1)
            if not callable(v) or isinstance(v, (torch.nn.Module, type, torch.Tensor)):
                continue
            f = getattr(v, "func", v)  # a functools.partial
            f = getattr(f, "__func__", f)  # a bound method
            name = getattr(f, "__name__", "")
            if name in _CALLED:  # `print`, a logger's `warning`, `torch.manual_seed`
                return f"its forward does more than compute: it may call {k} ({name})"
            if isinstance(f, types.FunctionType) and (e := _held_scan(f)) is not None:
                return e.replace("it ", f"{k} ", 1)
    return None


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


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
    if isinstance(a, _Copy):
        if not isinstance(b, _Copy) or a.kind is not b.kind:
            return False
        x, y = a.items, b.items
        if isinstance(x, dict):
            return isinstance(y, dict) and list(x) == list(y) and all(same(x[k], y[k]) for k in x)
        if isinstance(x, list):
            return isinstance(y, list) and len(x) == len(y) and all(same(u, w) for u, w in zip(x, y))
        return type(x) is type(y) and x == y  # a set's items, a bytearray's bytes, a generator's state, (id, len)
    if isinstance(a, (*_PLAIN, torch.dtype, torch.device)) and type(a) is type(b):
        return a == b  # a plain value recomputed alike (`self.scale = 1 / d ** 0.5`) is no change
    return a is b and not isinstance(a, _Unknown)


def held_arguments(args: tuple) -> Any:
    """A forward's arguments as they are now, for `arguments_changed`: `held(args)`, and the Python attributes of each
    tensor among them (`x.seen = True` on the caller's tensor, which the caller may read)."""
    return held(args), [held(a.__dict__) if isinstance(a, torch.Tensor) else None for a in args]


def arguments_changed(before: Any, args: tuple) -> list[int]:
    """The positions of a forward's arguments that are not what `held_arguments` kept before it ran (a list it was
    passed and appended to, a dict it wrote into, a tensor given an attribute): a cast that runs its plan instead
    would leave them as they were."""
    items, attrs = before
    return [k for k, (a, b, d) in enumerate(zip(items.items, args, attrs))
            if not same(a, held(b)) or (d is not None and not same(d, held(b.__dict__)))]


def rng_state() -> bytes:
    """The state of torch's default CPU generator, as bytes (no ATen call: a trace sees none). A forward that seeds it
    (`torch.manual_seed` in its forward) changes it without a random op, which would end its chain; a cast would not
    seed it. (`torch.manual_seed` seeds the CUDA generators too; one seeding only those is not seen here.)"""
    t = _GENERATOR.get_state()
    return ctypes.string_at(t.data_ptr(), t.numel())


_GENERATOR = torch.random.default_generator


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


def written_inputs(signature: dict[str, Any]) -> list[int]:
    """The chain inputs a member writes in place, directly or through a view of them (`self.avg.mul_(0.9)`,
    `self.buf.copy_(x)`, `x.add_(1)`; engine.capture.chains.chain_written_inputs): a kernel in the forward's place
    writes only the output, so no module card takes such a chain (an install declines it too)."""
    from engine.capture.chains import chain_written_inputs

    index = {a["name"]: i for i, a in enumerate(signature.get("args") or [])}
    return [index[n] for n in chain_written_inputs(signature) if n in index] if signature.get("chain") else []

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
