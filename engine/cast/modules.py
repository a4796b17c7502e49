"""Module cards in eager: a module instance whose forward is exactly a chain card runs the cast's plan.

How a route is hooked in (`attach`): the instance holds its route under `_kforge_route` in its __dict__, and its
class's `forward` is replaced, while any instance of that class (exactly) holds a route, by one dispatcher per
class. The dispatcher calls the class's own forward at once when Dynamo traces, and otherwise calls the
instance's route if it has one. Why this and not the alternatives:

- a wrapper module would change `named_modules()`, `state_dict()` keys and whatever code walks the tree;
- an instance attribute `forward` (what this module did before) makes torch.compile guard on every patched
  module at every call: about 1 us per module on a CPU (scripts/probe_route_guards.py), 1.4 % of Gemma 4 compiled
  on the H200 with an eager-only cast installed (docs/results/reproduce-h200/2026-12-04b). Dynamo tracing the
  dispatcher sees the class's forward and guards nothing of ours;
- hooks cannot skip a forward.

An instance without a route, and an instance of a subclass (a route is used only by the dispatcher of the class
it was made for, so `super().forward` inside a subclass's own forward reaches the original), run the class's
forward as before. Hooks still run in `__call__` around the dispatcher, `state_dict` has no entry for the route,
and removing the last route of a class gives the class back its own `forward` (or none, where it inherited one).
An instance `forward` set by other code is never installed over.

The guard, per call, all O(1) in the number of variants (one dict lookup on the arguments' key):
the exact positional-argument signature (per tensor dtype, shape, strides, alignment, device, neg/conj;
per other argument its value) and no keyword arguments; every parameter the chain reads still the object
held at install, with the same `_version`, data pointer, dtype, shape and strides, and every parameter or buffer
registered as None still None; every submodule the object it was at install (where, at install, the submodules'
classes and attributes equalled a proven instance's, where the cast records them: `bind_variant`); no hooks on the
module or its submodules and no global module hooks; the module's own attributes (eps…) as at install, by value and
type, and no attribute added, where they equal a proven instance's (without recorded states: its plain attributes as
at install), and its training flag as at proof (where the cast records it), its submodules' as its own or not as at
install; what it and its submodules hold besides plain values (a config, a function, a partial) by identity, and the
plain attributes of those objects, three levels down (a config's own configs; objects with slots too), as at install
(`held_object_state`); the plain module-level values, functions and objects the forwards of its tree read (and the
methods, base-class forwards and helpers they call) as at install (forward_reads), and the class attributes they read
(class_reads); torch's default dtype, autocast, and the grad or inference mode where the forward reads it, as at
proof; no grad needed (grad enabled and an input or parameter requiring grad); not while Dynamo or the JIT traces, or
a dispatch mode is active (a capture must see the ATen calls). At install, what the instance holds is compared with
what the proven instances held (`held_description`: its classes and their code, its attributes and its objects', the
globals and class attributes its forwards read), where the cast records it.
Anything else runs the original forward. Coverage is never wider than what was proven; a decline costs
only speed.

Binding (the module entry of a variant, `engine.cast.format`): `args` lists the forward's positional
arguments, each `{"input": i}` (the chain's `in<i>`) or `{"value": v}` (a plain value that must be equal);
`params` maps chain inputs to tensors the module holds, `{"name": "weight", "input": 1}` (a parameter or
buffer, dotted names for submodules), bound by identity at install. A chain of a module has one output,
the forward's return value (the capture binds a module card only where the forward returned that tensor
itself: engine.capture.chain_cards); chains with several outputs, or members that write an input, are
declined at install.
"""

from __future__ import annotations

import copy
import enum
import functools
import json
import operator
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.modules.module as _mm
from torch.utils.hooks import RemovableHandle as _Handle

from engine.capture.module_binding import (  # noqa: F401 - ModuleCardError, module_binding, ... re-exported
    _MODULE_INTERNALS,
    _SMALL,
    IGNORED_STATE,
    MODE,
    MODES,
    ROUTE_ATTR,
    SUBTREE,
    ModuleCardError,
    autocast_state,
    class_forward,
    class_reads,
    forward_globals,
    global_read,
    held_description,
    held_difference,
    held_matches,
    module_binding,
    module_state,
    object_attributes,
    plain_value,
    proven_state,
    state_difference,
    state_matches,
    written_inputs,
)
from engine.cast.guard import descriptor_key, tensor_key, value_key
from engine.cast.runtime import allowed

_LOCK = threading.RLock()
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called")
_MM_GLOBALS = _mm.__dict__  # torch.nn.modules.module's namespace: its global hook tables, read live
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_MISSING = object()
_in_dispatch_mode = torch._C._len_torch_dispatch_stack
_any_autocast = torch._C._is_any_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_deterministic = torch.are_deterministic_algorithms_enabled
_default_dtype = torch.get_default_dtype
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_jit_tracing = torch._C._get_tracing_state
# forward-mode AD (torch.autograd.forward_ad): its `_current_level` is -1 outside every dual_level() block. A plan's
# outputs carry no tangent (its kernels write fresh tensors), where the forward's own ATen calls give theirs one
_forward_ad = torch.autograd.forward_ad


def _held(v: Any) -> bool:
    """Whether a module's attribute is an object or a function it holds (a config, an activation function, a
    partial), which a guard holds by identity: not a plain value, a tensor, a module or a class."""
    return not plain_value(v) and not isinstance(v, (torch.nn.Module, torch.Tensor, type)) and (
        callable(v) or isinstance(v, enum.Enum) or object_attributes(v) is not None)


def _held_items(v: Any) -> bool:
    """A small list or tuple holding a function, an object or a module among its items (not plain values alone,
    which are compared as a module's plain attribute)."""
    return type(v) in (list, tuple) and 0 < len(v) <= _SMALL and not plain_value(v) and any(
        isinstance(x, torch.nn.Module) or _held(x) for x in v)


def held_object_state(mods: Iterable[torch.nn.Module], depth: int = 3,
                      roots: Iterable[tuple[Any, str, Any]] = ()) -> list[tuple[Any, str, Any]]:
    """(namespace, name, value) of what these modules hold besides plain values, tensors and modules: each object
    or function by identity (`self.act = F.gelu`, a config swapped for another), and the plain attributes of the
    objects, `depth` levels down (a transformers config, whose flags a forward reads at every call:
    `self.config.output_gate`, its `text_config.act`), each object once. An object with slots, not a __dict__
    (a slotted dataclass), is its own namespace (`grouped` reads it by attribute). `roots`: other (namespace, name,
    object) to hold alike (a module-level settings object the forward reads)."""
    out: list[tuple[Any, str, Any]] = []
    seen: set[int] = set()

    def visit_items(seq: list | tuple, left: int) -> None:
        """A list or tuple of functions, objects or unregistered modules (`self.acts = [F.gelu]`, a list of
        configs): each item by identity (the container is its namespace, read by index, its length compared), what
        each object holds, and each module's plain attributes (`approximate`, its training flag)."""
        if id(seq) in seen:
            return
        seen.add(id(seq))
        for i, x in enumerate(seq):
            if isinstance(x, torch.nn.Module):
                out.append((seq, i, x))
                md = x.__dict__
                out.extend((md, a, y) for a, y in md.items() if a not in _MODULE_INTERNALS and plain_value(y))
                out.append((md, "training", md.get("training")))
            elif _held(x):
                visit(seq, i, x, left)
            elif plain_value(x):
                out.append((seq, i, x))

    def visit(ns: Any, k: str, v: Any, left: int) -> None:
        out.append((ns, k, v))
        attrs = object_attributes(v) if left > 0 and id(v) not in seen else None
        if isinstance(v, functools.partial) and id(v) not in seen:  # its keywords (its arguments are a tuple)
            seen.add(id(v))
            out.extend((v.keywords, a, x) for a, x in v.keywords.items() if plain_value(x))
        if attrs is None:
            return
        seen.add(id(v))
        try:  # (not through the object's own __getattr__, which may raise anything)
            d = object.__getattribute__(v, "__dict__")
        except Exception:  # noqa: BLE001 - no readable __dict__
            d = None
        inner = d if isinstance(d, dict) and len(d) == len(attrs) else v  # slots: the object itself
        for a, x in attrs:
            if plain_value(x):
                out.append((inner, a, x))
            elif _held(x):
                visit(inner, a, x, left - 1)
            elif _held_items(x) and left > 1:
                out.append((inner, a, x))  # (the container by identity: one put in its place is another)
                visit_items(x, left - 1)

    for m in mods:
        d = m.__dict__
        for k, v in d.items():
            if k in _MODULE_INTERNALS:  # (nn.Module's own tables: its hooks, guarded elsewhere)
                continue
            if _held(v):
                visit(d, k, v, depth)
            elif _held_items(v):
                out.append((d, k, v))
                visit_items(v, depth)
    for ns, k, v in roots:
        visit(ns, k, v, depth)
    return out


def grouped(state: list[tuple[Any, str, Any]], unsized: Iterable[int] | None = ()
            ) -> list[tuple[Any, Any, Any, Any]]:
    """(namespace, a getter of its names, their values now, its size now) per namespace: one C-level read per
    namespace at each call (a Gemma layer and its config, 161 attributes: the whole guard 20 -> 14 µs on this CPU).
    A namespace is a dict (an object's __dict__, a class's), read by item, or an object with slots, read by attribute.
    The values are copies where they are containers: a list or set changed in place must read as changed. The size
    (None for an object with slots, for the namespaces whose ids are in `unsized`: a module's __dict__, which a
    route attached to it later grows, and for all where `unsized` is None: a class's, which an install's dispatcher
    grows) says whether one was added since: a config given an attribute a forward reads
    with a default (`getattr(config, "use_gate", False)`)."""
    names: dict[int, tuple[Any, list[str]]] = {}
    for d, k, _ in state:
        if k not in names.setdefault(id(d), (d, []))[1]:
            names[id(d)][1].append(k)
    skip = None if unsized is None else set(unsized)
    out = []
    for d, keys in names.values():
        if isinstance(d, (dict, types.MappingProxyType)):
            get = operator.itemgetter(*keys) if len(keys) > 1 else (lambda d, k=keys[0]: (d[k],))
            # (a class's namespace grows when an install puts a dispatcher there)
            n = None if skip is None or id(d) in skip or isinstance(d, types.MappingProxyType) else len(d)
        elif type(d) in (list, tuple):  # a held container, by index: an item appended or removed changes its length
            get = operator.itemgetter(*keys) if len(keys) > 1 else (lambda d, k=keys[0]: (d[k],))
            n = len(d)
        else:
            get = operator.attrgetter(*keys) if len(keys) > 1 else (lambda d, k=keys[0]: (getattr(d, k),))
            n = None
        # (a held container is not copied: its items are watched in it, by index, and a copy of a module is not it)
        out.append((d, get, tuple(copy.deepcopy(x) if type(x) in (list, dict, tuple, set) and plain_value(x) else x
                                  for x in get(d)), n))
    return out


_READS: weakref.WeakKeyDictionary[type, list[tuple[dict, str]]] = weakref.WeakKeyDictionary()


def _read_names(cls: type) -> list[tuple[dict, str]]:
    """Every module-level name the forward of `cls` reads (forward_globals, every=True), found once per class."""
    names = _READS.get(cls)
    if names is None:
        names = _READS[cls] = forward_globals([cls], every=True)
    return names


def forward_reads(cls: type) -> list[tuple[dict, str]]:
    """The plain module-level values and functions the forward of `cls` reads now (forward_globals, global_read):
    the names its code reads are found once per class, which of them hold such values is asked at each install."""
    return [(g, k) for g, k in _read_names(cls) if k in g and global_read(g[k])]


def forward_tensors(cls: type) -> list[tuple[dict, str]]:
    """The module-level tensors the forward of `cls` reads now (a mask or table a module keeps as a global), by
    the same names as forward_reads: a CUDA graph reads them at the address they had at its capture."""
    return [(g, k) for g, k in _read_names(cls) if isinstance(g.get(k), torch.Tensor)]


@dataclass
class ModuleVariant:
    """One proven signature of one module: how its forward's arguments and tensors feed the plan."""

    vid: str
    args_key: tuple                          # the key the forward's positional arguments must have
    arg_inputs: tuple[tuple[int, int], ...]  # (positional argument k, chain input i)
    params: tuple[tuple[Any, str, str, torch.Tensor, int, int, int, tuple], ...]
    # ^ (holder module, leaf name, "_parameters" | "_buffers", tensor, version, data_ptr, chain input i,
    #    (dtype, shape, strides)): `weight.data = weight.data.view(dtype)` keeps the object, address and version
    n_inputs: int
    autocast: tuple                          # autocast state at proof (() = off everywhere)
    plan: Callable[[list[Any]], Any]         # plan(in0..inN) -> the chain's outputs (or its one output)
    attrs: tuple[tuple[str, Any], ...] = ()  # the module's own attributes (eps…) as at install, equal to a proof's
    training: bool | None = None             # the module's training flag at proof (None: not recorded, not checked)
    default_dtype: torch.dtype | None = None  # torch's default dtype at proof (None: not recorded, not checked)
    modes: tuple[tuple[Callable[[], bool], bool], ...] = ()  # torch modes the forward reads, as at proof

    def attrs_unchanged(self, module: torch.nn.Module) -> bool:
        d = module.__dict__
        for name, value in self.attrs:
            x = d.get(name, _MISSING)
            # by type too: `x * self.scale` of an integer tensor is an integer with 2, a float with 2.0
            if x != value or type(x) is not type(value):
                return False
        return True

    def params_unchanged(self) -> bool:
        for holder, leaf, where, t, version, ptr, _, (dtype, shape, stride) in self.params:
            if holder.__dict__[where].get(leaf) is not t or (version >= 0 and t._version != version) \
                    or t.data_ptr() != ptr or t.dtype is not dtype or t.shape != shape or t.stride() != stride:
                return False
        return True


def hooks_on(hooked: list[weakref.ref]) -> bool:
    """Whether a global module hook, or a hook on any of these modules (held weakly), is registered now."""
    g = _MM_GLOBALS
    for name in _GLOBAL_HOOKS:
        if g.get(name):
            return True
    for ref in hooked:
        m = ref()
        if m is not None and (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                              or m._backward_pre_hooks):
            return True
    return False


class HookWatch:
    """`hooks_on` for one module tree (held weakly), in O(1) while no hook has been registered anywhere since
    the tree was last seen without one. Every hook registered through PyTorch's API (`register_forward_hook`,
    `register_module_forward_pre_hook`, a tensor's `register_hook`, ...) makes a `RemovableHandle`, whose
    class counter `next_id` only grows; removing hooks can only leave fewer. So while the counter is where it
    was when the tree had none, it still has none, and the walk over every submodule (about 0.14 µs a module:
    111 µs a call for 800 modules on a CI core) is skipped. A hook written into a module's hook table by hand,
    not through the API, is seen only at the next registration anywhere."""

    __slots__ = ("hooked", "_clear_at")

    def __init__(self, tree: Iterable[torch.nn.Module]):
        self.hooked = [weakref.ref(m) for m in tree]
        self._clear_at = -1   # the handle counter when the tree was last seen without hooks

    def __call__(self) -> bool:
        n = getattr(_Handle, "next_id", None)   # None (a torch without the counter): walk every time
        if n is not None and n == self._clear_at:
            return False
        if hooks_on(self.hooked):
            return True
        self._clear_at = -1 if n is None else n
        return False


class NotCopied:
    """A route is its module's, never a copy's: `copy.deepcopy(model)` or pickling a model while a cast is
    installed gives each copied module None in place of the route (the copy runs its class's forward, and
    pickling does not trip over the route's weak references). A copied route called the original module's
    forward: the copy computed with the original's weights, even after the cast was removed and installed
    again. A shallow copy shares the route object; the dispatcher runs a route only for its own module."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return (type(None), ())


@dataclass
class PathStats:
    hits: int = 0
    misses: int = 0                                        # no variant for the arguments' signature
    declines: dict[str, int] = field(default_factory=dict)  # a matching variant not run, by reason

    def decline(self, why: str) -> None:
        self.declines[why] = self.declines.get(why, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "declines": dict(self.declines)}


class ModuleRoute(NotCopied):
    """The route of one module while a cast covers it (see `attach`): the guard, then the plan or the original."""

    def __init__(self, module: torch.nn.Module, path: str, owner: object):
        self.path = path
        self._owner = weakref.ref(owner)
        self.cls = type(module)
        self._forward = class_forward(self.cls)  # the class's own forward, called with the module (held weakly)
        self.fresh(module)

    def fresh(self, module: torch.nn.Module) -> None:
        """As at an install: no variants or counts yet, the module's submodules as they are now, active."""
        self.table: dict[tuple, ModuleVariant] = {}
        self.stats = PathStats()
        self.hooks = HookWatch(module.modules())
        self.module = self.hooks.hooked[0]  # the module itself
        mods = list(module.modules())
        classes = list(dict.fromkeys(type(m) for m in mods))
        dicts = [id(m.__dict__) for m in mods]  # (routes are attached into them: their sizes are not compared)
        # the module's own attributes, by number, as at install (with its route, attached after this): one added
        # since (read by the forward with a default: `getattr(self, "scale", 1.0)`) is not what was proven
        self.n_attrs = len(module.__dict__) + (ROUTE_ATTR not in module.__dict__)
        # the module-level values its forward reads, and its submodules' forwards, and the methods they call, as at
        # install (a flag they branch on)
        self.reads = grouped([(g, k, g[k]) for cls in classes for g, k in forward_reads(cls)], None)
        # the class attributes they read (`self.SCALE`), as at install: a value every instance of a class shares
        self.class_reads = grouped([(c.__dict__, k, c.__dict__[k]) for cls in classes for c, k in class_reads(cls)
                                    if plain_value(c.__dict__[k]) or _held(c.__dict__[k])], None)
        # each submodule by identity, as at install: a submodule swapped in later (PEFT's wrapped Linear, another
        # activation) is not what the plan computes, and the parameter check reads the old one's tensors
        self.modules_held = grouped([(m._modules, k, v) for m in mods for k, v in m._modules.items()])
        # and each submodule's plain attributes (eps, p…), as at install: install compared them with the proof's,
        # and a child given another `eps` computes something else than the plan. One list, read in one pass per call
        # (a leaf has none). Their training flags are compared with the module's instead (`kids`)
        self.tree = self.modules_held + grouped([(m.__dict__, k, v) for m in mods[1:] for k, v in m.__dict__.items()
                                                 if k != ROUTE_ATTR and k != "training" and plain_value(v)], dicts)
        # each parameter or buffer registered as None (`nn.LayerNorm(bias=False)`), as at install: one set to a
        # tensor since is read where the plan reads none
        self.absent = grouped([(table, k, None) for m in mods for table in (m._parameters, m._buffers)
                               for k, t in table.items() if t is None])
        # each submodule's training flag, as its module's or not, as at install (where install compared them with the
        # proof's): a Dropout set to train mode for Monte Carlo dropout computes something else than the plan, and a
        # model installed into in train mode and set to eval after is served
        self.kids = [(m.__dict__, m.training == module.training) for m in mods[1:]]
        # what the module and its submodules hold besides plain values, as at install: a function or a config by
        # identity, and the plain attributes of the objects, down to a config's own configs: a forward branching on
        # `self.cfg.both` returned a tuple once it was set, and the route went on returning the tensor
        # (and the module-level objects the forwards read: a settings object's attributes)
        objects = [(g, k, g[k]) for cls in classes for g, k in forward_reads(cls)
                   if not plain_value(g[k]) and not isinstance(g[k], types.FunctionType)]
        self.held = grouped(held_object_state(mods, roots=objects), dicts + [id(g) for g, _, _ in objects])
        self.active = True

    @property
    def owner(self) -> object:
        return self._owner()

    def original(self, *args: Any, **kwargs: Any) -> Any:
        """The class's forward on the module: what runs whenever the guard declines."""
        return self._forward(self.module(), *args, **kwargs)

    def _tree_unchanged(self, tree: list[tuple[dict, Any, Any]] | None = None) -> bool:
        try:
            for d, get, values, n in (self.tree if tree is None else tree):
                if get(d) != values or (n is not None and len(d) != n):
                    return False
            return True
        except (KeyError, AttributeError):  # a submodule or an attribute deleted
            return False
        except Exception:  # noqa: BLE001 - an object put in the place of one held, whose == raises (an array)
            return False

    def _hooks(self) -> bool:
        return self.hooks()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.active or _dynamo_compiling() or _in_dispatch_mode() or _jit_tracing():
            return self.original(*args, **kwargs)
        st = self.stats
        if kwargs:
            st.misses += 1
            return self.original(*args, **kwargs)
        try:
            if len(args) == 1 and type(args[0]) in _TENSOR_TYPES:  # most module forwards: one tensor
                key = (tensor_key(args[0]),)
            else:
                key = tuple(tensor_key(a) if type(a) in _TENSOR_TYPES else
                            ("tensor-subclass", id(a)) if isinstance(a, torch.Tensor) else ("value", value_key(a))
                            for a in args)
        except (TypeError, RuntimeError):  # an argument without a data pointer (meta), or unhashable
            key = None
        v = self.table.get(key) if key is not None else None
        if v is None:
            st.misses += 1
            return self.original(*args, **kwargs)
        if self._hooks():
            st.decline("hooks")
            return self.original(*args, **kwargs)
        if not v.params_unchanged() or (self.absent and not self._tree_unchanged(self.absent)):
            st.decline("parameters changed")
            return self.original(*args, **kwargs)
        if self.tree and not self._tree_unchanged():
            st.decline("modules changed" if not self._tree_unchanged(self.modules_held) else
                       "submodule attributes changed")
            return self.original(*args, **kwargs)
        if self.held and not self._tree_unchanged(self.held):
            st.decline("held object's attributes changed")
            return self.original(*args, **kwargs)
        m = self.module()
        if m is None or (v.training is not None and m.training != v.training):
            st.decline("training mode")
            return self.original(*args, **kwargs)
        if self.kids:
            t = m.training
            for d, same in self.kids:
                if (d["training"] is t) is not same:
                    st.decline("submodule attributes changed")  # a child's training flag
                    return self.original(*args, **kwargs)
        if not v.attrs_unchanged(m) or len(m.__dict__) != self.n_attrs:
            st.decline("attributes changed")
            return self.original(*args, **kwargs)
        if self.reads and not self._tree_unchanged(self.reads):
            st.decline("globals changed")
            return self.original(*args, **kwargs)
        if self.class_reads and not self._tree_unchanged(self.class_reads):
            st.decline("class attributes changed")
            return self.original(*args, **kwargs)
        if v.default_dtype is not None and _default_dtype() is not v.default_dtype:
            st.decline("default dtype")
            return self.original(*args, **kwargs)
        if (_any_autocast() or v.autocast) and autocast_state() != v.autocast:
            st.decline("autocast")
            return self.original(*args, **kwargs)
        if _grad_enabled() and (any(args[k].requires_grad for k, _ in v.arg_inputs)
                                or any(p[3].requires_grad for p in v.params)):
            st.decline("grad")
            return self.original(*args, **kwargs)
        for mode, proven in v.modes:  # a forward branching on torch's grad or inference mode
            if mode() is not proven:
                st.decline("torch mode")
                return self.original(*args, **kwargs)
        if _forward_ad._current_level >= 0:
            st.decline("forward AD")
            return self.original(*args, **kwargs)
        targets = getattr(v.plan, "targets", None)
        if targets is not None and not allowed(targets):
            st.decline("target")
            return self.original(*args, **kwargs)
        if getattr(v.plan, "reorders", False) and _deterministic():
            st.decline("deterministic algorithms")
            return self.original(*args, **kwargs)
        inputs: list[Any] = [None] * v.n_inputs
        for k, i in v.arg_inputs:
            inputs[i] = args[k]
        for p in v.params:
            inputs[p[6]] = p[3]
        try:
            out = v.plan(inputs)
        except Exception as e:  # a plan that cannot run here: this variant stays on PyTorch from now on
            with _LOCK:
                self.table.pop(key, None)
            from engine.cast.format import CastWarning

            warnings.warn(CastWarning(f"kforge cast: variant {v.vid} of module {self.path} failed on a call and "
                                      f"stays on PyTorch from now on: {type(e).__name__}: {e}"), stacklevel=2)
            return self.original(*args, **kwargs)
        st.hits += 1
        if hasattr(v.plan, "hits"):
            v.plan.hits += 1
        return out[0] if isinstance(out, (list, tuple)) else out


def bind_variant(vid: str, module: torch.nn.Module, signature: dict[str, Any], card: dict[str, Any],
                 plan: Callable[[list[Any]], Any]) -> ModuleVariant:
    """Check a module-card variant against this module instance and bind its parameters by identity.

    `card` is the variant's module entry (`args`, `params`, `autocast`). Raises ModuleCardError.
    """
    from engine.capture.signature import decode_value

    chain = signature.get("chain") or {}
    inputs = signature.get("args") or []
    if len(chain.get("outputs") or []) != 1:
        raise ModuleCardError(f"the chain has {len(chain.get('outputs') or [])} outputs; a module card "
                              "needs exactly one (the forward's return value)")
    written = written_inputs(signature)
    if written:
        raise ModuleCardError(f"the chain writes its input in{written[0]} in place")
    states = card.get("states")
    if states:  # the proof's own attributes (eps, with_scale…) and submodules (their classes and attributes):
        # a module configured otherwise, or calling another child, is not the card's. Checked before the
        # tensors bind: it says why they do not (an nn.Identity where the proof had a norm holds no weight)
        state = proven_state(module)
        if not state_matches(state, states):
            raise ModuleCardError(f"its attributes differ from the proven module's: {state_difference(state, states)}")
        names = [k for k in state if k != SUBTREE]
    else:  # none recorded (an attribute was no plain value, a config): its plain ones are held as at install
        names = [k for k, v in vars(module).items()
                 if k not in _MODULE_INTERNALS and k not in IGNORED_STATE and plain_value(v)]
    helds = card.get("held")
    if helds:  # what the proven instances held (a config's flags, own attributes), as JSON: a model built with
        # another config runs another forward, where `states` could not be recorded (a module holding a config)
        mine = json.loads(json.dumps(held_description(module)))
        # (torch's modes the forward reads are compared at each call: the install runs in its caller's mode)
        mine = {k: v for k, v in mine.items() if not k.startswith(MODE)}
        if not held_matches(mine, [{k: v for k, v in h.items() if not k.startswith(MODE)} for h in helds]):
            raise ModuleCardError(f"what it holds differs from the proven module's: {held_difference(mine, helds[0])}")
    # torch's modes the forwards read, where every proven instance ran in the same
    mode_keys = {k for h in helds or () for k in h if k.startswith(MODE)}
    modes = tuple((MODES[k.removeprefix(MODE + "torch.")], helds[0][k]) for k in sorted(mode_keys)
                  if k.removeprefix(MODE + "torch.") in MODES and len({json.dumps(h.get(k)) for h in helds}) == 1
                  and isinstance(helds[0][k], bool))
    # the default dtype at proof, where recorded, compared at each call too (a model set to float64 after install)
    dd = (helds or [{}])[0].get("torch:default_dtype")
    default_dtype = getattr(torch, dd["torch"].removeprefix("torch."), None) if isinstance(dd, dict) and \
        isinstance(dd.get("torch"), str) else None
    args = card.get("args", [{"input": 0}])
    params = card.get("params", [])
    fed: dict[int, str] = {}
    first_param = next((p for p in module.parameters()), None)
    dev_index = first_param.get_device() if first_param is not None and first_param.is_cuda else (
        torch.cuda.current_device() if torch.cuda.is_available() else 0)
    key, arg_inputs = [], []
    for k, a in enumerate(args):
        if "input" in a:
            i = int(a["input"])
            if not 0 <= i < len(inputs) or i in fed:
                raise ModuleCardError(f"argument {k} names chain input {i}, which does not exist or is fed twice")
            fed[i] = f"argument {k}"
            key.append(descriptor_key(inputs[i], dev_index))
            arg_inputs.append((k, i))
        else:
            try:
                value = decode_value(a.get("value"))
            except ValueError:  # a cast written before the capture refused such arguments: `{"repr": "{}"}`
                raise ModuleCardError(f"argument {k} is a value the guard cannot compare ({a.get('value')!r})") from None
            key.append(("value", value_key(value, dev_index)))
    bound = []
    for p in params:
        i, name = int(p["input"]), p["name"]
        if not 0 <= i < len(inputs) or i in fed:
            raise ModuleCardError(f"{name} names chain input {i}, which does not exist or is fed twice")
        holder_path, _, leaf = name.rpartition(".")
        try:
            holder = module.get_submodule(holder_path) if holder_path else module
        except AttributeError:
            raise ModuleCardError(f"the module holds no {name!r}") from None
        where = "_parameters" if leaf in holder._parameters else "_buffers" if leaf in holder._buffers else None
        t = getattr(holder, where).get(leaf) if where else None
        if t is None:
            raise ModuleCardError(f"the module holds no parameter or buffer {name!r}")
        if type(t) not in _TENSOR_TYPES:  # a wrapper (a quantized weight, a DTensor): its own data_ptr() is not
            # the memory its values are in (0 for one without storage), and a kernel would read from that address
            raise ModuleCardError(f"{name} is a tensor subclass ({type(t).__name__}), not a plain tensor")
        if tensor_key(t) != descriptor_key(inputs[i], t.get_device() if t.is_cuda else dev_index):
            raise ModuleCardError(f"{name} is not the tensor in{i} was proven for (shape, strides, dtype, "
                                  "alignment or device differ)")
        fed[i] = name
        # an inference tensor (a model built under inference_mode) keeps no version counter: -1, held by
        # identity and address alone; the plan reads its values at each call as the forward would
        bound.append((holder, leaf, where, t, -1 if t.is_inference() else t._version, t.data_ptr(), i,
                      (t.dtype, t.shape, t.stride())))
    missing = [i for i in range(len(inputs)) if i not in fed]
    if missing:
        raise ModuleCardError(f"chain input in{missing[0]} is fed neither by an argument nor by a parameter")
    # copies: a list attribute changed in place is then a changed attribute (the live list would equal itself)
    attrs = tuple((name, copy.deepcopy(module.__dict__[name])) for name in names)
    autocast = tuple(tuple(x) for x in card.get("autocast", []))
    return ModuleVariant(vid, tuple(key), tuple(arg_inputs), tuple(bound), len(inputs), autocast, plan,
                         attrs=attrs, training=card.get("training"),
                         default_dtype=default_dtype if isinstance(default_dtype, torch.dtype) else None, modes=modes)


# ------------------------------------------------------------------------------------- install / remove

# The modules holding a route (weakly: the route lives in the module's own __dict__, so a model that is dropped
# while a cast is installed is freed with its route).
_PATCHED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_LIVE: weakref.WeakSet[ModuleRoute] = weakref.WeakSet()  # every route made (one wrapped by other code too)
# Every route made, by module, kept while the module lives and reused when its owner claims the module again
# (one route object per module and owner: its counters and table are refreshed, not rebuilt).
# Routes hold their module and owner weakly, so this keeps neither alive.
_ROUTES: weakref.WeakKeyDictionary[torch.nn.Module, list[ModuleRoute]] = weakref.WeakKeyDictionary()
# Per class whose `forward` is the dispatcher now: (instances attached, the class's own `forward` or _MISSING).
_CLASSES: dict[type, tuple[int, Any]] = {}
# One dispatcher per class, reused at every install (while its original is the class's forward): torch.compile
# guards on the function it traces, and a new one at each install would recompile each time a cast is enabled.
_DISPATCHERS: weakref.WeakKeyDictionary[type, Callable[..., Any]] = weakref.WeakKeyDictionary()
_FINALIZERS: weakref.WeakKeyDictionary[torch.nn.Module, weakref.finalize] = weakref.WeakKeyDictionary()
# The class each attached module had when its route was attached: the one whose forward became the dispatcher.
# A module's class may change while attached (torch.nn.utils.parametrize swaps in a generated subclass).
_ATTACHED_AS: weakref.WeakKeyDictionary[torch.nn.Module, type] = weakref.WeakKeyDictionary()


def _dispatcher(cls: type) -> Callable[..., Any]:
    original = class_forward(cls)
    d = _DISPATCHERS.get(cls)
    if d is not None and d.__kforge_original__ is original:
        return d

    for_cls = weakref.ref(cls)  # not the class itself: _DISPATCHERS would then keep its key alive

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _dynamo_compiling():  # what torch.compile traces: the class's own forward, nothing of ours guarded
            return original(self, *args, **kwargs)
        route = self.__dict__.get(ROUTE_ATTR)
        # none, a subclass's (super().forward in its forward), or another module's (a shallow copy's __dict__)
        if route is None or route.cls is not for_cls() or route.module() is not self:
            return original(self, *args, **kwargs)
        return route(*args, **kwargs)

    functools.update_wrapper(forward, original)
    forward.__kforge_original__ = original  # type: ignore[attr-defined]
    _DISPATCHERS[cls] = forward
    return forward


def route_of(module: torch.nn.Module) -> Any:
    """The route attached to `module` (a ModuleRoute or a graph route), or None."""
    return module.__dict__.get(ROUTE_ATTR)


def attach(module: torch.nn.Module, route: Any) -> str | None:
    """Hook `route` (callable with the forward's arguments; `route.cls` the class it is for) into `module`.
    Returns why not (None when attached): another route is there, or the instance has its own `forward`."""
    with _LOCK:
        d = module.__dict__
        if d.get(ROUTE_ATTR) is not None:   # None: a copy made while a cast was installed (NotCopied)
            return "another route is attached"
        if "forward" in d:
            return "the instance has its own forward (patched by other code); it keeps it"
        cls = type(module)
        n, own = _CLASSES.get(cls, (0, _MISSING))
        if n == 0:
            own = cls.__dict__.get("forward", _MISSING)
            try:
                cls.forward = _dispatcher(cls)
            except (TypeError, AttributeError) as e:  # a class that does not let its attributes be set
                return f"its class's forward cannot be replaced ({type(e).__name__}: {e})"
        _CLASSES[cls] = (n + 1, own)
        d[ROUTE_ATTR] = route  # bypasses nn.Module.__setattr__: not a submodule or parameter
        _PATCHED.add(module)
        _ATTACHED_AS[module] = cls
        # a model dropped with the cast still installed: its class is released when the module is collected
        _FINALIZERS[module] = weakref.finalize(module, _class_released, cls)
        return None


def detach(module: torch.nn.Module, route: Any) -> bool:
    """Unhook `route` from `module` if it is the one attached; the class gets its own forward back with its last."""
    with _LOCK:
        d = module.__dict__
        if d.get(ROUTE_ATTR) is not route:
            return False
        del d[ROUTE_ATTR]
        _PATCHED.discard(module)
        fin = _FINALIZERS.pop(module, None)
        if fin is not None:
            fin.detach()
        # the class attached, not the module's class now: a parametrization registered since made it a subclass,
        # and releasing that one raised (AttributeError: no attribute 'forward'), remove() with it, and left the
        # attached class's dispatcher in place
        _class_released(_ATTACHED_AS.pop(module, type(module)))
        return True


class RouteSet:
    """Routes of one kind on the outermost of a model's modules that `select` picks (held weakly, like the
    model). A subclass makes each route (`make_route`: None, with `self.skipped[path]` set, to leave a module
    out); a module is left out too where its instance has its own forward or another route. `install` hooks
    the routes in (`attach`), `remove` takes them out; also a context manager."""

    def __init__(self, model: torch.nn.Module, select: Callable[[str, torch.nn.Module], bool]):
        self.routes: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}
        taken: list[str] = []
        for path, m in model.named_modules():
            if not select(path, m) or any(p == "" or path.startswith(p + ".") for p in taken):
                continue   # not picked, or inside a module already routed (its route covers it)
            if "forward" in m.__dict__ or route_of(m) is not None:
                self.skipped[path] = "the instance has its own forward (a module card, or other code's)"
                continue
            r = self.make_route(path, m)
            if r is not None:
                taken.append(path)
                self.routes[path] = r
        self._model = weakref.ref(model)

    def make_route(self, path: str, module: torch.nn.Module) -> Any:
        raise NotImplementedError

    @property
    def model(self) -> torch.nn.Module | None:
        return self._model()

    def install(self):   # -> Self
        for path, r in self.routes.items():
            m = r.module()
            if m is None:
                continue
            why = attach(m, r)
            if why is None:
                r.active = True
            else:
                self.skipped[path] = why
        return self

    def remove(self) -> None:
        for r in self.routes.values():
            r.active = False
            m = r.module()
            if m is not None:
                detach(m, r)

    def __enter__(self):   # -> Self
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _class_released(cls: type) -> None:
    """One route of `cls` gone (detached, or its module collected while attached): with the last, the class
    gets its own forward back (unless other code has put another there since)."""
    with _LOCK:
        if cls not in _CLASSES:   # never attached (or released already): nothing of ours to undo
            return
        n, own = _CLASSES[cls]
        if n > 1:
            _CLASSES[cls] = (n - 1, own)
            return
        _CLASSES.pop(cls, None)
        if cls.__dict__.get("forward") is _DISPATCHERS.get(cls):
            if own is _MISSING:
                del cls.forward
            else:
                cls.forward = own


def _route_for(owner: object, module: torch.nn.Module, path: str) -> ModuleRoute:
    routes = [r for r in _ROUTES.get(module, ()) if r.owner is not None]  # routes of dead owners go
    route = next((r for r in routes if r.owner is owner and r.path == path), None)
    if route is None:
        route = ModuleRoute(module, path, owner)
        routes.append(route)
    else:
        route.fresh(module)
    _ROUTES[module] = routes
    return route


def claim(owner: object, module: torch.nn.Module, path: str, variants: list[ModuleVariant]) -> str | None:
    """Route `module`'s forward for `owner` with these variants. Returns why not (None when installed):
    another cast claims the module (first wins), or the instance already has its own `forward`."""
    with _LOCK:
        current = route_of(module)
        if isinstance(current, ModuleRoute) and current.owner is owner:
            route = current
        elif current is not None:
            return "claimed by another installed cast"
        elif "forward" in module.__dict__:
            return "the instance has its own forward (patched by other code); it keeps it"
        else:
            route = _route_for(owner, module, path)
        for v in variants:
            route.table.setdefault(v.args_key, v)  # a signature proven twice: the first variant keeps it
        if current is None:
            why = attach(module, route)
            if why is not None:
                return why
            _LIVE.add(route)
        return None


def release(owner: object) -> dict[str, PathStats]:
    """Take `owner`'s routes out (each module's and class's attribute state as before); their counters by path."""
    kept = {}
    with _LOCK:
        for route in list(_LIVE):  # a route other code holds on to passes calls through now
            if route.owner is owner:
                route.active = False
                route.table = {}  # its variants hold the module's parameters and their holders
                kept[route.path] = route.stats
        for module in list(_PATCHED):
            route = route_of(module)
            if isinstance(route, ModuleRoute) and route.owner is owner:
                detach(module, route)
    return kept


def routes_of(owner: object) -> dict[str, ModuleRoute]:
    """`owner`'s installed module routes by path."""
    with _LOCK:
        found = (route_of(m) for m in list(_PATCHED))
        return {r.path: r for r in found if isinstance(r, ModuleRoute) and r.owner is owner}
