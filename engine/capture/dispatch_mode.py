"""The base of the capture's dispatch modes: a TorchDispatchMode that loads Dynamo only where it is loaded.

Recent PyTorch wraps every TorchDispatchMode subclass's `__torch_dispatch__` in `torch._disable_dynamo`, so
that a torch.compile running while the mode is active never traces the mode's own frame. That wrapper imports
`torch._dynamo` on the mode's first call: 2.5-3 s of CPU in every capture and run process (on the 2-core CI
machine, more than a third of a `capture --small`), for a guard with nothing to guard until Dynamo is loaded,
since only Dynamo installs the frame hook it disables. `DynamoLazyMode` turns PyTorch's wrapping off
(`_should_skip_dynamo`) and wraps the subclass's `__torch_dispatch__` itself: it runs the method as is until
Dynamo is loaded (a torch.compile, a FakeTensorMode), and through `torch._disable_dynamo` from then on.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def dynamo_skipped_once_loaded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as torch._disable_dynamo(fn, recursive=True) runs it once `torch._dynamo` is loaded, and as itself
    until then (no frame hook can be installed before: only Dynamo installs one)."""
    disabled: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None or not hasattr(dynamo, "disable"):  # not loaded, or still being imported
                return fn(*args, **kwargs)
            disabled = torch._disable_dynamo(fn, recursive=True)
        return disabled(*args, **kwargs)

    return inner


class DynamoLazyMode(TorchDispatchMode):
    """A TorchDispatchMode whose subclasses' `__torch_dispatch__` skip Dynamo as PyTorch's own wrapping does,
    without importing Dynamo before anything else has (see the module's docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # PyTorch's wrapping, off: __init_subclass__ below wraps lazily
        return False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("__torch_dispatch__")
        if raw is not None and not isinstance(raw, classmethod):
            cls.__torch_dispatch__ = dynamo_skipped_once_loaded(raw)  # type: ignore[method-assign]
