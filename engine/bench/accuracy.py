"""How far a low-precision forward is from the same model run in float32.

A cast's output differs from eager's by rounding (another reduction order, one rounding instead of several).
Through a deep model with random weights such differences can grow until the two bf16 outputs hardly agree,
while both are as close to the exact result as bf16 allows. Comparing the cast with eager alone cannot tell
these apart; comparing each with the model run in float32 can: a cast as accurate as eager is as far from the
float32 output as eager is.

    ref = float32_output(module, forward)         # the model in float32, the module restored afterwards
    rel_l2(eager_out, ref), rel_l2(cast_out, ref)

A float32 model has its wider twin in float64 (`wider_output`): the export's whole-model check judges every
cast's accuracy against one or the other (engine.export.e2e.accuracy_rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_LOW = (torch.bfloat16, torch.float16)


class _RaiseHalf(TorchFunctionMode):
    """Every bf16/fp16 tensor argument of a torch function becomes float32 (the forward's own inputs, which the
    closure holds in the model's dtype)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        def up(x):
            return x.float() if isinstance(x, torch.Tensor) and x.dtype in _LOW else x

        args = tuple(up(a) if not isinstance(a, (list, tuple)) else type(a)(up(b) for b in a) for a in args)
        kwargs = {k: up(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def float32_output(module: torch.nn.Module, forward: Callable[[], Any], output: Callable[[Any], torch.Tensor]
                   ) -> torch.Tensor:
    """`output(forward())` with every bf16/fp16 parameter and buffer of `module` (and every such tensor the
    forward passes to torch) in float32. The module's tensors are restored exactly afterwards, also when the
    forward raises (the error propagates: a model whose code insists on its dtype has no float32 reference)."""
    saved = [(t, t.data) for t in _unique(list(module.parameters()) + list(module.buffers())) if t.dtype in _LOW]
    try:
        for t, data in saved:
            t.data = data.float()
        with torch.no_grad(), _RaiseHalf():
            return output(forward()).detach().float().clone()
    finally:
        for t, data in saved:
            t.data = data


class _RaiseSingle(TorchFunctionMode):
    """Every float32 (complex64) tensor argument of a torch function becomes float64 (complex128)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        def up(x):
            if isinstance(x, torch.Tensor):
                if x.dtype == torch.float32:
                    return x.double()
                if x.dtype == torch.complex64:
                    return x.to(torch.complex128)
            return x

        args = tuple(up(a) if not isinstance(a, (list, tuple)) else type(a)(up(b) for b in a) for a in args)
        kwargs = {k: up(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def wider_output(module: torch.nn.Module, forward: Callable[[], Any], output: Callable[[Any], torch.Tensor]
                 ) -> tuple[torch.Tensor, str] | None:
    """The model's output run once in the next wider float format, as (float64 tensor, its name): a model holding
    16-bit tensors in float32 (`float32_output`), else one holding float32 tensors in float64 (every float32
    parameter, buffer and torch-function argument upcast, restored exactly afterwards). None where the model
    holds neither, the wider forward raises (code that insists on its dtype), or its output is not floating."""
    held = _unique(list(module.parameters()) + list(module.buffers()))
    try:
        if any(t.dtype in _LOW for t in held):
            return float32_output(module, forward, output).double(), "float32"
        saved = [(t, t.data) for t in held if t.dtype == torch.float32]
        if not saved:
            return None
        try:
            for t, data in saved:
                t.data = data.double()
            with torch.no_grad(), _RaiseSingle():
                out = output(forward())
                if not isinstance(out, torch.Tensor) or not (out.is_floating_point() or out.is_complex()):
                    return None
                # (an output the model rounds to float32 at its end, as logits are, is still the wider run's)
                return out.detach().to(torch.complex128 if out.is_complex() else torch.float64).clone(), "float64"
        finally:
            for t, data in saved:
                t.data = data
    except Exception:  # noqa: BLE001 - any failure only means no wider reference
        return None


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖₂ / ‖ref‖₂ in float64."""
    ref = ref.detach().double()
    return float((x.detach().double() - ref).norm() / ref.norm())


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    return [t for t in tensors if not (id(t) in seen or seen.add(id(t)))]
