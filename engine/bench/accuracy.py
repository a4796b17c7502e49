"""How far a low-precision forward is from the same model run in float32.

A cast's output differs from eager's by rounding (another reduction order, one rounding instead of several).
Through a deep model with random weights such differences can grow until the two bf16 outputs hardly agree,
while both are as close to the exact result as bf16 allows. Comparing the cast with eager alone cannot tell
these apart; comparing each with the model run in float32 can: a cast as accurate as eager is as far from the
float32 output as eager is.

    ref = float32_output(module, forward)         # the model in float32, the module restored afterwards
    rel_l2(eager_out, ref), rel_l2(cast_out, ref)
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


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖₂ / ‖ref‖₂ in float64."""
    ref = ref.detach().double()
    return float((x.detach().double() - ref).norm() / ref.norm())


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    return [t for t in tensors if not (id(t) in seen or seen.add(id(t)))]
