"""ATen operator lookup by the names cards carry, and what their schemas say about aliasing."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch


def resolve_op(name: str) -> torch._ops.OpOverload:
    """'aten::add_.Tensor' -> torch.ops.aten.add_.Tensor ('aten::relu_' -> .default)."""
    ns, rest = name.split("::", 1)
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def return_aliases(op: torch._ops.OpOverload) -> list[str | None]:
    """For each return of the op: the name of the argument it aliases (in-place/out=), else None."""
    by_set: dict[frozenset, str] = {}
    for a in op._schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            by_set[frozenset(a.alias_info.before_set)] = a.name
    out = []
    for r in op._schema.returns:
        if r.alias_info is not None and r.alias_info.is_write:
            out.append(by_set.get(frozenset(r.alias_info.before_set)))
        else:
            out.append(None)
    return out


def write_only_args(op: torch._ops.OpOverload) -> list[str]:
    """`out=` arguments: the candidate must write all of them; they are pre-filled like outputs."""
    return [a.name for a in op._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


# Arguments ops write that their schemas do not mark (`Tensor?`, not `Tensor(a!)`), and the flag under which they do:
# the batch norms PyTorch's own `batch_norm` dispatches to (CPU: native_batch_norm; CUDA: cudnn_batch_norm; ROCm:
# miopen_batch_norm) update the running statistics in training, as `_native_batch_norm_legit` does its marked ones.
# Read from the schema alone, eager's own answer moved them, and an honest kernel that updated them was rejected for
# mutating a read-only input. In eval they stay read-only (unchanged, bit for bit).
UNMARKED_WRITES: dict[str, tuple[str, tuple[str, ...]]] = {
    "native_batch_norm": ("training", ("running_mean", "running_var")),
    "cudnn_batch_norm": ("training", ("running_mean", "running_var")),
    "miopen_batch_norm": ("training", ("running_mean", "running_var")),
}


def written_args(op: torch._ops.OpOverload, bound: Sequence[tuple[str, Any]] | None = None) -> list[str]:
    """Every argument the op writes: those its schema marks (`Tensor(a!)`: in-place and `out=` ones, and those it
    updates without returning them, `_native_batch_norm_legit`'s running statistics in training) and those it
    writes unmarked (`UNMARKED_WRITES`; where `bound`, a call's arguments, sets their flag False, not those). A
    candidate must leave each as eager does; every other input must come back unchanged."""
    flag, unmarked = UNMARKED_WRITES.get(op._schema.name.split("::", 1)[-1], ("", ()))
    if unmarked and bound is not None and dict(bound).get(flag) is False:
        unmarked = ()
    return [a.name for a in op._schema.arguments
            if (a.alias_info is not None and a.alias_info.is_write) or a.name in unmarked]


def written_aliases(bound: Sequence[tuple[str, Any]], written: Collection[str]) -> set[str]:
    """Paths (`name`, `name[j]` in a list) of the tensors of `bound` not in `written` whose range of storage overlaps
    a written argument's (`mul_(x, x)`'s `other`): the op's write may change them too, so they must end as eager
    leaves them, not as they were (an honest in-place kernel on aliased arguments was rejected as mutating its
    read-only input), and an `out=` that is an input must keep the input's values. By range, not element: two
    interleaved views (`x[:, 0]`, `x[:, 1]`) count as overlapping."""
    named = []   # (path, argument name, tensor)
    for n, v in bound:
        if isinstance(v, (list, tuple)):
            named += [(f"{n}[{j}]", n, t) for j, t in enumerate(v) if isinstance(t, torch.Tensor)]
        elif isinstance(v, torch.Tensor):
            named.append((n, n, v))
    spans = [_span(t) for _, n, t in named if n in written and t.numel()]
    out = set()
    for path, n, t in named:
        if n in written or not t.numel():
            continue
        key, lo, hi = _span(t)
        if any(k == key and lo < b and a < hi for k, a, b in spans):
            out.add(path)
    return out


def _span(t: torch.Tensor) -> tuple[tuple, int, int]:
    """(storage, first byte, past the last byte) of the elements `t` touches."""
    isz = t.element_size()
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr()), t.storage_offset() * isz, (last + 1) * isz


def call_op(op: torch._ops.OpOverload, bound: Sequence[tuple[str, Any]]) -> Any:
    """Call the public op with arguments in schema order (keyword-only ones by name)."""
    kwarg_only = {a.name for a in op._schema.arguments if a.kwarg_only}
    args = [v for n, v in bound if n not in kwarg_only]
    kwargs = {n: v for n, v in bound if n in kwarg_only}
    return op(*args, **kwargs)


def tensors_of(out: Any) -> list[torch.Tensor]:
    """The tensors of an op's result, in return order (nested lists flattened)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for x in out for t in tensors_of(x)]
    return []


def meta_output_strides(op: torch._ops.OpOverload, bound: Sequence[tuple[str, Any]]) -> list[tuple[int, ...]]:
    """The strides of each tensor the op returns for these arguments as PyTorch's meta kernel gives them (fake
    tensors, nothing run): what torch.compile's code asserts of a call it hands tensors in these layouts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fake = [(n, mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for n, v in bound]
    with mode:
        out = call_op(op, fake)
    return [tuple(t.stride()) for t in tensors_of(out)]


_KEY_STRIDES: dict[tuple, tuple[int, ...]] = {}  # (shape, strides) with a size-1 dim -> key_strides, memoised
_KEY_STRIDES_KEPT = 4096


def key_strides(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    """The strides with a size-1 dim's as 0: no element is addressed through it, and eager, Inductor and meta
    kernels disagree on it (a [1, C, H, W] channels-last tensor has C or C·H·W there). What guard keys hold
    (engine.cast.guard) and what `same_strides` compares. Hashable `shape` and `stride` (torch.Size,
    tuples); memoised, since a batch of one puts a size-1 dim in most live calls a guard sees."""
    if 1 not in shape:
        return tuple(stride)
    k = (shape, stride)
    out = _KEY_STRIDES.get(k)
    if out is None:
        if len(_KEY_STRIDES) >= _KEY_STRIDES_KEPT:
            _KEY_STRIDES.clear()
        out = _KEY_STRIDES[k] = tuple([0 if n == 1 else s for n, s in zip(shape, stride)])
    return out


def channels_last_by_strides(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether PyTorch takes a 4-D (5-D) tensor of these sizes and strides for channels-last: c10's
    `is_channels_last_strides_2d` (`_3d`), what `Tensor.suggest_memory_format()` answers from and so what many
    eager kernels lay their outputs out by (upsampling, batch norm, convolution). Unlike `is_contiguous` it reads
    the strides of size-1 dims: bf16[1,512,128,128] at (8388608, 1, 65536, 512) is channels-last, at (512, 1,
    65536, 512) it is not, and eager's upsampling returns NCHW for the second (sd35_medium, H100 2026-12-06d)."""
    n = len(shape)
    if n not in (4, 5) or stride[1] == 0:
        return False
    low = 0
    for d in ((1, 3, 2, 0) if n == 4 else (1, 4, 3, 2, 0)):
        if shape[d] == 0 or stride[d] < low:
            return False
        if d == 0 and low == stride[1]:
            return False
        low = stride[d] * shape[d] if shape[d] > 1 else stride[d]
    return True


def layout_sensitive(shape: Sequence[int]) -> bool:
    """A 4-D or 5-D shape with a size-1 dim: guard keys leave that dim's stride out (`key_strides`), yet it can
    decide `channels_last_by_strides`, and with it how eager lays out an op's outputs."""
    return len(shape) in (4, 5) and 1 in shape


def may_have_sizes(shape: Sequence[Any], proven: Sequence[int]) -> bool:
    """Whether a tensor of `shape` can have the sizes `proven`: equal at every concrete size, a symbolic one
    (dynamic shapes, a SymInt) matching any. What compiled code may keep for a variant proven at `proven`."""
    return len(shape) == len(proven) and all(type(n) is not int or n == p for n, p in zip(shape, proven))


def same_strides(shape: Sequence[int], a: Sequence[int] | None, b: Sequence[int] | None) -> bool:
    """Whether two strides lay out a tensor of `shape` alike: equal `key_strides` (torch 2.11's meta GroupNorm
    gives (128, 1, ...) for a [1, 128, H, W] channels-last input that Inductor holds as (128·H·W, 1, ...)), or
    the tensor is empty. What compiled code's `assert_size_stride` checks."""
    if a is None or b is None or len(a) != len(shape) or len(b) != len(shape):
        return a is None and b is None
    shape = tuple(int(n) for n in shape)
    if 0 in shape:
        return True
    return key_strides(shape, tuple(int(x) for x in a)) == key_strides(shape, tuple(int(y) for y in b))


def restrided(out: Any, strides: Sequence[Sequence[int] | None]) -> Any:
    """`out` with each tensor whose strides differ from its entry in `strides` (in return order; None or a
    missing entry: left as it is; `same_strides` decides) copied into those strides. Values, shapes and dtypes
    unchanged."""
    tensors = tensors_of(out)
    if not any(i < len(strides) and strides[i] is not None and not same_strides(t.shape, t.stride(), strides[i])
               for i, t in enumerate(tensors)):
        return out
    it = iter(range(len(tensors)))

    def redo(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            i = next(it)
            want = strides[i] if i < len(strides) else None
            if want is None or same_strides(x.shape, x.stride(), want):
                return x
            return torch.empty_strided(x.shape, tuple(want), dtype=x.dtype, device=x.device).copy_(x)
        if isinstance(x, (list, tuple)):
            items = [redo(y) for y in x]
            try:
                return type(x)(items)   # list, tuple, torch.return_types (a structseq takes a sequence)
            except TypeError:           # a namedtuple takes fields
                return type(x)(*items)
        return x
    return redo(out)


def eager_call(op: torch._ops.OpOverload, signature: dict[str, Any] | None = None) -> Any:
    """Eager for a card: `bound -> op(...)`. A channels-last twin's (`signature["twin_of"]`,
    engine.capture.twins) is what compiled code that hands the op its input as held gets from PyTorch: the
    input copied to contiguous (CUDA native_group_norm rejects channels-last input), the op, and its outputs
    copied into the layouts the op's meta kernel gives for the held input, which the compiled code asserts
    (a channels-last output for GroupNorm). Both copies are part of eager's time."""
    if not (signature or {}).get("twin_of"):
        return lambda bound: call_op(op, bound)
    layouts: dict[tuple, list[tuple[int, ...]]] = {}

    def run(bound: Sequence[tuple[str, Any]]) -> Any:
        (n0, v0), *rest = bound
        key = tuple((tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type)
                    for _, v in bound if isinstance(v, torch.Tensor))
        if key not in layouts:
            layouts[key] = meta_output_strides(op, bound)
        out = call_op(op, [(n0, v0.contiguous() if isinstance(v0, torch.Tensor) else v0), *rest])
        return restrided(out, layouts[key])
    return run
