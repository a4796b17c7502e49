"""Layout routes: a convolutional module's forward run with its image inputs channels-last, behind a guard.

Why. cuDNN's fast convolution kernels on Hopper are NHWC. Given NCHW (contiguous) tensors, eager PyTorch
runs each convolution as a transpose of its input to NHWC, the NHWC kernel, and a transpose of its output
back (`nchwToNhwcKernel` / `nhwcToNchwKernel` in a profile: 575 of ResNet-50's 3,592 GPU µs per forward on
the H200, docs/results/cast-h200/cast_profile_resnet50.md). torch.compile's layout optimization keeps a
convolutional model's activations channels-last between its convolutions; eager never does. A layout route
does it in eager for one module: its 4-D floating-point positional arguments are made channels-last, the
module's own forward runs (a convolution given a channels-last input runs NHWC and returns NHWC; pointwise
ops, upsampling and the cast's channels-last twins keep the layout), and every output tensor is given back
in the strides eager gives it at that signature. No parameter, buffer or line of the model changes.

GroupNorm. On CUDA, `F.group_norm` (the composite `aten::group_norm`) copies a channels-last input to NCHW
before `native_group_norm`: in a routed VAE decoder every GroupNorm copied its input back to NCHW, the
convolution after it ran with its transposes again, and the residual add mixed layouts (sd35_medium's Decoder
routed: 26 ms of copies, 0.64x; docs/results/sd35-layout-2026-12-06c/). While a routed forward runs,
`F.group_norm` of a 4-D channels-last tensor calls `native_group_norm` on it directly (`_KeepLayout`, a
TorchFunctionMode entered only for modules holding an `nn.GroupNorm`): the same op the composite calls, on the
same values, so the cast's channels-last twin serves it where it holds one. Where none does, eager's CUDA
kernel refuses a channels-last tensor (torch 2.11: "Expected X.is_contiguous(memory_format)", checked before it
launches anything): that signature then goes through F.group_norm as before (its copy), remembered until the
routed entries change (a cast installed or removed, a twin added), and the export's whole-model trial says
whether the route still pays.

The export proves a route per module class on the whole model (engine/export/layout_check.py): the model's
output with the route must agree with eager PyTorch's about as well as the cast's own kernels let it, and the
model must be faster with confidence. The cast records the class and each proven signature (arguments, and
the outputs' shapes and strides), and an install with the model attaches routes to the outermost modules of
that class (engine.cast.modules.attach: the class's forward is dispatched, the module tree untouched).

The guard, per call (anything else runs the original forward; a decline costs only speed):
- not while Dynamo or the JIT traces or a dispatch mode is active (torch.compile does its own layouts);
- positional arguments only, with the exact signature proven (per tensor dtype, shape, strides, alignment,
  device; per plain value its value);
- no hooks on the module, its submodules or global module hooks (a hook would see the other layout);
- the training flag as at proof; no autocast; no grad needed (grad enabled and an argument or a parameter
  of the module requiring grad);
- the target the call is made under among those the export proved (eager; a CUDA-graph capture too where
  proven).
A forward that writes an argument in place or returns a view of one is never routed (the export's trial refuses
its signature: a route would write, or return, a channels-last copy). A forward that raises on the channels-last
arguments (a `view` that needs NCHW strides), or returns another structure or shapes than at proof, runs the
original forward and leaves that signature on PyTorch from then on,
with one warning. Not guarded: code that reads strides and silently computes something else on other inputs
of the proven signature (the proof ran the model's own path on its own values).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from engine.cast import modules, runtime
from engine.cast.guard import descriptor_key, tensor_key, value_key
from engine.cast.modules import HookWatch, _dynamo_compiling, _in_dispatch_mode, _jit_tracing

MEMORY_FORMAT = "channels_last"
_SCALARS = (type(None), bool, int, float, str)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_CONV_TYPES = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)  # no forward of their own: never called
_grad_enabled = torch.is_grad_enabled
_any_autocast = torch._C._is_any_autocast_enabled
_LOCK = threading.RLock()


def describe(t: torch.Tensor) -> dict[str, Any]:
    """A tensor as a layout route's signature records it (engine.cast.guard.descriptor_key reads it back)."""
    p = t.data_ptr()
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "stride": list(t.stride()),
            "align": (p & -p) if p & 15 else 16, "device": t.device.type}


def _arg_key(a: Any) -> Any:
    """One positional argument's part of the key; None where no signature can hold it (an object, a list)."""
    if type(a) in _TENSOR_TYPES:
        return tensor_key(a)
    if type(a) in _SCALARS:
        return ("value", value_key(a))
    return None


def _converted(key: tuple) -> tuple[int, ...]:
    """The positional arguments a route makes channels-last: 4-D floating-point tensors not already so."""
    out = []
    for k, part in enumerate(key):
        if part and part[0] != "value" and isinstance(part[0], torch.dtype) and part[0].is_floating_point \
                and len(part[1]) == 4:
            out.append(k)
    return tuple(out)


@dataclass
class Entry:
    """One proven signature: which arguments go channels-last, and each output's shape and eager strides."""

    convert: tuple[int, ...]
    outputs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    training: bool
    record: dict[str, Any]  # the signature as the manifest holds it


@dataclass
class LayoutStats:
    hits: int = 0
    misses: int = 0                                        # no proven signature for the arguments
    learned: int = 0                                       # signatures recorded (export's trial only)
    declines: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)   # signature -> why it went back to PyTorch

    def decline(self, why: str) -> None:
        self.declines[why] = self.declines.get(why, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "learned": self.learned, "declines": dict(self.declines),
                "failed": dict(self.failed)}


_GROUP_NORM = torch.nn.functional.group_norm
_native_group_norm = torch.ops.aten.native_group_norm.default
# Channels-last signatures native_group_norm refused (with the routed entries then): F.group_norm runs for them
_REFUSED: set[tuple] = set()


def _channels_last_4d(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_contiguous() \
        and t.is_contiguous(memory_format=torch.channels_last)


def _group_norm_keeping_layout(input: Any, num_groups: int, weight: Any = None, bias: Any = None,
                               eps: float = 1e-5) -> Any:
    """`F.group_norm` of a 4-D channels-last tensor as `native_group_norm` of the tensor itself (the composite
    copies it to NCHW first on CUDA); None where the call is not that (F.group_norm runs as it is)."""
    if not _channels_last_4d(input) or type(num_groups) is not int or num_groups <= 0:
        return None
    n, c, h, w = input.shape
    if c % num_groups or any(t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (c,))
                             for t in (weight, bias)):
        return None   # F.group_norm raises its own error
    key = (input.dtype, tuple(input.shape), input.stride(), input.device, runtime.entries_version())
    if key in _REFUSED:
        return None
    try:
        return _native_group_norm(input, weight, bias, n, c, h * w, num_groups, float(eps))[0]
    except RuntimeError:
        # eager's CUDA kernel takes NCHW only ("Expected X.is_contiguous(memory_format)", checked before any
        # launch): without a cast variant for this channels-last signature, the composite's copy it is
        with _LOCK:
            if len(_REFUSED) >= 256:
                _REFUSED.clear()
            _REFUSED.add(key)
        return None


class _KeepLayout(torch.overrides.TorchFunctionMode):
    """While a routed forward runs: GroupNorm keeps a channels-last input's layout (see the module doc)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is _GROUP_NORM:
            out = _group_norm_keeping_layout(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _holds_group_norm(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.GroupNorm) for m in module.modules())


def _outputs(out: Any) -> tuple[list[Any], Any, str | None]:
    """The forward's output flattened (pytree), its spec, and why a route cannot take it (None when it can)."""
    leaves, spec = tree_flatten(out)
    if not any(isinstance(x, torch.Tensor) for x in leaves):
        return leaves, spec, "no tensor in the output"
    for x in leaves:
        if not isinstance(x, torch.Tensor) and type(x) not in _SCALARS:
            return leaves, spec, f"a {type(x).__name__} in the output"
    return leaves, spec, None


class LayoutRoute(modules.NotCopied):
    """The layout route of one module instance (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, path: str, targets: frozenset[str], learn: bool = False):
        self.path = path
        self.cls = type(module)
        self._forward = modules.class_forward(self.cls)
        self.module = weakref.ref(module)
        self.hooks = HookWatch(module.modules())
        self.targets = targets
        self.learn = learn  # the export's trial: a signature's first call runs eagerly and records it
        self.table: dict[tuple, Entry] = {}
        self.refused: set[tuple] = set()  # signatures a trial found a route cannot take (never learned again)
        self.stats = LayoutStats()
        self.active = False
        self.keep_group_norm = _holds_group_norm(module)

    def add(self, record: dict[str, Any], device_index: int) -> bool:
        """A proven signature from a manifest; False when it cannot be read."""
        try:
            key = tuple(("value", value_key(a["value"])) if "value" in a else descriptor_key(a["tensor"], device_index)
                        for a in record["args"])
            outs = tuple((tuple(o["shape"]), tuple(o["stride"])) for o in record["outputs"])
            self.table[key] = Entry(_converted(key), outs, bool(record["training"]), record)
        except (KeyError, TypeError, AttributeError, ValueError):
            return False
        return True

    def original(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(self.module(), *args, **kwargs)

    def _learn(self, key: tuple, args: tuple) -> Any:
        tensors = [a for a in args if type(a) in _TENSOR_TYPES]
        versions = [t._version for t in tensors]
        out = self.original(*args)
        leaves, _, why = _outputs(out)
        if why is None and any(t._version != v for t, v in zip(tensors, versions)):
            why = "the forward writes an argument in place (a route would write a channels-last copy)"
        if why is None and any(isinstance(x, torch.Tensor) and any(x.untyped_storage().data_ptr() ==
                                                                   t.untyped_storage().data_ptr() for t in tensors)
                               for x in leaves):
            why = "the forward returns a view of an argument (a route would return a copy)"
        m = self.module()
        if why is not None or m is None:
            self.refused.add(key)
            self.stats.failed[str(len(self.stats.failed))] = why or "module gone"
            return out
        rec = {"args": [{"tensor": describe(a)} if type(a) in _TENSOR_TYPES else {"value": a} for a in args],
               "outputs": [describe(x) for x in leaves if isinstance(x, torch.Tensor)], "training": m.training}
        outs = tuple((tuple(x.shape), tuple(x.stride())) for x in leaves if isinstance(x, torch.Tensor))
        self.table[key] = Entry(_converted(key), outs, m.training, rec)
        self.stats.learned += 1
        return out

    def _give_up(self, key: tuple, why: str) -> None:
        with _LOCK:
            self.table.pop(key, None)
        self.stats.failed[str(len(self.stats.failed))] = why
        from engine.cast.format import CastWarning

        where = self.path or "(the model)"
        warnings.warn(CastWarning(f"kforge cast: the channels-last route of {self.cls.__name__} {where} stays on PyTorch "
                                  f"for this signature from now on: {why}"), stacklevel=3)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.active or _dynamo_compiling() or _in_dispatch_mode() or _jit_tracing():
            return self.original(*args, **kwargs)
        st = self.stats
        if kwargs:
            st.misses += 1
            return self.original(*args, **kwargs)
        try:
            key = tuple(_arg_key(a) for a in args)
        except (TypeError, RuntimeError):  # a tensor without a data pointer (meta), an unhashable value
            key = None
        if key is None or None in key:
            st.misses += 1
            return self.original(*args, **kwargs)
        e = self.table.get(key)
        if e is None:
            if self.learn and key not in self.refused and _converted(key):
                return self._learn(key, args)
            st.misses += 1
            return self.original(*args)
        m = self.module()
        if m is None or self.hooks():
            st.decline("hooks")
            return self.original(*args)
        if m.training != e.training:
            st.decline("training mode")
            return self.original(*args)
        if _any_autocast():
            st.decline("autocast")
            return self.original(*args)
        if _grad_enabled() and (any(type(a) in _TENSOR_TYPES and a.requires_grad for a in args)
                                or any(p.requires_grad for p in m.parameters())):
            st.decline("grad")
            return self.original(*args)
        if not runtime.allowed(self.targets):
            st.decline("target")
            return self.original(*args)
        routed = list(args)
        for k in e.convert:
            routed[k] = args[k].contiguous(memory_format=torch.channels_last)
        try:
            if self.keep_group_norm:
                with _KeepLayout():
                    out = self._forward(m, *routed)
            else:
                out = self._forward(m, *routed)
        except Exception as exc:  # the forward needs eager's layout somewhere (a view): PyTorch from now on
            self._give_up(key, f"the forward raised on channels-last arguments: {type(exc).__name__}: {exc}")
            return self.original(*args)
        leaves, spec, why = _outputs(out)
        tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        if why is not None or len(tensors) != len(e.outputs) \
                or any(tuple(leaves[i].shape) != e.outputs[j][0] for j, i in enumerate(tensors)):
            self._give_up(key, why or "the output's structure or shapes differ from the proof's")
            return self.original(*args)
        for j, i in enumerate(tensors):  # eager's strides, exactly as at proof
            t, (shape, stride) = leaves[i], e.outputs[j]
            if tuple(t.stride()) != stride:
                leaves[i] = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)
        st.hits += 1
        return tree_unflatten(leaves, spec)

    def signatures(self) -> list[dict[str, Any]]:
        return [e.record for e in self.table.values()]


def conv_count(module: torch.nn.Module) -> int:
    """2-D convolutions in the module's tree (itself included)."""
    return sum(1 for m in module.modules() if isinstance(m, _CONV_TYPES))


def candidates(model: torch.nn.Module, least: int = 2) -> list[str]:
    """Classes to try, in order: those whose instances hold at least `least` 2-D convolutions, the one holding
    the most first (the model's own class where it qualifies), containers without a forward left out."""
    size: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, _CONTAINERS):
            continue
        n = conv_count(m)
        if n >= least:
            name = type(m).__name__
            size[name] = max(size.get(name, 0), n)
    return sorted(size, key=lambda n: (-size[n], n))


class LayoutSet(modules.RouteSet):
    """Layout routes on a model's modules: the outermost of those `select` picks. `signatures` (class name ->
    records, from a manifest) are what they may serve; `learn` (the export's trial) records them instead."""

    def __init__(self, model: torch.nn.Module, select: Callable[[str, torch.nn.Module], bool],
                 signatures: dict[str, list[dict[str, Any]]] | None = None, targets: frozenset[str] | None = None,
                 learn: bool = False):
        self._signatures = signatures
        self._targets = targets or frozenset({runtime.EAGER})
        self._learn = learn
        super().__init__(model, select)

    def make_route(self, path: str, module: torch.nn.Module) -> LayoutRoute | None:
        r = LayoutRoute(module, path, self._targets, self._learn)
        if self._signatures is not None:
            dev = _device_index(module)
            records = self._signatures.get(type(module).__name__) or []
            if not all([r.add(rec, dev) for rec in records]) or not r.table:
                self.skipped[path] = "no readable signature for its class in the cast"
                return None
        return r

    def stats(self) -> dict[str, Any]:
        return {p: r.stats.as_dict() for p, r in self.routes.items()}

    def reset_counters(self) -> None:
        for r in self.routes.values():
            r.stats.hits = r.stats.misses = 0
            r.stats.declines = {}

    def summary(self) -> dict[str, Any]:
        """Counters summed over the routes: modules routed, hits, misses, declines by reason, failures."""
        out: dict[str, Any] = {"modules": len(self.routes), "hits": 0, "misses": 0, "declines": {}, "failed": []}
        for r in self.routes.values():
            s = r.stats
            out["hits"] += s.hits
            out["misses"] += s.misses
            for why, n in s.declines.items():
                out["declines"][why] = out["declines"].get(why, 0) + n
            out["failed"] += [f"{r.path}: {w}" for w in s.failed.values()]
        return out

    def signatures(self) -> dict[str, list[dict[str, Any]]]:
        """The signatures the routes hold, by class, each once."""
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.routes.values():
            have = out.setdefault(r.cls.__name__, [])
            have += [s for s in r.signatures() if s not in have]
        return out


def _device_index(m: torch.nn.Module) -> int:
    for t in m.parameters():
        return t.get_device()
    return torch.cuda.current_device() if torch.cuda.is_available() else -1
