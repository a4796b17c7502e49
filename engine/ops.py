"""ATen operator lookup by the names cards carry, and what their schemas say about aliasing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def resolve_op(name: str) -> torch._ops.OpOverload:
    """'aten::add_.Tensor' -> torch.ops.aten.add_.Tensor ('aten::relu_' -> .default)."""
    ns, rest = name.split("::", 1)
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def return_aliases(op: torch._ops.OpOverload) -> list[str | None]:
    """For each return of the op: the name of the argument it aliases (in-place/out=), else None."""
    by_set: dict[frozenset, str] = {}
    for a in op._schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            by_set[frozenset(a.alias_info.before_set)] = a.name
    out = []
    for r in op._schema.returns:
        if r.alias_info is not None and r.alias_info.is_write:
            out.append(by_set.get(frozenset(r.alias_info.before_set)))
        else:
            out.append(None)
    return out


def write_only_args(op: torch._ops.OpOverload) -> list[str]:
    """`out=` arguments: the candidate must write all of them; they are pre-filled like outputs."""
    return [a.name for a in op._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def call_op(op: torch._ops.OpOverload, bound: Sequence[tuple[str, Any]]) -> Any:
    """Call the public op with arguments in schema order (keyword-only ones by name)."""
    kwarg_only = {a.name for a in op._schema.arguments if a.kwarg_only}
    args = [v for n, v in bound if n not in kwarg_only]
    kwargs = {n: v for n, v in bound if n in kwarg_only}
    return op(*args, **kwargs)


def eager_call(op: torch._ops.OpOverload, signature: dict[str, Any] | None = None) -> Any:
    """Eager for a card: `bound -> op(...)`. A channels-last twin's (`signature["twin_of"]`,
    engine.capture.twins) copies its first tensor to contiguous first: what torch.compile runs without the
    cast (Inductor copies the held input to the strides the graph was traced with, then calls the op), and
    what CUDA native_group_norm needs (it rejects channels-last input). The copy is part of eager's time."""
    if not (signature or {}).get("twin_of"):
        return lambda bound: call_op(op, bound)

    def run(bound: Sequence[tuple[str, Any]]) -> Any:
        (n0, v0), *rest = bound
        return call_op(op, [(n0, v0.contiguous() if isinstance(v0, torch.Tensor) else v0), *rest])
    return run
