"""What binds a module's forward to a chain card: the capture records it, the cast's loader reads it.

It lives in the capture layer because the capture computes it (engine.capture.chain_cards, in the
chain-sampling forward); engine.cast.modules re-exports it for the loader.
"""

from __future__ import annotations

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


def module_binding(module: torch.nn.Module, args: tuple, inputs: list[torch.Tensor]) -> dict[str, Any]:
    """The `args`/`params` of a module entry for a proven call: each chain input (the tensors `in0..inN`
    were) found by identity among the forward's positional `args`, then the module's parameters and buffers."""
    from engine.capture.signature import encode_value

    def index(t: Any) -> int | None:
        return next((i for i, x in enumerate(inputs) if x is t), None)

    out_args = []
    for a in args:
        i = index(a) if isinstance(a, torch.Tensor) else None
        if isinstance(a, torch.Tensor) and i is None:
            raise ModuleCardError("a tensor argument of the forward is not a chain input")
        out_args.append({"input": i} if i is not None else {"value": encode_value(a)})
    params = []
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        i = index(t)
        if i is not None:
            params.append({"name": name, "input": i})
    return {"args": out_args, "params": params}
