"""Whether two model outputs agree: relative L2 distance, and whether a model's own forwards repeat.

Light to import (torch is imported where a function needs it): the capture notes an unrepeatable model or a
degenerate output, the export's whole-model check refuses the one and discounts the other (engine/export/e2e.py),
both by these.
"""

from __future__ import annotations

import math
from typing import Any


def rel_l2_err(out: Any, ref: Any) -> float:
    """‖out − ref‖ / ‖ref‖ (0 when both are zero; inf when only the reference is, or when either holds a
    NaN or an Inf: a non-finite output never reads as agreement, and NaN would compare false everywhere)."""
    import torch

    if not (bool(torch.isfinite(out).all()) and bool(torch.isfinite(ref).all())):
        return math.inf
    num, den = _norms(out, ref)
    return num / den if den else (0.0 if num == 0 else math.inf)


def compared(t: Any) -> Any:
    """A model's output tensor as the whole-model checks compare it: float64, a complex one as its real and
    imaginary parts (`.double()` of a complex tensor keeps the real part only, with a warning: a cast that broke
    only the imaginary part of an FFT model's output agreed)."""
    import torch

    if t.is_complex():
        return torch.view_as_real(t.resolve_conj()).double()
    return t.double()


_CHUNK = 1 << 24   # elements upcast at a time: 128 MiB of float64 each side


def _norms(out: Any, ref: Any) -> tuple[float, float]:
    """‖out − ref‖ and ‖ref‖, summed in float64 a chunk at a time: a 16-bit norm (or difference) of a large output
    overflows (a float16 norm of 100,000 elements of 300 is inf, and with ‖ref‖ = inf any output read as
    agreeing), and a whole float64 copy of an LLM's logits would take gigabytes."""
    import torch

    if out.is_complex() or ref.is_complex():
        out, ref = torch.view_as_real(out.resolve_conj()), torch.view_as_real(ref.resolve_conj())
    if out.shape != ref.shape:
        out, ref = torch.broadcast_tensors(out, ref)
    o, r = out.reshape(-1), ref.reshape(-1)
    num = torch.zeros((), dtype=torch.float64, device=r.device)
    den = torch.zeros((), dtype=torch.float64, device=r.device)
    for i in range(0, r.numel(), _CHUNK):
        rc = r[i:i + _CHUNK].double()
        num += (o[i:i + _CHUNK].double().to(rc.device) - rc).square().sum()
        den += rc.square().sum()
    return math.sqrt(float(num)), math.sqrt(float(den))


# Two eager forwards on the same inputs may differ this much (relative L2) and still be the same function: GPU
# kernels that add in varying order (atomics) differ around 1e-7.
REPEAT_REL = 1e-3


def unrepeatable(first: Any, again: Any) -> str | None:
    """Why a model's output cannot vouch for a cast because eager's own forwards disagree (a phrase that follows
    "is", as `degenerate`'s), else None: a model that changes its inputs or buffers in its forward (a counter,
    an in-place op on its input) or draws random numbers gives another output each time, and comparing the
    cast's forward with an earlier eager one measures that, not the cast."""
    drift = rel_l2_err(again, first)
    if drift <= REPEAT_REL:
        return None
    return (f"not repeatable: two of its forwards on the same inputs differ by {drift:.1e} (relative L2), as a "
            "model that changes its inputs or buffers, or draws random numbers, does")


def degenerate(t: Any) -> str | None:
    """Why a model's output cannot vouch for anything, in a phrase that follows "is": NaN/Inf in it, all
    zeros, or every element equal (a model whose random weights saturate; a cast that zeroes it); None
    when it is an output worth comparing. One element is not called constant (a scalar loss is fine)."""
    import torch

    n = t.numel()
    if n == 0:
        return "empty (no elements)"
    bad = n - int(torch.isfinite(t).sum())
    if bad:
        return f"non-finite (NaN/Inf) in {bad} of {n} elements"
    if not bool(t.any()):
        return "all zeros"
    first = t.reshape(-1)[0]
    if n > 1 and bool((t == first).all()):
        v = first.item()
        return f"constant (every element {v:g})" if isinstance(v, float) else f"constant (every element {v})"
    return None
