"""An op's outputs as PyTorch's meta kernels give them for a signature, from fake tensors (nothing runs).

Fake tensors carry meta storage and the signature's device (`cuda` where it names none), so the meta
kernels follow that device's rules without its hardware: a CPU capture's cards as the GPU returns them
(engine.run.as_gpu), and a channels-last twin's outputs as compiled code asserts them (engine.capture.twins).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from engine.capture.signature import decode_value
from engine.ops import call_op, resolve_op, tensors_of


def _fake(desc: dict[str, Any], mode: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor

    meta = torch.empty_strided(desc["shape"], desc["stride"], dtype=getattr(torch, desc["dtype"]), device="meta")
    return FakeTensor(mode, meta, torch.device(desc.get("device") or "cuda"))


def _value(arg: dict[str, Any], mode: Any) -> Any:
    kind = arg.get("kind")
    if kind == "tensor":
        return None if arg.get("absent") else _fake(arg, mode)
    if kind == "tensor_list":
        return [None if d is None else _fake(d, mode) for d in arg["items"]]
    return decode_value(arg.get("value"))


def _describe(t: Any, like: dict[str, Any] | None) -> dict[str, Any]:
    # The alignment is the captured one where there is one (an allocation's is the widest, 16).
    return {"kind": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "stride": list(t.stride()), "align": (like or {}).get("align", 16), "device": t.device.type,
            "neg": False, "conj": False}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """FakeTensorMode logs a traceback (logging.exception) for every meta kernel that raises, before raising:
    here a raise is an answer (no outputs to tell), and a dry run printed 21 lines per such card."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def fake_outputs(op_name: str, signature: dict[str, Any],
                 captured: list[dict[str, Any]] | None = None) -> list[dict[str, Any]] | None:
    """The op's tensor outputs for `signature` as its meta kernel gives them on the signature's device; None
    when the op has no meta kernel or the signature cannot be rebuilt (the caller keeps the captured outputs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        op = resolve_op(op_name)
        mode = FakeTensorMode()
        bound = [(a["name"], _value(a, mode)) for a in signature["args"]]
        with _quiet(), mode:
            out = call_op(op, bound)
    except Exception:  # noqa: BLE001 - no meta kernel, an unknown op, an odd argument: keep the captured outputs
        return None
    captured = captured or []
    return [_describe(t, captured[i] if i < len(captured) else None) for i, t in enumerate(tensors_of(out))]


def fake_chain_outputs(signature: dict[str, Any],
                       captured: list[dict[str, Any]] | None = None) -> list[dict[str, Any]] | None:
    """A chain card's outputs for `signature` as its members' meta kernels give them on the signature's
    device (engine.capture.chains.run_chain on fake tensors); None where a member has no meta kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from engine.capture.chains import run_chain

    try:
        mode = FakeTensorMode()
        ins = [_value(a, mode) for a in signature["args"]]
        with _quiet(), mode:
            outs = run_chain({k: v for k, v in signature.items() if k != "twin_of"}, ins)
    except Exception:  # noqa: BLE001 - a member without a meta kernel: no outputs to tell
        return None
    captured = captured or []
    return [_describe(t, captured[i] if i < len(captured) else None) for i, t in enumerate(outs)]
