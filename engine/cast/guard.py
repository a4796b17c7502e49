"""The guard: a hashable key for the exact signature of a live call, equal to the key of the captured
signature it matches. A dict lookup on it is the whole decision (O(1) in the number of variants).

Per tensor the key holds dtype, shape, strides (a size-1 dim's as 0: it is never used to address an element,
kernels get data pointers only, and eager, Inductor and meta kernels disagree on it: a [1, C, H, W]
channels-last tensor has C or C·H·W there), the byte alignment of its data pointer (capped at 16,
as cards record it), device index and the negative/conjugate view bits; per value argument its value
(lists as tuples; a number in a `Scalar` or `Tensor` slot with its type, a float zero with its sign, in a
`float` slot too; a device with its index); for ops that write an argument, which arguments share storage. Coverage is never
wider than what was proven: anything that differs is a miss, and a miss costs only speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.ops import key_strides

_MISSING = object()


@dataclass(frozen=True)
class OpLayout:
    """What the guard needs of an op's schema, computed once per op."""

    op_name: str
    names: tuple[str, ...]
    kinds: tuple[str, ...]            # 'tensor' | 'tensor_list' | 'value' per schema argument
    kwarg_only: tuple[bool, ...]
    defaults: tuple[Any, ...]         # _MISSING where the schema has no default
    scalar_slots: tuple[int, ...]     # plain `Tensor` arguments a Python scalar may arrive in
    writes: bool                      # the op mutates an argument (in-place or out=)
    first_tensor: bool                # argument 0 is a plain tensor (the cheap pre-filter reads it)
    plain_values: tuple[bool, ...] = ()  # value arguments that are hashable scalars as they arrive
    # `float` / `float?` arguments among them: a zero is keyed with its sign (`plain_key`), as the C++ router does
    float_values: tuple[bool, ...] = ()

    @property
    def positional(self) -> int:
        return sum(1 for k in self.kwarg_only if not k)


# Value arguments keyed as they arrive (a[i]): the dispatcher hands them over in the schema's own type, so 1 and
# 1.0 cannot both reach a `float` slot. Not `Scalar`: an int and a float with equal values promote differently
# there (`add(x, y, alpha=2)` of int tensors runs, `alpha=2.0` raises), so it is keyed by type (`value_key`).
_PLAIN_VALUE_TYPES = {"float", "int", "bool", "str", "SymInt", "Optional[float]", "Optional[int]",
                      "Optional[bool]", "Optional[str]", "Optional[SymInt]", "ScalarType",
                      "Optional[ScalarType]", "Layout", "Optional[Layout]", "MemoryFormat",
                      "Optional[MemoryFormat]"}


def layout_of(op: torch._ops.OpOverload) -> OpLayout:
    """The OpLayout of an ATen overload."""
    names, kinds, kw, defaults, scalar_slots = [], [], [], [], []
    for i, a in enumerate(op._schema.arguments):
        t = str(a.type)
        kind = ("tensor" if t in ("Tensor", "Optional[Tensor]") else
                "tensor_list" if t in ("List[Tensor]", "List[Optional[Tensor]]") else "value")
        if t == "Tensor":
            scalar_slots.append(i)
        names.append(a.name)
        kinds.append(kind)
        kw.append(bool(a.kwarg_only))
        defaults.append(a.default_value if a.has_default_value() else _MISSING)
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)
    plain = tuple(str(a.type) in _PLAIN_VALUE_TYPES for a in op._schema.arguments)
    floats = tuple(str(a.type) in ("float", "Optional[float]") for a in op._schema.arguments)
    return OpLayout(op.name(), tuple(names), tuple(kinds), tuple(kw), tuple(defaults), tuple(scalar_slots),
                    writes, bool(kinds) and kinds[0] == "tensor" and str(op._schema.arguments[0].type) == "Tensor",
                    plain, floats)


# ------------------------------------------------------------------------------- live calls


def bind(layout: OpLayout, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Argument values in schema order, defaults filled in (the dispatcher leaves defaults out)."""
    n = len(layout.names)
    if not kwargs and len(args) == n:
        return list(args)
    out = list(args)
    for i in range(len(args), n):
        v = kwargs.get(layout.names[i], _MISSING)
        if v is _MISSING:
            v = layout.defaults[i]
            if v is _MISSING:
                v = None
        out.append(v)
    return out


def tensor_key(t: torch.Tensor) -> tuple:
    """dtype, shape, strides (`key_strides`), pointer alignment (≤ 16), device index, neg and conj bits."""
    p, shape = t.data_ptr(), t.shape
    return (t.dtype, shape, key_strides(shape, t.stride()), (p & -p) if p & 15 else 16, t.get_device(),
            t.is_neg(), t.is_conj())


_NUMBERS = (bool, int, complex)


def value_key(v: Any, device_index: int | None = None) -> Any:
    """A plain argument as a hashable value (lists as tuples, a device by its type and index). A number is keyed
    with its type, and a float zero with its sign: 3 == 3.0 == True - 2 as Python compares them, but `x + 3` of an
    int32 tensor is int32 and `x + 3.0` float32, and `x * -0.0` has the zeros' signs flipped.

    A GPU device without an index is the current one (what eager puts the result on): `device_index` where given
    (a captured signature, which records the device's type alone, for the device its variant runs on), else the
    current device. A device was keyed by its type alone, and `x.to("cuda:1", torch.float16)` of a tensor on
    cuda:0 ran a `_to_copy` variant proven for `device=cuda`, which returned its output on cuda:0."""
    t = type(v)
    if t is float:
        return (float, v, math.copysign(1.0, v)) if v == 0 else (float, v)
    if t in _NUMBERS:
        return (t, v)
    if isinstance(v, (list, tuple)):
        return tuple(value_key(x, device_index) for x in v)
    if isinstance(v, torch.device):
        index = v.index
        if index is None and v.type != "cpu":
            index = device_index if device_index is not None else _current_index(v.type)
        return ("device", v.type, index)
    if isinstance(v, torch.Tensor):  # a tensor where a value was expected never matches a signature
        return ("tensor", id(v))
    return v


def _current_index(device_type: str) -> int:
    """The current device's index of that type (0 where the type has no notion of one here)."""
    mod = getattr(torch, device_type, None)
    try:
        return int(mod.current_device()) if mod is not None and mod.is_available() else 0
    except (AttributeError, RuntimeError):
        return 0


def plain_key(v: Any) -> Any:
    """A `float` / `float?` argument as keyed: as it is, a zero with its sign (0.0 == -0.0, but
    `nan_to_num(x, nan=-0.0)` gives negative zeros). Cheap where it is not zero."""
    return v if v else value_key(v)


def call_key(layout: OpLayout, bound: Sequence[Any]) -> tuple:
    """The key of one live call (`bound` from `bind`)."""
    key = []
    for i, (kind, v) in enumerate(zip(layout.kinds, bound)):
        if kind == "tensor":
            key.append(tensor_key(v) if isinstance(v, torch.Tensor) else
                       None if v is None else ("scalar", value_key(v)))
        elif kind == "tensor_list":
            key.append(tuple(tensor_key(x) if isinstance(x, torch.Tensor) else None for x in v)
                       if v is not None else None)
        elif layout.float_values and layout.float_values[i]:
            key.append(plain_key(v))
        else:
            key.append(v if layout.plain_values and layout.plain_values[i] else value_key(v))
    if layout.writes:
        key.append(live_aliases(layout, bound))
    return tuple(key)


def _tensor_key_or_value(v: Any, _tensor=torch.Tensor) -> Any:
    if isinstance(v, _tensor):
        p, shape = v.data_ptr(), v.shape
        return (v.dtype, shape, key_strides(shape, v.stride()), (p & -p) if p & 15 else 16, v.get_device(),
                v.is_neg(), v.is_conj())
    return None if v is None else ("scalar", value_key(v))


def key_function(layout: OpLayout):
    """`fn(args) -> key` specialised to the op's schema, equal to `call_key(layout, args)` for a full
    argument list in schema order: one generated tuple expression instead of a loop over the schema
    (the guard runs on every call of the op, so its constant factor is the dispatch overhead)."""
    parts = []
    for i, kind in enumerate(layout.kinds):
        if kind == "tensor":
            parts.append(f"tk(a[{i}])")
        elif kind == "tensor_list":
            parts.append(f"(None if a[{i}] is None else tuple(tk(x) if isinstance(x, T) else None for x in a[{i}]))")
        elif layout.float_values and layout.float_values[i]:
            parts.append(f"(a[{i}] if a[{i}] else vk(a[{i}]))")   # plain_key, inline
        elif layout.plain_values and layout.plain_values[i]:
            parts.append(f"a[{i}]")
        else:
            parts.append(f"vk(a[{i}])")
    if layout.writes:
        parts.append("la(layout, a)")
    src = f"def key(a):\n    return ({', '.join(parts)}{',' if len(parts) == 1 else ''})\n"
    scope = {"tk": _tensor_key_or_value, "vk": value_key, "la": live_aliases, "layout": layout,
             "T": torch.Tensor}
    exec(compile(src, f"<kforge guard {layout.op_name}>", "exec"), scope)  # noqa: S102 - our own template
    return scope["key"]


def live_aliases(layout: OpLayout, bound: Sequence[Any]) -> tuple:
    """Groups (≥ 2) of argument paths whose tensors share storage, as the capture records them."""
    groups: dict[int, list[str]] = {}
    for name, kind, v in zip(layout.names, layout.kinds, bound):
        items = [(name, v)] if kind == "tensor" else \
            [(f"{name}[{j}]", x) for j, x in enumerate(v or ())] if kind == "tensor_list" else []
        for path, t in items:
            if isinstance(t, torch.Tensor) and t.numel():
                groups.setdefault(t.untyped_storage().data_ptr(), []).append(path)
    return tuple(tuple(g) for g in groups.values() if len(g) > 1)


# ------------------------------------------------------------------------- captured signatures


def descriptor_key(d: dict[str, Any], device_index: int) -> tuple:
    """The key a live tensor matching descriptor `d` produces on device `device_index`."""
    shape = tuple(d["shape"])
    return (getattr(torch, d["dtype"]), shape, key_strides(shape, tuple(d["stride"])), int(d.get("align", 16)),
            -1 if d.get("device") == "cpu" else device_index, bool(d.get("neg")), bool(d.get("conj")))


def signature_key(layout: OpLayout, signature: dict[str, Any], device_index: int = 0) -> tuple:
    """The key of a captured signature (engine.capture.signature form) for calls on `device_index`.

    Raises ValueError when the signature does not fit the op's schema.
    """
    from engine.capture.signature import decode_value

    args = signature["args"]
    if signature.get("op") != layout.op_name:
        raise ValueError(f"signature is for {signature.get('op')}, not {layout.op_name}")
    if [a["name"] for a in args] != list(layout.names):
        raise ValueError(f"{layout.op_name}: signature arguments {[a['name'] for a in args]} do not match "
                         f"the schema's {list(layout.names)} in this torch")
    key: list[Any] = []
    for i, (kind, a) in enumerate(zip(layout.kinds, args)):
        if kind == "tensor":
            if a.get("kind") != "tensor":
                key.append(("scalar", value_key(decode_value(a.get("value")), device_index)))
            else:
                key.append(None if a.get("absent") else descriptor_key(a, device_index))
        elif kind == "tensor_list":
            key.append(None if a.get("kind") != "tensor_list" else
                       tuple(None if x is None else descriptor_key(x, device_index) for x in a["items"]))
        else:
            v = decode_value(a.get("value"))
            key.append(plain_key(v) if layout.float_values and layout.float_values[i] else
                       v if layout.plain_values and layout.plain_values[i] else value_key(v, device_index))
    if layout.writes:
        key.append(tuple(tuple(g) for g in signature.get("aliases", [])))
    return tuple(key)


def proven_formats(layout: OpLayout, signature: dict[str, Any]) -> tuple[tuple[int, bool], ...]:
    """(argument slot, `channels_last_by_strides`) of each tensor argument of the proven signature whose shape is
    `layout_sensitive`. Its key cannot tell these apart (a size-1 dim's stride is left out of it), but eager can
    lay its outputs out otherwise for the other: outside compiled code, a call that differs here is a miss
    (engine.cast.runtime; the C++ router compares the same)."""
    from engine.ops import channels_last_by_strides, layout_sensitive

    out = []
    for i, (kind, a) in enumerate(zip(layout.kinds, signature["args"])):
        if kind == "tensor" and a.get("kind") == "tensor" and not a.get("absent") \
                and layout_sensitive(a["shape"]):
            out.append((i, channels_last_by_strides(a["shape"], a["stride"])))
    return tuple(out)


def formats_differ(formats: tuple[tuple[int, bool], ...], bound: Sequence[Any]) -> bool:
    """Whether a call's tensors differ from the proof's in `channels_last_by_strides` (`proven_formats`)."""
    from engine.ops import channels_last_by_strides

    for i, cl in formats:
        t = bound[i] if i < len(bound) else None
        if isinstance(t, torch.Tensor) and channels_last_by_strides(t.shape, t.stride()) != cl:
            return True
    return False


def first_shape(signature: dict[str, Any]) -> tuple | None:
    """Shape of argument 0 when it is a present tensor: the pre-filter a miss usually stops at."""
    a = signature["args"][0] if signature["args"] else None
    if a and a.get("kind") == "tensor" and not a.get("absent"):
        return tuple(a["shape"])
    return None
