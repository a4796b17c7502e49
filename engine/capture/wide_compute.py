"""On a CPU without native bf16/fp16, compute a capture's matmuls, convolutions and attention in float32.

A CPU without AVX512-BF16/AMX runs a large bf16 matmul 2-60x and a half-precision convolution ~10x slower
than float32, so a `--small` capture of a half-precision model spends most of its time there. What a capture records of a
call (op, argument dtypes, shapes and strides; output dtypes, shapes and strides) does not depend on how
the result's values were computed, so `WideCompute`, entered below the capture's own modes, runs these
calls on float32 copies of their half-precision inputs and returns results in the call's own dtype and
layout. The capture sees the same call, made with the same arguments, returning tensors of the same
description; only the output values differ by rounding (float32 accumulation, as a GPU's tensor cores
do), and only CPU timings (which a dry run re-estimates for the GPU anyway) get shorter.

The output layout is taken only where two independent answers agree: the op's fake-tensor (meta)
kernel called with the real half-precision arguments, and the float32 call's actual outputs. Where they
differ, or the fake kernel cannot answer, the call runs as it is (slow, exact).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from engine.capture.dispatch_mode import DynamoLazyMode
from engine.capture.filters import own_dispatch
from engine.capture.higher_order import is_higher_order, run_higher_order

aten = torch.ops.aten

HALF = (torch.bfloat16, torch.float16)
# Functional ops whose CPU half-precision kernels are the slow ones; each returns fresh tensors only.
WIDENED = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten._grouped_mm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
})
WIDENED_NAMES = frozenset(f.name() for f in WIDENED)
# A product with fewer rows than this per weight matrix is left in half precision: converting the weight
# to float32 then costs more than the half kernel saves. Measured on a 2-core AVX2 CPU: bf16 mm at 64 rows
# runs as fast as float32 (Qwen3.5's 2 rows per expert in grouped_mm: 6x slower widened), at 128 rows
# 2x slower (Gemma's logits: 15 s vs 7.5 s); fp16/bf16 convolutions gain 10x at every size seen.
MIN_ROWS = 128


def widens(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a capture of a `dtype` model on `device` should compute under WideCompute: on a CPU
    whose oneDNN has no native instructions for that half-precision dtype (AVX512-BF16, AMX, AVX512-FP16)."""
    if device.type != "cpu" or dtype not in HALF:
        return False
    probe = "_is_mkldnn_bf16_supported" if dtype == torch.bfloat16 else "_is_mkldnn_fp16_supported"
    try:
        return not getattr(torch.ops.mkldnn, probe)()
    except (AttributeError, RuntimeError):
        return True


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


class WideCompute(DynamoLazyMode):
    """Runs `WIDENED` calls with half-precision CPU inputs in float32; results in the call's own dtype
    and layout. `widened` and `kept` count the half-precision calls of those ops computed each way."""

    def __init__(self, params: Iterable[torch.Tensor] = (), cache_bytes: int = 4 << 30) -> None:
        """`params`: tensors (the model's parameters) whose float32 copies may be kept for later calls, up to
        `cache_bytes`; each forward then converts a weight once, not once per forward."""
        super().__init__()
        self.widened = 0
        self.kept = 0
        self.converted = 0  # half-precision tensors converted to float32 (cache misses)
        self._last_widened = False
        # Only parameters' storages: they live as long as the model, so an address names one tensor's data.
        self._params = {p.untyped_storage().data_ptr() for p in params if p.dtype in HALF and p.device.type == "cpu"}
        self._cache: dict[tuple, tuple[int, torch.Tensor]] = {}
        self._cache_left = cache_bytes

    supports_higher_order_operators = True  # torch.cond & co. run with their calls widened (higher_order.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_higher_order(func):
            return run_higher_order(self, func, args, kwargs)
        if own_dispatch(types):   # a wrapper subclass: its calls on plain tensors come back here
            return NotImplemented
        kwargs = kwargs or {}
        if func in WIDENED:
            tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
            half = any(t.dtype in HALF for t in tensors) and all(t.device.type == "cpu" for t in tensors)
            out = self._wide(func, args, kwargs) if half else None
            self._last_widened = out is not None
            if out is not None:
                self.widened += 1
                return out
            self.kept += half
        return func(*args, **kwargs)

    def widened_last(self, op_name: str) -> bool:
        """Whether the call just made, named `op_name` (`aten::mm`), was computed in float32: the last
        call of a WIDENED op that passed through here was that call."""
        return op_name in WIDENED_NAMES and self._last_widened

    def _wide(self, func, args: tuple, kwargs: dict) -> Any:
        if _rows_per_weight(func, args) < MIN_ROWS:
            return None
        expected = _fake_outputs(func, args, kwargs)
        if expected is None:
            return None
        wide_kwargs = tree_map(self._widen, kwargs)
        if func is aten._grouped_mm.default:
            wide_kwargs.pop("out_dtype", None)
            args = args[:4]
        result = func(*tree_map(self._widen, args), **wide_kwargs)
        flat_result, spec = tree_flatten(result)
        if len(flat_result) != len(expected):
            return None
        outs = []
        for got, (dtype, layout) in zip(flat_result, expected):
            if not isinstance(got, torch.Tensor) or _layout(got) != layout or got.storage_offset() != 0:
                return None
            shape, stride, _ = layout
            outs.append(torch.empty_strided(shape, stride, dtype=dtype).copy_(got))
        return spec.unflatten(outs)


    def _widen(self, x: Any) -> Any:
        """A float32 copy of a half-precision tensor; a parameter's is kept until the parameter is written."""
        if not isinstance(x, torch.Tensor) or x.dtype not in HALF:
            return x
        ptr = x.untyped_storage().data_ptr()
        if ptr not in self._params or x.is_inference():  # an inference tensor keeps no version counter
            self.converted += 1
            return x.float()
        key = (ptr, x.storage_offset(), tuple(x.shape), tuple(x.stride()), x.dtype)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == x._version:  # a view shares its base's version counter
            return hit[1]
        self.converted += 1
        wide = x.float()
        nbytes = wide.untyped_storage().nbytes()
        if hit is not None:
            self._cache_left += hit[1].untyped_storage().nbytes()
            del self._cache[key]
        if nbytes <= self._cache_left:
            self._cache[key] = (x._version, wide)
            self._cache_left -= nbytes
        return wide


def _rows_per_weight(func, args: tuple) -> float:
    """Rows of the product per weight matrix converted (convolutions: always worth it)."""
    if func is aten.convolution.default:
        return float("inf")
    if func in (aten.mm.default, aten.bmm.default):
        return args[0].shape[-2]
    if func is aten._grouped_mm.default:
        a, b = args[0], args[1]
        return a.shape[-2] / b.shape[0] if a.dim() == 2 and b.dim() == 3 else a.shape[-2]
    if func is aten._scaled_dot_product_flash_attention_for_cpu.default:
        return args[0].shape[-2]
    return args[1].shape[-2]  # addmm's mat1, baddbmm's batch1


def _fake_outputs(func, args: tuple, kwargs: dict) -> list[tuple[torch.dtype, tuple]] | None:
    """(dtype, layout) of each output of `func` on the real arguments, from its fake-tensor kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode() as mode:
            fake = tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
            out = func(*fake[0], **fake[1])
    except Exception:  # noqa: BLE001 - no fake kernel for these arguments: the call runs as it is
        return None
    flat = tree_flatten(out)[0]
    if not all(isinstance(t, torch.Tensor) for t in flat):
        return None
    return [(t.dtype, _layout(t)) for t in flat]
