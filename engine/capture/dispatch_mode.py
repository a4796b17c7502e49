"""The base of the capture's dispatch modes: a TorchDispatchMode that loads no Dynamo of its own.

Recent PyTorch wraps every TorchDispatchMode subclass's `__torch_dispatch__` in `torch._disable_dynamo`, so
that a torch.compile running while the mode is active never traces the mode's own frame. That wrapper imports
`torch._dynamo` on the mode's first call (and keeps Dynamo's disabled function in the method's
`__dynamo_disable`): 2.5-3 s of CPU in every capture and run process, more than a third of a `capture --small`
on a 2-core machine, for a guard with nothing to guard until Dynamo is loaded, since only Dynamo installs the
frame hook it disables.

`DynamoLazyMode` keeps PyTorch's wrapper and gives it, in that cache, a stand-in that calls the method as is.
When `torch._dynamo` finishes importing (a torch.compile, a FakeTensorMode, a torch.cond: whatever loads it), an
import hook removes the stand-ins, so from then on the wrapper does exactly what it always did, also while
Dynamo traces a torch.cond's branches with the mode active. Where Dynamo is already loaded when a mode class is
made, nothing is changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

_CACHE = "__dynamo_disable"  # torch._compile._disable_dynamo's cache attribute on the wrapped function
_pending: list[Callable[..., Any]] = []  # methods holding a stand-in, until Dynamo is loaded
_lock = threading.Lock()


def _dynamo_loaded() -> bool:
    """Whether torch._dynamo is imported and done: while its import runs (it is in sys.modules already, with
    `__spec__._initializing` set) nothing can be compiling, and its `disable` may not exist yet."""
    module = sys.modules.get("torch._dynamo")
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _drop_stand_ins() -> None:
    """Dynamo is loaded: PyTorch's wrapper makes and keeps the real disabled function on the next call."""
    with _lock:
        for fn in _pending:
            if getattr(fn, _CACHE, None) is getattr(fn, "_kforge_stand_in", None):
                delattr(fn, _CACHE)
        _pending.clear()


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the import of `torch._dynamo` it hands over the spec the other finders give,
    with its loader's exec_module followed by `_drop_stand_ins`, and leaves sys.meta_path."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch._dynamo":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_drop(module: Any) -> None:
            exec_module(module)
            _drop_stand_ins()

        loader.exec_module = exec_then_drop
        return spec


_hook = _AfterDynamoImport()
if not _dynamo_loaded():
    sys.meta_path.insert(0, _hook)


def _stand_in(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Calls `fn` as is; past Dynamo's import (a call racing the hook), drops itself and runs through Dynamo's
    disabled function as PyTorch's wrapper would."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if not _dynamo_loaded():
            return fn(*args, **kwargs)
        _drop_stand_ins()
        import torch

        return torch._disable_dynamo(fn, recursive=True)(*args, **kwargs)

    return call


class DynamoLazyMode(TorchDispatchMode):
    """A TorchDispatchMode whose subclasses' `__torch_dispatch__` import no Dynamo (see the module's docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        wrapper = cls.__dict__.get("__torch_dispatch__")
        fn = getattr(wrapper, "__wrapped__", None)  # PyTorch's wrapper of the method (functools.wraps)
        if fn is None or _dynamo_loaded() or getattr(fn, _CACHE, None) is not None:
            return
        with _lock:
            stand_in = _stand_in(fn)
            fn._kforge_stand_in = stand_in  # type: ignore[attr-defined]
            setattr(fn, _CACHE, stand_in)
            _pending.append(fn)
