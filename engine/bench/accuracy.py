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


class _Widen(TorchFunctionMode):
    """Every tensor argument of a torch function in one of `narrow`'s dtypes becomes `wide` (the forward's own
    inputs and parameters, and what it makes with a literal dtype), except the tensor an in-place method, an item
    assignment or an `out=` writes: widened, the write went to a copy and was lost (red team 2026-12-07: positions
    built into a float32 buffer in the forward read 0.76 from the true float64 run). A call that refuses the wide
    dtype (a kernel for 16-bit only) runs on its arguments narrowed to `fallback`, its results widened: the
    reference then holds that op's rounding, instead of being no reference at all."""

    def __init__(self, narrow: tuple[torch.dtype, ...], wide: torch.dtype, fallback: torch.dtype,
                 complex_wide: torch.dtype | None = None):
        super().__init__()
        self.narrow, self.wide, self.fallback, self.complex_wide = narrow, wide, fallback, complex_wide

    def _to(self, x: Any, dtype: torch.dtype, complex_dtype: torch.dtype | None, only: tuple) -> Any:
        if isinstance(x, torch.Tensor):
            if x.dtype in only:
                return x.to(dtype)
            if complex_dtype is not None and x.dtype == torch.complex64:
                return x.to(complex_dtype)
        return x

    def _map(self, args: tuple, kwargs: dict, f: Callable[[Any], Any], written: set[int]) -> tuple[tuple, dict]:
        args = tuple(a if i in written else f(a) if not isinstance(a, (list, tuple)) else type(a)(f(b) for b in a)
                     for i, a in enumerate(args))
        kwargs = {k: v if k == "out" else f(v) for k, v in kwargs.items()}
        return args, kwargs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        writes = (name.endswith("_") and not name.endswith("__")) or name in _WRITES
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if writes and target is not None and (target.is_floating_point() or target.is_complex()):
            # the write lands in the tensor itself, in its own dtype; what is written comes in that dtype too
            # (index_put_, index_copy_, scatter_ refuse a source of another)
            same = lambda x: x.to(target.dtype) if isinstance(x, torch.Tensor) and x is not target and (  # noqa: E731
                x.is_floating_point() or x.is_complex()) and x.dtype != target.dtype else x
            return func(*self._map(args, kwargs, same, {0})[0], **self._map(args, kwargs, same, {0})[1])
        # a view keeps its base: widened, it would be a view of a copy, and a write through it lost
        written = {0} if writes or name in _VIEWS else set()
        up = lambda x: self._to(x, self.wide, self.complex_wide, self.narrow)  # noqa: E731
        wide_args, wide_kwargs = self._map(args, kwargs, up, written)
        try:
            return func(*wide_args, **wide_kwargs)
        except torch.OutOfMemoryError:
            raise   # (a RuntimeError too: run narrow, it would leave a reference partly narrow, unsaid)
        except (RuntimeError, TypeError, NotImplementedError):
            if written or "out" in kwargs:
                raise
        from torch.utils._pytree import tree_map

        down = lambda x: self._to(x, self.fallback, None, (self.wide,))  # noqa: E731
        narrow_args, narrow_kwargs = self._map(args, kwargs, down, set())
        out = func(*narrow_args, **narrow_kwargs)

        return tree_map(lambda x: x.to(self.wide) if isinstance(x, torch.Tensor) and x.dtype == self.fallback else x, out)


# Calls that write their first argument besides the in-place methods (`add_`): item assignment and the augmented
# operators (`x += y` on a view of a buffer the forward made)
_WRITES = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                     "__imatmul__"})
# Calls whose answer is a view of their first argument
_VIEWS = frozenset({"__getitem__", "narrow", "view", "view_as", "select", "split", "chunk", "unbind", "transpose",
                    "t", "permute", "unsqueeze", "squeeze", "expand", "expand_as", "as_strided", "diagonal",
                    "unflatten", "movedim", "moveaxis", "swapaxes", "swapdims", "split_with_sizes", "tensor_split",
                    "hsplit", "vsplit", "dsplit", "unfold", "view_as_real", "view_as_complex", "flatten", "reshape",
                    "reshape_as", "detach", "alias"})


def _RaiseHalf(low: torch.dtype = torch.bfloat16) -> _Widen:
    """bf16/fp16 tensor arguments become float32 (a call for 16-bit only falls back to `low`)."""
    return _Widen(_LOW, torch.float32, low)


def _RaiseSingle() -> _Widen:
    """float32 (complex64) tensor arguments become float64 (complex128); a call for float32 only falls back to it."""
    return _Widen((torch.float32,), torch.float64, torch.float32, torch.complex128)


def float32_output(module: torch.nn.Module, forward: Callable[[], Any], output: Callable[[Any], torch.Tensor]
                   ) -> torch.Tensor:
    """`output(forward())` with every bf16/fp16 parameter and buffer of `module` (and every such tensor the
    forward passes to torch) in float32. The module's tensors are restored exactly afterwards, also when the
    forward raises (the error propagates: a model whose code insists on its dtype has no float32 reference)."""
    saved = [(t, t.data) for t in _unique(list(module.parameters()) + list(module.buffers())) if t.dtype in _LOW]
    low = max(_LOW, key=lambda d: sum(t.numel() for t, _ in saved if t.dtype == d))   # the model's 16-bit dtype
    try:
        for t, data in saved:
            t.data = data.float()
        with torch.no_grad(), _RaiseHalf(low):
            return output(forward()).detach().float().clone()
    finally:
        for t, data in saved:
            t.data = data


def wider_output(module: torch.nn.Module, forward: Callable[[], Any], output: Callable[[Any], torch.Tensor]
                 ) -> tuple[torch.Tensor, str] | None:
    """The model's output run once in the next wider float format, as (float64 tensor, its name): a model holding
    16-bit tensors in float32, else one holding float32 tensors in float64 (every such parameter, buffer and
    torch-function argument upcast, restored exactly afterwards: `_Widen`). None where the model holds neither,
    the wider forward raises (code that insists on its dtype), or its output is not floating. (An output the model
    rounds to float32 at its end, as logits are, is still the wider run's.)"""
    got = _wide_run(module, forward, lambda out: _as64(output(out)))
    return got if got is not None and got[0] is not None else None


def wider_outputs(module: torch.nn.Module, forward: Callable[[], Any],
                  outputs: Callable[[Any], list[torch.Tensor]]) -> tuple[list[Any], str] | None:
    """As `wider_output`, for every tensor `outputs` finds in the output (float64 each; None for one that is not
    floating): the model's other outputs (a KV cache, a second head) judged like its first."""
    return _wide_run(module, forward, lambda out: [_as64(t) for t in outputs(out)])


def _as64(t: Any) -> Any:
    if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
        return None
    return t.detach().to(torch.complex128 if t.is_complex() else torch.float64).clone()


def _wide_run(module: torch.nn.Module, forward: Callable[[], Any], take: Callable[[Any], Any]
              ) -> tuple[Any, str] | None:
    """(`take(forward())` run in the next wider format, that format's name), or None (nothing to widen, or it
    raised); the module's tensors restored exactly."""
    held = _unique(list(module.parameters()) + list(module.buffers()))
    saved = [(t, t.data) for t in held if t.dtype in _LOW]
    if saved:
        low = max(_LOW, key=lambda d: sum(t.numel() for t, _ in saved if t.dtype == d))   # the model's 16-bit dtype
        mode, wide, name = _RaiseHalf(low), torch.float32, "float32"
    else:
        saved = [(t, t.data) for t in held if t.dtype == torch.float32]
        mode, wide, name = _RaiseSingle(), torch.float64, "float64"
    if not saved:
        return None
    # TF32 (cuDNN's default for convolutions) keeps fp16's 10 mantissa bits: a "float32" run of an fp16 conv model
    # was no wider than eager there (review 2026-12-07)
    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    for swap in (True, False):
        try:
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            try:
                if swap:
                    for t, data in saved:
                        t.data = data.to(wide)
                with torch.no_grad(), mode:
                    return take(forward()), name
            finally:
                for t, data in saved:
                    t.data = data
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
        except torch.OutOfMemoryError:
            # every parameter widened at once did not fit: the mode alone widens each where a call takes it
            # (code that reads a parameter's dtype then rounds as the narrow model does, there only)
            import gc

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        except Exception:  # noqa: BLE001 - any failure only means no wider reference
            return None
    return None


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖₂ / ‖ref‖₂ in float64."""
    ref = ref.detach().double()
    return float((x.detach().double() - ref).norm() / ref.norm())


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    return [t for t in tensors if not (id(t) in seen or seen.add(id(t)))]
