"""The TorchDispatchMode that records every ATen call of one forward, keyed by exact signature."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.capture.dispatch_mode import DynamoLazyMode
from engine.capture.filters import own_dispatch, skip_reason, unreadable
from engine.capture.higher_order import is_higher_order, run_higher_order
from engine.capture.samples import Snapshot, snapshot_inputs, snapshot_outputs
from engine.capture.signature import (
    bind_arguments,
    card_id,
    describe_tensor,
    iter_tensors,
    signature_of,
    storage_extent,
)
from engine.ops import tensors_of, write_only_args, written_args

TOP_LEVEL = "(top)"  # module path of calls made outside any submodule (e.g. pipeline glue code)


@dataclass
class CardTally:
    """What one card accumulates while the forward runs."""

    id: str
    op: str
    signature: dict[str, Any]
    bytes: int
    outputs: list[dict[str, Any]]
    calls: int = 0  # calls seen in this (possibly shrunk) forward
    weighted_calls: int = 0  # scaled by layer multiplicity: calls per forward of the full model
    module_paths: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    sample_bytes: int = 0
    cpu_seconds: list[tuple[float, int]] = field(default_factory=list)  # (seconds, weight) per call
    cuda_events: list[tuple[Any, Any, int]] = field(default_factory=list)  # (start, end, weight)
    output_varies: bool = False

    def weighted_us(self) -> float:
        """Measured time of this card's calls, each scaled by its layer multiplicity, in µs."""
        if self.cuda_events:
            return sum(s.elapsed_time(e) * 1e3 * w for s, e, w in self.cuda_events)
        return sum(sec * 1e6 * w for sec, w in self.cpu_seconds)

    def mean_us(self) -> float:
        """Mean measured time of one call during capture, in µs (not the lane's eager latency)."""
        if self.cuda_events:
            return sum(s.elapsed_time(e) * 1e3 for s, e, _ in self.cuda_events) / len(self.cuda_events)
        return sum(sec for sec, _ in self.cpu_seconds) / max(1, len(self.cpu_seconds)) * 1e6


# Saves one sample, or copies what the snapshot references, before it returns (the snapshot references the
# inputs the call does not write).
SampleSink = Callable[[CardTally, int, Snapshot, dict[str, Any]], int]


def _written_args(func: torch._ops.OpOverload, bound: list[tuple[str, Any]]) -> dict[str, torch.Tensor]:
    out = {}
    written = _written_names(func, bound)
    for name, v in bound:
        if name in written:
            if isinstance(v, torch.Tensor):
                out[name] = v
            elif isinstance(v, (list, tuple)):
                out.update({f"{name}[{j}]": x for j, x in enumerate(v) if isinstance(x, torch.Tensor)})
    return out


_OUT_ARGS: dict[Any, frozenset[str]] = {}


# Arguments that hold the elements an indexed write writes (index_put_'s indices and values, scatter's index and
# src, index_copy_'s index and source): where one is empty the call writes nothing.
_WRITE_SOURCES = frozenset({"index", "indices", "values", "source", "src"})


def _writes_nothing(func: torch._ops.OpOverload, bound: list[tuple[str, Any]], out: Any) -> bool:
    """Whether the call writes no element: every tensor it returns is empty (roi_align over no boxes, a
    detector's FPN level with no proposals), or it writes an argument in place through an empty index or source
    (`index_put_` of 0 rows, which counted 3.8 MiB of traffic for its untouched `self`). A kernel for it does
    nothing; as a card it only skews the table's bytes and shares."""
    outs = tensors_of(out)
    if outs and all(t.numel() == 0 for t in outs):
        return True
    if not _written_names(func, bound):
        return False
    for name, v in bound:
        if name in _WRITE_SOURCES:
            ts = [v] if isinstance(v, torch.Tensor) else [t for t in v or () if isinstance(t, torch.Tensor)] \
                if isinstance(v, (list, tuple)) else []
            if any(t.numel() == 0 for t in ts):
                return True
    return False


def _out_args(func: torch._ops.OpOverload) -> frozenset[str]:
    """The op's `out=` arguments (kwarg-only, written), per op once."""
    names = _OUT_ARGS.get(func)
    if names is None:
        names = _OUT_ARGS[func] = frozenset(write_only_args(func))
    return names


def _written_names(func: torch._ops.OpOverload, bound: list[tuple[str, Any]]) -> set[str]:
    """Arguments the call writes (in-place `self`, `out=`, a training batch norm's running statistics:
    `ops.written_args`). A CPU storage none of them touches is saved after the call by reference: the sample of
    a training native_batch_norm held the running statistics it had updated."""
    return set(written_args(func, bound))


def _write_only(func: torch._ops.OpOverload) -> set[str]:
    """`out=` arguments: written, never read (in-place `self` is both)."""
    return {a.name for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write}


def _span_bytes(tensors: list[torch.Tensor]) -> int:
    seen, total = set(), 0
    for t in tensors:
        lo, hi = storage_extent(t)
        key = (t.device.type, t.untyped_storage().data_ptr(), lo, hi)
        if key not in seen:
            seen.add(key)
            total += hi - lo
    return total


def bytes_moved(func: torch._ops.OpOverload, bound: list[tuple[str, Any]], out: Any) -> int:
    """Minimum bytes one call must move: every input read once, every output and mutation written once."""
    write_only = _write_only(func)
    reads = [t for path, t in iter_tensors(bound) if path.split("[")[0] not in write_only]
    writes = tensors_of(out)
    written_ids = {id(t) for t in writes}
    writes += [t for t in _written_args(func, bound).values() if id(t) not in written_ids]
    return _span_bytes(reads) + _span_bytes(writes)


class CaptureMode(DynamoLazyMode):
    """Records each non-view, non-constructor ATen call: signature, module path, time, samples."""

    def __init__(self, *, path_of: Callable[[], str], weight_of: Callable[[str], int], samples: int,
                 sample_budget_bytes: int, sink: SampleSink | None, use_cuda_events: bool,
                 total_budget_bytes: int = 1 << 62, progress: Callable[[str], None] | None = None,
                 progress_every_s: float = 0.5,
                 before_write: Callable[[list[torch.Tensor]], None] | None = None):
        super().__init__()
        # Called with the tensors a call writes, before it runs (a background sample writer waits there
        # for the files that still hold those tensors' storages).
        self.before_write = before_write
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.ops = 0  # recorded calls so far
        self._last_progress = time.monotonic()
        self._last_block = ""
        self.path_of = path_of
        self.weight_of = weight_of
        self.samples = samples
        self.sample_budget = sample_budget_bytes
        self.total_budget = total_budget_bytes
        self.total_sample_bytes = 0
        self.sink = sink
        self.use_cuda_events = use_cuda_events
        self.cards: dict[str, CardTally] = {}
        self.skipped: Counter[str] = Counter()
        # The timing of the call just recorded ((start, end) CUDA events, or host seconds), None after a
        # skipped one: a ChainTrace nested inside reads it to time chain members without timing twice.
        self.last_timing: Any = None

    supports_higher_order_operators = True  # torch.cond & co. run with their calls recorded (higher_order.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_higher_order(func):
            return run_higher_order(self, func, args, kwargs)
        if own_dispatch(types):   # a wrapper subclass: its own calls on plain tensors come back here
            self.skipped["subclass"] += 1
            return NotImplemented
        kwargs = kwargs or {}
        reason = skip_reason(func, args, kwargs)
        self.last_timing = None
        if reason is not None:
            self.skipped[reason] += 1
            return func(*args, **kwargs)
        bound = bind_arguments(func, args, kwargs)
        signature = signature_of(func, bound)
        cid = card_id(signature)
        tally = self.cards.get(cid)
        snap = layout = None
        if self.sink is not None and self._wants_sample(tally, bound):
            # The sink saves (or copies) the sample before this returns: only what the call writes needs a copy.
            snap, layout = snapshot_inputs(bound, written=_written_names(func, bound))
        if self.before_write is not None and _written_names(func, bound):
            self.before_write(list(_written_args(func, bound).values()))
        outs_in = [(v, v.shape) for n, v in bound if n in _out_args(func) and isinstance(v, torch.Tensor)]
        # Timed region holds only the op itself; sample copies happen outside it.
        if self.use_cuda_events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **kwargs)
            end.record()
        else:
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            seconds = time.perf_counter() - t0
        made = unreadable(tensors_of(out))  # made a sparse or quantized tensor: not a card, as one that takes it
        if made is not None:
            self.skipped[made] += 1
            return out
        if _writes_nothing(func, bound, out):
            self.skipped["empty"] += 1
            return out
        if any(v.shape != shape for v, shape in outs_in):
            # an out= buffer of another shape (`out=torch.empty(0)`), which eager resizes: a kernel writes the buffer
            # it is given, so no candidate could pass (eager's own call was rejected as writing outside it)
            self.skipped["resized out="] += 1
            return out
        outputs = [describe_tensor(t) for t in tensors_of(out)]
        if tally is None:
            tally = CardTally(id=cid, op=func.name(), signature=signature,
                              bytes=bytes_moved(func, bound, out), outputs=outputs)
            self.cards[cid] = tally
        elif [(o["shape"], o["stride"], o["dtype"]) for o in outputs] != \
                [(o["shape"], o["stride"], o["dtype"]) for o in tally.outputs]:
            tally.output_varies = True  # data-dependent output shape: a kernel must not assume one
        path = self.path_of()
        weight = self.weight_of(path)
        self.ops += 1
        if self.progress is not None:
            self._report(path)
        tally.calls += 1
        tally.weighted_calls += weight
        tally.module_paths[path] = tally.module_paths.get(path, 0) + weight
        if self.use_cuda_events:
            tally.cuda_events.append((start, end, weight))
            self.last_timing = (start, end)
        else:
            tally.cpu_seconds.append((seconds, weight))
            self.last_timing = seconds
        if snap is not None:
            out_layout, mutated = snapshot_outputs(snap, out, _written_args(func, bound))
            kwarg_only = [a.name for a in func._schema.arguments if a.kwarg_only]
            meta = {"op": func.name(), "card": cid, "inputs": layout, "outputs": out_layout,
                    "mutated": mutated, "kwarg_only": kwarg_only, "module_path": path}
            written = self.sink(tally, tally.samples, snap, meta)
            tally.sample_bytes += written
            self.total_sample_bytes += written
            tally.samples += 1
        return out

    def _report(self, path: str) -> None:
        """A progress line when the forward enters another block (path up to its layer index) or every
        `progress_every_s`, never more often than that: a user sees the capture moving, at no cost."""
        block = _block_of(path)
        now = time.monotonic()
        if now - self._last_progress < self.progress_every_s:
            return
        if block == self._last_block and now - self._last_progress < 4 * self.progress_every_s:
            return
        self._last_block, self._last_progress = block, now
        self.progress(f"capturing: {self.ops} ops, {len(self.cards)} cards, "
                      f"{self.total_sample_bytes / 1e6:.0f} MB of samples; in {path}")

    def _wants_sample(self, tally: CardTally | None, bound: list[tuple[str, Any]]) -> bool:
        if tally is None:
            return self.samples > 0
        if tally.samples >= self.samples:
            return False
        # Every card keeps its first sample; further ones stay inside the per-card and the whole
        # capture's budgets (inputs + outputs ≈ 2× inputs), so a full-size capture stays bounded.
        estimate = 2 * _span_bytes([t for _, t in iter_tensors(bound)])
        return (tally.sample_bytes + estimate <= self.sample_budget
                and self.total_sample_bytes + estimate <= self.total_budget)


def _block_of(path: str) -> str:
    """The module path up to and including its first numeric part (`model.layers.3`), else its first two."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2])


def hookable(module: torch.nn.Module) -> bool:
    """Whether `module` takes forward hooks: a TorchScript module (torch.jit.script) refuses them, and runs its
    submodules inside the interpreter, so its calls are counted to the nearest Python module around it."""
    return not isinstance(module, torch.jit.RecursiveScriptModule)


class ModulePaths:
    """Tracks which named submodule is executing, via forward pre/post hooks on every submodule."""

    def __init__(self, root: torch.nn.Module, multiplicity: Mapping[str, int]):
        self.root = root
        self.stack: list[str] = []
        self.handles: list[Any] = []
        # Longest prefix first, so the most specific multiplicity wins.
        self.multiplicity = sorted(multiplicity.items(), key=lambda kv: -len(kv[0]))
        self._weights: dict[str, int] = {}
        self._entered: dict[str, int] = {}

    def __enter__(self) -> ModulePaths:
        for name, module in self.root.named_modules():
            if not name or not hookable(module):
                continue
            self.handles.append(module.register_forward_pre_hook(self._push(name)))
            self.handles.append(module.register_forward_hook(self._pop(name), always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.stack.clear()

    def _push(self, name: str):
        def hook(module, args):
            self.stack.append(name)
            self._entered[name] = self._entered.get(name, 0) + 1
        return hook

    def _pop(self, name: str):
        def hook(module, args, output):
            # Pop down to this module even if a child raised without its own hook running.
            while self.stack and self.stack.pop() != name:
                pass
        return hook

    def current(self) -> str:
        return self.stack[-1] if self.stack else TOP_LEVEL

    def entered(self, path: str) -> int:
        """How many times the module at `path` has been called so far: a module called twice in a row, with no
        other module's call between (`act(act(x))`), is two invocations though the path never changed."""
        return self._entered.get(path, 0)

    def weight(self, path: str) -> int:
        w = self._weights.get(path)
        if w is None:
            w = 1
            for prefix, m in self.multiplicity:
                if path == prefix or path.startswith(prefix + "."):
                    w = m
                    break
            self._weights[path] = w
        return w
