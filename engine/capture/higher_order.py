"""Higher-order operators (`torch.cond`, `torch.while_loop`, ...) under the capture's dispatch modes.

A TorchDispatchMode sees no ATen call inside a higher-order operator: the operator asks each mode for a
rule of its own, and PyTorch raises ("There was no rule registered for HigherOrderOperator cond") for a
mode without one. The capture's modes take them instead (`supports_higher_order_operators`) and run the
operator as eager does, with the mode entered again, so the branch or loop body's ATen calls reach every
mode on the stack as calls of the forward. The branch taken is the one these inputs take: a forward that
takes another records other cards, as any Python `if` would.

Inside such an operator the branch is a traced graph that calls ATen overloads by name, and a composite
one (`aten::linear`) then reaches the modes whole, where eager's dispatcher decomposes it (`aten::t` +
`aten::addmm`): no kernel could serve a card of it. There the mode runs the decomposition itself, so the
cards are eager's calls.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils._python_dispatch import TorchDispatchMode

_depth = [0]  # higher-order operators running now, nested


def is_higher_order(func: Any) -> bool:
    """Whether the mode should hand `func` to `run_higher_order`: a higher-order operator, or, inside one,
    an overload that eager's dispatcher would have decomposed before any mode saw it."""
    if isinstance(func, torch._ops.HigherOrderOperator):
        return True
    return (_depth[0] > 0 and isinstance(func, torch._ops.OpOverload)
            and func.has_kernel_for_dispatch_key(DispatchKey.CompositeImplicitAutograd))


def run_higher_order(mode: TorchDispatchMode, func: Any, args: tuple, kwargs: dict | None) -> Any:
    """Run `func` (handed to `mode.__torch_dispatch__`, `is_higher_order`) as eager runs it, with `mode`
    entered again so the calls inside it are dispatched through the capture's modes."""
    kwargs = kwargs or {}
    if isinstance(func, torch._ops.OpOverload):
        with mode:
            return func.decompose(*args, **kwargs)
    _depth[0] += 1
    try:
        with mode:
            return _run(func, args, kwargs)
    finally:
        _depth[0] -= 1


def _run(func: Any, args: tuple, kwargs: dict) -> Any:
    if func is torch.ops.higher_order.cond:
        # cond's eager kernel refuses to run under a mode; its semantics are these two lines
        pred, true_fn, false_fn, operands = args
        return true_fn(*operands) if pred else false_fn(*operands)
    if func is torch.ops.higher_order.scan:
        # so does scan's; it is generic_scan
        from torch._higher_order_ops.scan import generic_scan

        combine_fn, init, xs, additional_inputs = args[:4]
        return generic_scan(combine_fn, init, xs, additional_inputs=additional_inputs)
    kernel = func.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
    unsupported = NotImplementedError(
        f"Kernel Forge's capture cannot run torch.ops.higher_order.{func.name()} (torch.cond, while_loop and "
        "scan it can): call its function in plain Python in the forward")
    if kernel is None:
        raise unsupported
    try:
        return kernel(*args, **kwargs)
    except AssertionError as e:  # an eager kernel that refuses to run under a dispatch mode
        if "Mode should never be enabled" in str(e):
            raise unsupported from e
        raise
