"""The exact runtime signature of an ATen call: what an operator card is keyed on."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

MAX_ALIGN = 16  # bytes; the widest vector load a kernel uses, so wider alignment changes nothing

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_name(dtype: torch.dtype) -> str:
    """'torch.float16' -> 'float16'."""
    return str(dtype).removeprefix("torch.")


def byte_alignment(t: torch.Tensor) -> int:
    """Largest power of two (≤ 16) dividing the tensor's data address."""
    ptr = t.data_ptr()
    if ptr == 0:
        return MAX_ALIGN
    return min(MAX_ALIGN, ptr & -ptr)


def storage_extent(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [lo, hi) of the tensor's storage that its elements touch (empty when numel is 0)."""
    isz = t.element_size()
    lo = t.storage_offset() * isz
    if t.numel() == 0:
        return lo, lo
    last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return lo, (last + 1) * isz


def describe_tensor(t: torch.Tensor) -> dict[str, Any]:
    """Everything about a tensor argument that changes which kernel is valid for it."""
    if t.is_nested:  # rows of several lengths: no one shape, strides or data address; never cards (filters)
        return {"kind": "tensor", "dtype": dtype_name(t.dtype), "dim": t.dim(), "layout": "nested",
                "device": t.device.type}
    if t.layout != torch.strided:  # sparse: no strides or data address; such calls are never cards (filters)
        return {"kind": "tensor", "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                "layout": str(t.layout).removeprefix("torch."), "device": t.device.type}
    return {
        "kind": "tensor",
        "dtype": dtype_name(t.dtype),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "align": byte_alignment(t),
        "device": t.device.type,
        "neg": bool(t.is_neg()),
        "conj": bool(t.is_conj()),
    }


def encode_value(v: Any) -> Any:
    """A non-tensor argument as JSON (exact: floats keep repr precision, inf/nan are tagged)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, (list, tuple)):
        return [encode_value(x) for x in v]
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": v.type}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, complex):
        return {"complex": [v.real, v.imag]}
    if isinstance(v, torch.ScriptObject):   # a packed weight: its repr is a new wrapper's address at every call
        return {"script_object": v._type().qualified_name()}
    return {"repr": repr(v)}


def decode_value(v: Any) -> Any:
    """Inverse of `encode_value` for the kinds ATen schemas take."""
    if isinstance(v, list):
        return [decode_value(x) for x in v]
    if isinstance(v, dict):
        if "float" in v:
            return float(v["float"])
        if "dtype" in v:
            return getattr(torch, v["dtype"])
        if "device" in v:
            return torch.device(v["device"])
        if "memory_format" in v:
            return getattr(torch, v["memory_format"])
        if "layout" in v:
            return getattr(torch, v["layout"])
        if "complex" in v:
            return complex(*v["complex"])
        raise ValueError(f"cannot decode argument value {v!r}")
    return v


def describe_arg(v: Any) -> dict[str, Any]:
    """One schema argument: a tensor, a list of (optional) tensors, or a plain value."""
    if isinstance(v, torch.Tensor):
        return describe_tensor(v)
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return {"kind": "tensor_list",
                "items": [describe_tensor(x) if isinstance(x, torch.Tensor) else None for x in v]}
    return {"kind": "value", "value": encode_value(v)}


def bind_arguments(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """Positional and keyword arguments in schema order, defaults filled in, as (name, value)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append((a.name, args[i]))
        elif a.name in kwargs:
            out.append((a.name, kwargs[a.name]))
        elif a.has_default_value():
            out.append((a.name, a.default_value))
        else:
            out.append((a.name, None))
    return out


def iter_tensors(bound: list[tuple[str, Any]]):
    """Yield (path, tensor) for every tensor among the bound arguments, lists flattened."""
    for name, v in bound:
        if isinstance(v, torch.Tensor):
            yield name, v
        elif isinstance(v, (list, tuple)):
            for j, x in enumerate(v):
                if isinstance(x, torch.Tensor):
                    yield f"{name}[{j}]", x


def aliasing_groups(bound: list[tuple[str, Any]]) -> list[list[str]]:
    """Groups (≥ 2) of argument paths whose tensors share one storage."""
    by_storage: dict[tuple, list[str]] = {}
    for path, t in iter_tensors(bound):
        if t.numel() == 0 or t.layout != torch.strided:
            continue
        key = (t.device.type, t.device.index, t.untyped_storage().data_ptr())
        by_storage.setdefault(key, []).append(path)
    return [paths for paths in by_storage.values() if len(paths) > 1]


def signature_of(func: torch._ops.OpOverload, bound: list[tuple[str, Any]]) -> dict[str, Any]:
    """The canonical signature: op, each argument described, aliasing between arguments."""
    args = []
    for a, (name, v) in zip(func._schema.arguments, bound):
        if v is None and "Tensor" in str(a.type):
            args.append({"name": name, "kind": "tensor", "absent": True})  # e.g. a missing bias
        else:
            args.append({"name": name, **describe_arg(v)})
    return {
        "op": func.name(),
        "args": args,
        "aliases": aliasing_groups(bound),
    }


def card_id(signature: dict[str, Any]) -> str:
    """Stable id: a hash of the canonical signature (no addresses, no run-dependent data)."""
    blob = json.dumps(signature, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _tensor_text(d: dict[str, Any]) -> str:
    text = f"{_short(d['dtype'])}[{','.join(map(str, d['shape']))}]"
    if d["stride"] != contiguous_strides(d["shape"]):
        text += f"(s={','.join(map(str, d['stride']))})"
    if d["align"] < MAX_ALIGN:
        text += f"@a{d['align']}"
    if d["neg"]:
        text += "!neg"
    if d["conj"]:
        text += "!conj"
    return text


def _short(dtype: str) -> str:
    return _DTYPE_SHORT.get(getattr(torch, dtype, None), dtype)


def dense_order(shape: Sequence[int], stride: Sequence[int]) -> list[int] | None:
    """Dims of size > 1 from outermost to innermost when the tensor is dense and non-overlapping (its
    elements fill exactly numel consecutive slots in some dim order), else None."""
    dims = sorted((d for d, n in enumerate(shape) if n > 1), key=lambda d: -int(stride[d]))
    expect = 1
    for d in reversed(dims):
        if int(stride[d]) != expect:
            return None
        expect *= int(shape[d])
    return dims


def contiguous_strides(shape: list[int]) -> list[int]:
    """Row-major strides of `shape` (how a freshly allocated tensor is laid out)."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return strides[::-1]


def _value_text(v: Any) -> str:
    if isinstance(v, dict) and "complex" in v:
        return repr(complex(*v["complex"]))   # 1j, (2-3j): not a list of two floats
    if isinstance(v, dict):
        return next(iter(v.values())) if len(v) == 1 else json.dumps(v)
    if isinstance(v, list):
        return "[" + ",".join(_value_text(x) for x in v) + "]"
    return repr(v) if isinstance(v, str) else str(v)


def _runs(items: list[str]) -> list[str]:
    """Three or more equal items in a row as one `item×n` (a scan's `stack` of 2048 steps is one entry, not
    a line of 30 kB)."""
    out: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j < len(items) and items[j] == items[i]:
            j += 1
        out += [f"{items[i]}×{j - i}"] if j - i >= 3 else items[i:j]
        i = j
    return out


def signature_text(signature: dict[str, Any]) -> str:
    """Compact human form: tensors as dtype[shape](strides when not contiguous), values as name=value."""
    parts = []
    for a in signature["args"]:
        if a["kind"] == "tensor":
            parts.append("None" if a.get("absent") else _tensor_text(a))
        elif a["kind"] == "tensor_list":
            parts.append("[" + ",".join(_runs([_tensor_text(x) if x else "None" for x in a["items"]])) + "]")
        elif a["value"] is None:
            continue
        else:
            parts.append(f"{a['name']}={_value_text(a['value'])}")
    for group in signature["aliases"]:
        parts.append("alias(" + "=".join(group) + ")")
    return ", ".join(parts)
