"""Which ATen calls become operator cards: not views, constructors or metadata-only ops."""

from __future__ import annotations

from typing import Any

import torch

# Ops that launch no kernel worth replacing: aliasing, metadata edits, host syncs, assertions.
METADATA_ONLY = frozenset({
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::_unsafe_view", "aten::_reshape_alias",
    "aten::_local_scalar_dense", "aten::sym_size.int", "aten::sym_stride.int", "aten::sym_numel",
    "aten::sym_storage_offset", "aten::is_same_size", "aten::is_nonzero", "aten::resize_",
    "aten::set_.source_Storage", "aten::set_.source_Storage_storage_offset", "aten::set_.source_Tensor",
    "aten::set_", "aten::record_stream", "aten::as_strided_", "aten::t_", "aten::transpose_",
    "aten::squeeze_", "aten::squeeze_.dim", "aten::squeeze_.dims", "aten::unsqueeze_",
    "aten::_has_compatible_shallow_copy_type", "aten::_assert_async", "aten::_assert_async.msg",
    "aten::_assert_tensor_metadata", "aten::_functional_assert_async.msg", "aten::_assert_scalar",
    "aten::is_pinned", "aten::_nested_tensor_size", "aten::_nested_tensor_strides",
})

# Constructors that take a tensor only for its metadata; the other constructors take no tensor at all.
LIKE_CONSTRUCTORS = frozenset({
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
})

_SKIPPED_NAMESPACES = frozenset({"prim", "profiler", "prims"})


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [x for x in v if isinstance(x, torch.Tensor)]
    return out


def non_strided(tensors: list[torch.Tensor]) -> bool:
    """Whether any of `tensors` is sparse (COO, CSR, …): a kernel reads strided memory, so no card takes it."""
    return any(t.layout != torch.strided for t in tensors)


def unreadable(tensors: list[torch.Tensor]) -> str | None:
    """Why no kernel takes one of `tensors`: 'sparse' (no strided memory to read), 'nested' (a nested tensor, as
    nn.TransformerEncoder makes of a padded batch in eval: one tensor of rows of several lengths, with no one
    shape) or 'quantized' (qint8, quint8: its values need a scale and zero point that live outside its data and
    outside any card's signature), else None."""
    if any(t.is_nested for t in tensors):
        return "nested"
    if non_strided(tensors):
        return "sparse"
    if any(t.is_quantized for t in tensors):
        return "quantized"
    return None


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def own_dispatch(types: Any) -> bool:
    """Whether a tensor subclass among a call's `types` dispatches its calls itself (a wrapper subclass: torchao's
    quantized weights, DTensor, a user's scaled tensor). A capture mode hands such a call to it (returns
    NotImplemented) and sees the calls it makes on the plain tensors it holds: read as a plain tensor, it has no
    storage, and the capture failed ("Attempted to access the data pointer on an invalid python storage") on a
    model that runs. nn.Parameter and other plain subclasses dispatch as torch.Tensor does."""
    return any(t is not torch.Tensor and getattr(t, "__torch_dispatch__", _PLAIN_DISPATCH) is not _PLAIN_DISPATCH
               for t in types or ())


def packed(args: tuple, kwargs: dict) -> bool:
    """Whether an argument is a TorchScript object (a quantized Linear's or convolution's packed weight): no
    kernel can read one, and its Python wrapper is new at every call, so a signature holding it would make a
    card of each call."""
    return any(isinstance(v, torch.ScriptObject) for v in (*args, *kwargs.values()))


def draws(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether a call of an op tagged `nondeterministic_seeded` draws random numbers: not where its dropout
    probability is 0 or its training flag is off (every attention kernel is tagged for its `dropout_p`, and an
    inference forward passes 0: SD3.5's and Gemma's attention were skipped as random until this asked)."""
    schema = func._schema.arguments
    bound = {a.name: a.default_value for a in schema if a.has_default_value()}   # an argument left out: its default
    bound.update(zip((a.name for a in schema), args))
    bound.update(kwargs)
    for name in ("dropout_p", "p"):
        if name in bound and isinstance(bound[name], (int, float)) and not isinstance(bound[name], bool) \
                and bound[name] == 0:
            return False
    for name in ("train", "training"):
        if name in bound and bound[name] is False:
            return False
    return True


def skip_reason(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """Why this call is not a card ('view', 'constructor', 'metadata', 'host result', 'sparse', 'nested',
    'quantized', 'packed', 'data-dependent', 'random'), or None if it is one."""
    name = func.name()
    if func.namespace in _SKIPPED_NAMESPACES:
        return "metadata"
    if func.is_view:
        return "view"
    if name in METADATA_ONLY or name.split(".")[0] in METADATA_ONLY:
        return "metadata"
    base = func._schema.name.split("::", 1)[-1]
    tensors = _tensors(args, kwargs)
    if base in LIKE_CONSTRUCTORS or not tensors:
        return "constructor"
    if not returns_tensors(func):
        # `equal`, `allclose`, `_nested_tensor_from_mask_left_aligned`: a bool or number for the host, no
        # output a kernel writes (the nested-tensor check was a card at 62 % of a TransformerEncoder's time)
        return "host result"
    if packed(args, kwargs):
        return "packed"
    if data_dependent(func, args, kwargs):
        return "data-dependent"
    if torch.Tag.nondeterministic_seeded in func.tags and draws(func, args, kwargs):
        # bernoulli, multinomial, exponential_, dropout with training=True: every call draws other numbers, so no
        # kernel matches eager's output and no candidate could pass (chains end at them for the same reason)
        return "random"
    return unreadable(tensors)


_RETURNS_TENSORS: dict[Any, bool] = {}


def returns_tensors(func: torch._ops.OpOverload) -> bool:
    """Whether the op's schema returns a tensor (or a list of them, or writes one in place); per op once, as the
    capture asks it of every call."""
    got = _RETURNS_TENSORS.get(func)
    if got is None:
        got = _RETURNS_TENSORS[func] = any("Tensor" in str(r.type) for r in func._schema.returns) or \
            any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
    return got


def data_dependent(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether the call's output shape depends on its input values (`nonzero`, `unique`, `masked_select`, `x[mask]`,
    `bincount`, `repeat_interleave` by a tensor without `output_size`, torchvision's `nms`): a kernel writes outputs
    of the card's shape, and every fresh input set verification draws asks for another, so no candidate could
    pass. PyTorch tags its own such ops `dynamic_output_shape`; `index.Tensor` only where an index is a mask,
    `one_hot` where it counts its classes. Ops of other libraries carry no such tag (torchvision's `nms` was a card,
    and a member of Mask R-CNN's chain cards): their fake kernel tells (`_dynamic_by_fake`)."""
    if torch.Tag.dynamic_output_shape not in func.tags:
        return func.namespace not in ("aten", "prims", "prim") and _dynamic_by_fake(func, args, kwargs)
    name = func.name()
    if name == "aten::index.Tensor":
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    if name == "aten::repeat_interleave.Tensor":
        return kwargs.get("output_size", args[1] if len(args) > 1 else None) is None
    if name == "aten::one_hot":
        return kwargs.get("num_classes", args[1] if len(args) > 1 else -1) == -1
    return True


_FAKE_ANSWERS: dict[str, bool] = {}


def _dynamic_by_fake(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether the op's fake (meta) kernel says its output size depends on values: run on fake copies of the
    call's tensors with no shape environment, such a kernel (one that asks for a new dynamic size) raises
    DynamicOutputShapeException. An op with no fake kernel, or one that raises otherwise, is taken as not
    data-dependent (it stays a card, as before). One answer per op: it is asked on the op's first call."""
    name = func.name()
    if name not in _FAKE_ANSWERS:
        from torch._subclasses.fake_tensor import (
            DataDependentOutputException,
            DynamicOutputShapeException,
            FakeTensorMode,
        )
        from torch.utils._pytree import tree_map_only

        answer = False
        try:
            with FakeTensorMode(allow_fallback_kernels=False) as mode:  # never the real kernel on zeros
                fake = tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
                func(*fake[0], **fake[1])
        except (DynamicOutputShapeException, DataDependentOutputException):
            answer = True
        except Exception:  # noqa: BLE001 - no fake kernel, or one that cannot run here: no answer, keep the card
            answer = False
        _FAKE_ANSWERS[name] = answer
    return _FAKE_ANSWERS[name]
