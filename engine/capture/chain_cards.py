"""Chain cards: the chains of one captured forward (engine.capture.chains) as operator cards, with samples.

How the capture takes them (engine.capture.run.capture_model):

- Timing. The captured forward runs under both dispatch modes, `MemberTrace` (a ChainTrace) entered
  last, so it sees each call first and hands it on to the CaptureMode below it: CaptureMode's timed
  region still holds only the op (the trace's bookkeeping runs outside it), and the trace reads that
  one measurement (`CaptureMode.last_timing`) for the chain members instead of timing them again.
- Samples. Chains are known only once a forward has ended, so their samples are taken in a forward
  whose calls are known beforehand, under a `ChainSampler`, which copies the chosen instances' external
  inputs (before the member that first reads each) and their outputs (after the chain's last member) at
  the call indices a traced forward found; no tensor is kept alive between forwards. The warm-up forward
  is traced (`MemberTrace` without a capture) and plans the instances; the captured forward runs under a
  `CapturingSampler` (its MemberTrace, sampling that plan). The captured forward's own trace then decides
  (`ChainSampling.finish`): where its calls (op and exact signature, in order) or its plan differ from the
  warm-up's, those samples are dropped and `sample_chains` runs one more forward for the captured
  forward's plan; where that forward's calls differ too, the chain samples are dropped with a note.
  Until the chain's last member the sampler holds an output through an alias (`detach()`: its own
  tensor on the same storage), never the model's tensor: PyTorch detaches a factory's result
  (`torch.arange`, `empty_like`: `make_variable` shallow-copies a tensor it does not hold alone) when a
  mode still holds it as the call returns, an `aten::detach` the captured forward never made.
- Module bindings. The same forward records, for a module card, how each instance's module forward feeds
  the chain (engine.capture.module_binding): a forward pre-hook on each of the card's modules keeps
  that invocation's arguments and the autocast state, and the sampler keeps the instance's chain inputs
  (strong references, from its first member to its last) to match them by identity; a forward hook checks
  that the invocation returns, by identity, the tensor the chain's one output names (a cast returns its
  plan's output in the forward's place: a forward returning a tuple, a dict, None, an input beside it or
  another tensor would get that tensor instead). Every instance of a module card is bound, sampled or
  not; a card whose instances bind alike gets `class`, `paths`, `args`, `params` and `autocast` on its
  `chain` facts (what export ships as the cast's module entry). One that does not (keyword arguments,
  another return value, bindings that differ, a ModuleCardError) keeps none, so it ships as a pattern
  card, and the capture's notes say why. So does one whose forward does more than compute its return value
  (engine.capture.module_binding): what the hooks hold around each invocation (`attributes_held`: the instance,
  the objects, classes, closures and module-level values its forward reaches, torch's generator) changed, or its
  code, read once per class (`forward_scope`), writes a global or a class attribute, prints, logs, seeds or draws
  from Python's random, registers hooks: a cast serving it would skip that.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from engine.capture.chains import (
    CHAIN_OP,
    Chain,
    ChainPattern,
    ChainTrace,
    chain_card_id,
    chain_signature,
    chain_text,
    container_paths,
    find_chains,
    patterns,
)
from engine.capture.filters import own_dispatch
from engine.capture.folds import data_flow, folding_conv
from engine.capture.higher_order import is_higher_order, run_higher_order
from engine.capture.recorder import CaptureMode, hookable
from engine.capture.samples import SampleWriter, Snapshot, save_sample, storage_key
from engine.capture.signature import bind_arguments, describe_tensor
from engine.cards import OperatorCard


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


def _mutated(func: torch._ops.OpOverload) -> set[str]:
    return {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


class _Trace(ChainTrace):
    """A ChainTrace that can name the tensor behind each value a call wrote."""

    def _written(self, func, args, kwargs, out) -> list[torch.Tensor | None]:
        """The tensors of the last recorded call's `writes`, in order (None where none is found)."""
        cands = _tensors(out)
        mutated = _mutated(func)
        if mutated:
            cands += [t for name, v in bind_arguments(func, args, kwargs or {}) if name in mutated
                      for t in _tensors(v)]
        return [next((t for t in cands if self._current(t) == vid), None) for vid in self.calls[-1].writes]


class MemberTrace(_Trace):
    """The captured forward's trace, nested inside `capture` (entered after it): per call, the
    capture's own timing of it and the descriptions of the tensors it wrote. Without `capture` (a
    forward that is not captured, such as the warm-up) calls are untimed."""

    def __init__(self, path_of: Callable[[], str], capture: CaptureMode | None, *,
                 entered: Callable[[str], int] = lambda path: 0):
        super().__init__(path_of, time_calls=False, entered=entered)
        self.capture = capture
        self.timings: list[Any] = []
        self.write_descs: list[list[dict[str, Any] | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_higher_order(func):
            return run_higher_order(self, func, args, kwargs)
        if own_dispatch(types):   # a wrapper subclass: no call of its own here (engine.capture.filters)
            return NotImplemented
        if self.capture is not None:
            self.capture.last_timing = None
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.timings.append(None if self.capture is None else self.capture.last_timing)
        self.write_descs.append([None if t is None else describe_tensor(t)
                                 for t in self._written(func, args, kwargs, out)])
        return out

    def resolve_times(self) -> None:
        """Set each call's `us` from the capture's measurement (after the device is synchronised)."""
        for call, timing in zip(self.calls, self.timings):
            if isinstance(timing, tuple):
                call.us = timing[0].elapsed_time(timing[1]) * 1e3
            elif timing is not None:
                call.us = timing * 1e6


@dataclass
class _Planned:
    """One chain instance to sample: where its inputs are first read and its outputs made."""

    card_id: str
    idx: int
    chain: Chain
    inputs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # call -> [(input i, read slot)]
    outputs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # call -> [(output o, write k)]
    snap: Snapshot = field(default_factory=Snapshot)
    in_refs: dict[int, dict[str, Any]] = field(default_factory=dict)
    out_tensors: dict[int, torch.Tensor] = field(default_factory=dict)
    sample: bool = True   # copy its inputs and outputs into a sample file
    bind: bool = False    # a module card's instance: record how its module's forward feeds the chain
    in_tensors: dict[int, torch.Tensor] = field(default_factory=dict)  # strong refs while it runs (bind)
    entry: tuple | None = None  # (args, kwargs, autocast state) of its module invocation (bind)
    called_again: bool = False  # its module was called again before its last member (bind): not one invocation


def _plan(card_id: str, idx: int, ch: Chain, *, sample: bool = True, bind: bool = False) -> _Planned:
    p = _Planned(card_id, idx, ch, sample=sample, bind=bind)
    first_use: dict[int, tuple[int, int]] = {}
    for c in ch.calls:
        for slot, (_, vid) in enumerate(c.reads):
            first_use.setdefault(vid, (c.index, slot))
    for i, vid in enumerate(ch.inputs):
        call, slot = first_use[vid]
        p.inputs.setdefault(call, []).append((i, slot))
    for o, vid in enumerate(ch.outputs):
        c = next(c for c in ch.calls if vid in c.writes)
        p.outputs.setdefault(c.index, []).append((o, c.writes.index(vid)))
    return p


class ChainSampler(_Trace):
    """A forward traced like the `reference` one, copying the planned instances' inputs and outputs."""

    def __init__(self, reference: list, planned: list[_Planned], sink: Callable[[_Planned], None],
                 bound: Callable[[_Planned], None] = lambda p: None,
                 returned: Callable[[_Planned, str | None], None] = lambda p, why: None, *,
                 path_of: Callable[[], str] | None = None, entered: Callable[[str], int] = lambda path: 0,
                 stable: frozenset[tuple] = frozenset()):
        super().__init__(*(() if path_of is None else (path_of,)), entered=entered)
        # Storages (the model's parameters) whose slabs a snapshot references instead of copying; a call
        # that writes one first makes each snapshot still referencing it copy it.
        self.stable = stable
        self._borrowing: dict[int, _Planned] = {}  # id -> instance whose snapshot references a stable slab
        self.reference = reference  # the first forward's TraceCalls
        self.sink = sink
        self.bound = bound  # called after a bind instance's last member, with its inputs and entry
        self.returned = returned  # called when that instance's module returns: with why its return value is
        # not the chain's one output tensor, or None where it is
        self.returning: dict[str, _Planned] = {}  # module path -> its bound instance whose last member ran
        self.running: dict[str, _Planned] = {}  # module path -> its bound instance between first and last member
        self.mismatch: str | None = None
        # module path -> (calls so far, args, kwargs, autocast) of its latest forward invocation (`enter`)
        self.entered: dict[str, tuple] = {}
        self._state_in: dict[str, Any] = {}  # module path -> its own attributes when its forward began
        self._args_in: dict[str, Any] = {}   # module path -> its forward's arguments when it began (`held`)
        self.mutated: dict[str, str] = {}    # module path -> which of its attributes its forward changed
        self._at: dict[int, list[_Planned]] = {}
        self._last: dict[int, list[_Planned]] = {}
        for p in planned:
            for i in {*p.inputs, *p.outputs, *([p.chain.calls[0].index] if p.bind else [])}:
                self._at.setdefault(i, []).append(p)
            self._last.setdefault(p.chain.calls[-1].index, []).append(p)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_higher_order(func):
            return run_higher_order(self, func, args, kwargs)
        if own_dispatch(types):   # a wrapper subclass, as the traces do (engine.capture.filters)
            return NotImplemented
        i = len(self.calls)
        if self.mismatch is None and (i >= len(self.reference) or self.reference[i].op != func.name()):
            self.mismatch = f"call {i} is {func.name()}" + (
                f", was {self.reference[i].op}" if i < len(self.reference) else ", beyond the first forward's")
        here = self._at.get(i, []) if self.mismatch is None else []
        if self._borrowing and _mutated(func):
            writes = {storage_key(t) for name, v in bind_arguments(func, args, kwargs or {})
                      if name in _mutated(func) for t in _tensors(v)}
            with _disable_current_modes():
                for p in self._borrowing.values():
                    p.snap.own(frozenset(p.snap.borrowed.values()) - writes)
        if here:
            reads = [t for _, v in bind_arguments(func, args, kwargs or {}) for t in _tensors(v)]
            if any(slot >= len(reads) for p in here for _, slot in p.inputs.get(i, ())):
                # The op of the first forward's call, reading fewer tensors: another path (`x * 1.0` where the first
                # forward made `h * x`, a layer drop drawn from Python's random). Its signature differs too, which
                # is found after the call; taking the planned inputs raised IndexError and failed the capture.
                self.mismatch = f"call {i} ({func.name()}) reads other tensors than in the first forward"
                here = []
            for p in here:
                if p.bind and i == p.chain.calls[0].index:
                    # The module's invocation whose first call this is: its pre-hook ran last for the path,
                    # with no call since (else the entry is another invocation's, and this one stays unbound).
                    entry = self.entered.pop(p.chain.module, None)
                    p.entry = entry[1:] if entry is not None and entry[0] == i else None
                    self.running[p.chain.module] = p
                if i in p.inputs:
                    tensors = [reads[slot] for _, slot in p.inputs[i]]
                    if p.bind:
                        for (k, _), t in zip(p.inputs[i], tensors):
                            p.in_tensors[k] = t
                    if not p.sample:
                        continue
                    with _disable_current_modes():  # the copies are no calls of the forward's
                        p.snap.add_group(f"in{i}.", tensors, self.stable)
                    if p.snap.borrowed:
                        self._borrowing[id(p)] = p
                    for (k, _), t in zip(p.inputs[i], tensors):
                        p.in_refs[k] = p.snap.ref(t, f"in{i}.")
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.mismatch is None and self.calls[-1].signature != self.reference[i].signature:
            self.mismatch = f"call {i} ({func.name()}) has another signature than in the first forward"
        if self.mismatch is None and any(p.sample for p in here):  # not another call's outputs (nor fewer of them)
            written = self._written(func, args, kwargs, out)
            with _disable_current_modes():  # the alias is no call of the forward's (nor of a capture below)
                for p in here:
                    for o, k in p.outputs.get(i, []) if p.sample else ():
                        if written[k] is not None:
                            p.out_tensors[o] = written[k].detach()  # an alias: see the module's docstring
        if self.mismatch is None and self._last.get(i):
            # Modes below this one (a capture, when the captured forward samples) must not see the copies.
            with _disable_current_modes():
                for p in self._last[i]:
                    self._borrowing.pop(id(p), None)
                    if p.sample:
                        self.sink(p)
                        p.out_tensors = {}
                    if p.bind:
                        self.running.pop(p.chain.module, None)
                        self.bound(p)
                        p.in_tensors, p.entry = {}, None  # no tensor of the forward outlives its chain
                        # its module's forward returns next (`leave`): what it returns is checked there
                        self.returning[p.chain.module] = p
        return out

    def enter(self, path: str) -> Callable:
        """A forward pre-hook (with_kwargs) for the module at `path`: keeps its latest invocation's
        arguments and the autocast state it runs under, and marks a bound instance of the module whose chain
        is still running (`block(block(x))`: a chain over both calls of a block that makes no call of its own,
        which the trace cannot tell from one)."""
        from engine.capture.module_binding import attributes_held, autocast_state, held_arguments, rng_state

        def hook(module, args, kwargs):
            p = self.running.get(path)
            if p is not None:  # a chain that runs on into this call was taken for one call of the module
                p.called_again = True
            self.entered[path] = (len(self.calls), args, dict(kwargs or {}), autocast_state())
            self._state_in[path] = attributes_held(module)
            self._state_in[path]["torch's generator"] = rng_state()
            self._args_in[path] = held_arguments(args)
        return hook

    def leave(self, path: str) -> Callable:
        """A forward hook for the module at `path`: notes a forward that changed the module's own attributes
        (a call counter, a cache): a cast that runs its plan instead would skip that change; and, where the
        invocation is a bound instance's, whether it returned the chain's output (`_return_problem`) and left
        the arguments it was passed as they were."""
        from engine.capture.module_binding import attributes_changed, rng_state

        def hook(module, args, out):
            before = self._state_in.pop(path, None)
            changed = []
            if before is not None:
                changed = (["torch's generator"] if before.pop("torch's generator") != rng_state() else []) + \
                    attributes_changed(before, module)
            if changed and path not in self.mutated:
                self.mutated[path] = ", ".join(changed[:3])
            args_in = self._args_in.pop(path, None)
            p = self.returning.pop(path, None)
            if p is not None:
                self.returned(p, self._return_problem(p, out) or _argument_problem(args_in, args))
        return hook

    def release(self) -> None:
        """Let go of what it holds of invocations still open (a forward cut short by an error or a mismatch)."""
        for table in (self.entered, self._state_in, self._args_in, self.returning, self.running):
            table.clear()

    def _return_problem(self, p: _Planned, out: Any) -> str | None:
        """Why `out`, what instance `p`'s module forward returned, is not the chain's one output (a cast returns
        the plan's output tensor in its place), or None. The output is named by identity, as the trace names
        values: the tensor object the member that made it returned, not written since."""
        if len(p.chain.outputs) != 1:
            return f"its chain has {len(p.chain.outputs)} outputs; a module card's forward returns exactly one"
        call, [(_, k)] = next(iter(p.outputs.items()))  # the member that made the output, and which write it is
        if isinstance(out, torch.Tensor) and self._current(out) == self.calls[call].writes[k]:
            return None
        if not isinstance(out, torch.Tensor):
            kind = type(out).__name__
            what = "None" if out is None else f"a {kind}" if kind in ("tuple", "list", "dict") else f"a {kind} object"
            return f"its forward returns {what}, not the chain's output tensor alone (a cast would return that tensor)"
        return ("its forward returns a tensor that is not the chain's output (an input, a parameter, or a tensor "
                "made by a call outside the chain): a cast would return the chain's output in its place")

    def finish(self) -> None:
        if self.mismatch is None and len(self.calls) != len(self.reference):
            self.mismatch = f"it made {len(self.calls)} calls, the first forward {len(self.reference)}"


def _argument_problem(before: Any, args: tuple) -> str | None:
    """Why a forward that changed an argument it was passed (`held` as it began) cannot be served by a kernel, or
    None."""
    from engine.capture.module_binding import arguments_changed

    written = arguments_changed(before, args) if before is not None else []
    if not written:
        return None
    return (f"its forward changes argument {written[0]} it was passed (a {type(args[written[0]]).__name__} appended "
            "to or written into), which the cast's kernel would skip")


class CapturingSampler(MemberTrace, ChainSampler):
    """The captured forward's MemberTrace that also samples chains planned from an earlier forward's trace
    (the warm-up's): when both forwards made the same calls and the captured one plans the same instances,
    no further forward is needed for the chain samples (`ChainSampling.finish`)."""

    def __init__(self, path_of: Callable[[], str], capture: CaptureMode, sampling: ChainSampling, *,
                 entered: Callable[[str], int] = lambda path: 0):
        ChainSampler.__init__(self, sampling.reference, sampling.sampled, sampling.sink, sampling.bound,
                              sampling.returned, path_of=path_of, entered=entered,
                              stable=sampling.writer.stable if sampling.writer is not None else frozenset())
        self.capture = capture
        self.timings = []
        self.write_descs = []


def _extent_bytes(d: dict[str, Any]) -> int:
    if d is None or any(s == 0 for s in d["shape"]):
        return 0
    isz = torch.empty(0, dtype=getattr(torch, d["dtype"])).element_size()
    return (1 + sum((s - 1) * abs(st) for s, st in zip(d["shape"], d["stride"]))) * isz


def _short(op: str) -> str:
    return op.split("::", 1)[-1].split(".")[0]


@dataclass
class ChainCards:
    """The chain cards of one capture and what sampling them needs."""

    cards: list[OperatorCard]
    planned: list[_Planned]  # the instances to sample (a module card's also bound)
    notes: dict[str, str] = field(default_factory=dict)
    bound: list[_Planned] = field(default_factory=list)  # module cards' other instances: bound, not sampled


def chain_cards(trace: MemberTrace, model: torch.nn.Module, weight_of: Callable[[str], int], total_us: float, *,
                samples: int, sample_budget_bytes: int, total_budget_bytes: int) -> ChainCards:
    """Find the trace's chains and make one card per chain signature (after `trace.resolve_times()`).

    `total_us` is the op cards' weighted measured time (a chain's share is of the same total);
    `total_budget_bytes` is the chain samples' total budget. Each card's first `samples`
    instances (within the budgets; the first always) are planned for the sampling forward. A GroupNorm -> SiLU
    card whose input a biased convolution makes, read by nothing else, gets `conv_bias` on its facts (which
    instances: engine.capture.folds derives a card from it)."""
    pats = patterns(find_chains(trace.calls, container_paths(model), unknown=trace.unknown))
    by_id: dict[str, tuple[dict[str, Any], list[ChainPattern]]] = {}
    for p in pats:
        sig = chain_signature(p.instances[0])
        by_id.setdefault(chain_card_id(sig), (sig, []))[1].append(p)
    cards, planned, bound, used = [], [], [], 0
    maker, readers = data_flow(trace.calls)
    for cid, (sig, group) in by_id.items():
        instances = sorted((ch for p in group for ch in p.instances), key=lambda ch: ch.calls[0].index)
        first = instances[0]
        outputs = []
        for vid in first.outputs:
            c = next(c for c in first.calls if vid in c.writes)
            outputs.append(trace.write_descs[c.index][c.writes.index(vid)])
        nbytes = sum(_extent_bytes(a) for a in sig["args"]) + sum(_extent_bytes(d) for d in outputs)
        kind = "module" if all(ch.module is not None for ch in instances) else "pattern"
        module_paths: dict[str, int] = {}
        weighted_us = 0.0
        weight = 0
        for ch in instances:
            path = ch.module or ch.scope
            w = weight_of(path)
            module_paths[path] = module_paths.get(path, 0) + w
            weighted_us += w * sum(c.us for c in ch.calls)
            weight += w
        where = first.module or first.scope
        ops = [_short(c.op) for c in first.calls if not c.view]
        card_budget = 0
        n = 0
        for ch in instances[:samples]:
            if n and (card_budget + 2 * nbytes > sample_budget_bytes or used + 2 * nbytes > total_budget_bytes):
                break
            planned.append(_plan(cid, n, ch, bind=kind == "module"))
            card_budget += 2 * nbytes  # the sample file: inputs and outputs, as for an op card's estimate
            used += 2 * nbytes
            n += 1
        if kind == "module":  # every instance is bound (engine.capture.module_binding), sampled or not
            bound += [_plan(cid, -1, ch, sample=False, bind=True) for ch in instances[n:]]
        facts = {"kind": kind, "module_class": type(model.get_submodule(where)).__name__,
                 "modules": sorted({ch.module for ch in instances if ch.module}),
                 "members": [c.card_id for c in first.calls], "ops": ops}
        fold = _conv_bias(trace.calls, instances, maker, readers, weight_of)
        if fold is not None:
            facts["conv_bias"] = fold
        cards.append(OperatorCard(
            card_id=cid, op=CHAIN_OP, signature=sig, signature_text=chain_text(ops, sig), outputs=outputs,
            calls=weight, captured_calls=len(instances), share=weighted_us / total_us if total_us > 0 else 0.0,
            bytes=nbytes, module_paths=module_paths, capture_us=sum(c.us for ch in instances for c in ch.calls)
            / len(instances), samples=n, chain=facts,
        ))
    cards.sort(key=lambda c: (-c.share, c.card_id))
    return ChainCards(cards, planned, bound=bound)


def _conv_bias(calls: list, instances: list[Chain], maker: dict[int, int], readers: dict[int, list[int]],
               weight_of: Callable[[str], int]) -> dict[str, Any] | None:
    """Which instances of a GroupNorm -> SiLU chain card a convolution's bias could fold into (engine.capture.folds):
    the convolution cards that make their input, how many instances of how many, and their module paths with
    their weights (the folded card's calls); None where none could."""
    folds = [(ch, conv) for ch in instances if (conv := folding_conv(calls, ch, maker, readers)) is not None]
    if not folds:
        return None
    paths: dict[str, int] = {}
    for ch, _ in folds:
        path = ch.module or ch.scope
        paths[path] = paths.get(path, 0) + weight_of(path)
    return {"cards": list(dict.fromkeys(conv.card_id for _, conv in folds)), "instances": len(folds),
            "of": len(instances), "module_paths": paths}


def _plan_keys(planned: list[_Planned]) -> list[tuple]:
    """The instances a plan samples or binds, in a fixed order (a plan lists cards by share, which timing moves)."""
    keys = [(p.card_id, p.idx, tuple(c.index for c in p.chain.calls), p.sample, p.bind, p.chain.key())
            for p in planned]
    return sorted(keys, key=lambda k: k[:3])


class ChainSampling:
    """One forward's sampling of the planned chain instances: each instance's inputs and outputs written to
    `folder` as `<card id>.<idx>.safetensors`, and (with `model`, the module the forward runs) how each
    module card's instances are bound (engine.capture.module_binding)."""

    def __init__(self, found: ChainCards, reference: list, folder: Path, model: torch.nn.Module | None,
                 writer: SampleWriter | None = None):
        self.found = found
        self.writer = writer  # writes the files in the background (else: before the call returns)
        self.reference = reference
        self.folder = folder
        self.model = model
        self.written: dict[str, int] = {}
        self.files: list[Path] = []
        self.write_s = 0.0  # seconds spent writing sample files
        self.bindings: dict[str, list[dict[str, Any] | str]] = {}  # card id -> per instance: binding or why not
        # id(instance) -> its binding, from its chain's last member until its module returns (`returned`)
        self._returning: dict[int, dict[str, Any] | str] = {}
        self.binds = [p for p in (*found.planned, *found.bound) if p.bind] if model is not None else []
        for p in found.planned:
            p.bind = p.bind and model is not None
        # what the sampler watches: the planned instances, then the bound-only ones
        self.sampled = [*found.planned, *(p for p in self.binds if not p.sample)]

    def sink(self, p: _Planned) -> None:
        out_list = [p.out_tensors.get(o) for o in range(len(p.chain.outputs))]
        if any(t is None for t in out_list):
            return  # an output the trace could not name a tensor for: no sample rather than a wrong one
        p.snap.add_group("out.", out_list)
        meta = {"op": CHAIN_OP, "card": p.card_id, "module_path": p.chain.module or p.chain.scope,
                "inputs": [{"name": f"in{i}", "tensor": p.in_refs[i]} for i in range(len(p.chain.inputs))],
                "outputs": {"list": [{"tensor": p.snap.ref(t, "out.")} for t in out_list]},
                "mutated": {}, "kwarg_only": []}
        idx = self.written.get(p.card_id, 0)  # numbered as written: a skipped instance leaves no gap
        f = self.folder / f"{p.card_id}.{idx}.safetensors"
        t0 = time.perf_counter()
        if self.writer is not None:
            self.writer.submit(f, p.snap, meta)
        else:
            save_sample(f, p.snap, meta)
        self.write_s += time.perf_counter() - t0
        self.files.append(f)
        self.written[p.card_id] = idx + 1
        p.snap = Snapshot()  # the host copies are on disk now

    def bound(self, p: _Planned) -> None:
        self._returning[id(p)] = _binding(self.model, p)

    def returned(self, p: _Planned, why: str | None) -> None:
        """Instance `p`'s module returned: its binding counts where it returned the chain's output, else why not."""
        b = self._returning.pop(id(p), None)
        if b is not None:
            self.bindings.setdefault(p.card_id, []).append(b if why is None or isinstance(b, str) else why)

    @contextmanager
    def hooks(self, sampler: ChainSampler) -> Iterator[None]:
        """The module pre-hooks that give `sampler` each bound module's invocations, while the forward runs."""
        handles = []
        try:
            for path in sorted({p.chain.module for p in self.binds}):
                module = self.model.get_submodule(path)
                if not hookable(module):
                    continue
                handles.append(module.register_forward_pre_hook(sampler.enter(path), with_kwargs=True))
                handles.append(module.register_forward_hook(sampler.leave(path)))
            yield
        finally:
            for h in handles:
                h.remove()
            for p in self.binds:  # what an instance cut short by an error or a mismatch still holds
                p.in_tensors, p.entry = {}, None
            # an instance whose module was not seen returning has no binding: its card's instances are not all seen
            self._returning.clear()
            sampler.release()

    def discard(self) -> None:
        """Remove the sample files written so far."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.forget(self.files)
        for f in self.files:
            f.unlink(missing_ok=True)
        self.files.clear()
        self.written.clear()

    def finish(self, sampler: ChainSampler, found: ChainCards | None = None) -> dict[str, int] | None:
        """After the forward: the samples written per card id, with the module bindings put on `found`'s
        cards (default: the planned ones). Where the sampled forward's calls differ from the reference,
        or (given `found`, the captured forward's own plan) it plans other instances than were sampled,
        the files are removed and None is returned."""
        sampler.finish()
        target = found if found is not None else self.found
        if sampler.mismatch is not None or (found is not None and (
                _plan_keys(found.planned) != _plan_keys(self.found.planned)
                or _plan_keys(found.bound) != _plan_keys(self.found.bound))):
            self.discard()
            return None
        if self.binds:
            _bind_cards(target, self.bindings, Counter(p.card_id for p in self.binds), sampler.mutated)
        return dict(self.written)


def sample_chains(forward: Callable[[], Any], found: ChainCards, reference: list, folder: Path,
                  model: torch.nn.Module | None = None) -> dict[str, int]:
    """Run `forward()` once more under a ChainSampler and write the planned chain samples to `folder`
    (`<card id>.<idx>.safetensors`). Returns the samples written per card id; none (and a note in
    `found.notes`) where the forward's calls differ from the first forward's.

    With `model` (the module `forward` runs), each module card's instances are bound too: the card's
    `chain` facts get the module entry (`class`, `paths`, `args`, `params`, `autocast`, `returns`…) or the
    notes say why not."""
    sampling = ChainSampling(found, reference, folder, model)
    sampler = ChainSampler(reference, sampling.sampled, sampling.sink, sampling.bound, sampling.returned)
    with sampling.hooks(sampler), torch.no_grad(), sampler:
        forward()
    written = sampling.finish(sampler)
    if written is None:
        found.notes["chain samples"] = (f"none: a second forward (for the chain samples) differs from the "
                                        f"captured one ({sampler.mismatch}); is the model deterministic?")
        if sampling.binds:
            found.notes["module cards"] = ("no module bindings (they come from the same second forward): the "
                                           "module cards ship as pattern cards")
        return {}
    return written


def _binding(model: torch.nn.Module, p: _Planned) -> dict[str, Any] | str:
    """How instance `p`'s module invocation fed its chain (the module entry's `class`, `args`, `params`,
    `autocast`), or why that cannot be said."""
    from engine.capture.module_binding import (
        ModuleCardError,
        class_name,
        forward_scope,
        held_callable_effect,
        held_description,
        module_binding,
        proven_state,
    )

    if p.called_again:
        return ("its chain runs on into the next call of its module's forward (called again at once, as in "
                "`block(block(x))`): a cast would run the whole chain at each call")
    if p.entry is None:
        return "its module's forward was not seen"
    module = model.get_submodule(p.chain.module)
    # its own forward's and those of the submodules it calls (a block whose child prints: the block's chain is the
    # child's calls, and the child's own module card was refused)
    effect = next((e for c in {type(m): None for m in module.modules()} if (e := forward_scope(c).effect)), None) \
        or held_callable_effect(module)
    if effect is not None:
        return effect
    args, kwargs, autocast = p.entry
    if kwargs:
        return f"its forward is called with keyword arguments ({', '.join(sorted(kwargs))})"
    inputs = [p.in_tensors.get(i) for i in range(len(p.chain.inputs))]
    if any(t is None for t in inputs):
        return "a chain input was not seen"
    try:
        b = module_binding(module, args, inputs)
    except ModuleCardError as e:
        return str(e)
    cls = type(module)
    return {"class": cls.__name__, "class_path": class_name(cls), **b,
            "autocast": [list(x) for x in autocast], "training": bool(module.training),
            "state": proven_state(module), "held": held_description(module)}


# Calls that hand a tensor's value to the host: a forward that makes one may take another path for other values
# (`if x.abs().max() > 100: …`), which no guard on signatures can see.
HOST_READS = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::equal",
                        "aten::allclose", "aten::nonzero", "aten::nonzero_static", "aten::_assert_async.msg"})


def _bind_cards(found: ChainCards, bindings: dict[str, list[dict[str, Any] | str]], expected: dict[str, int],
                mutated: dict[str, str] | None = None) -> None:
    """Put each module card's binding on its chain facts where all its instances bound alike and its forward
    is a function of its arguments and tensors; else a note (the card ships as a pattern card)."""
    from engine.capture.module_binding import written_inputs

    for card in found.cards:
        if card.card_id not in expected:
            continue
        got = bindings.get(card.card_id, [])
        why = next((b for b in got if isinstance(b, str)), None)
        reads = sorted({n.get("op") for n in card.signature.get("chain", {}).get("nodes", [])} & HOST_READS)
        if why is None and reads:
            why = (f"its forward reads tensor values on the host ({', '.join(reads)}): the path it takes may "
                   "depend on values, which a guard cannot see")
        changed = next((f"{path}: {what}" for path, what in (mutated or {}).items()
                        if path in card.chain.get("modules", [])), None)
        if why is None and changed:
            why = f"its forward changes the module's own attributes ({changed}), which the cast's kernel would skip"
        written = written_inputs(card.signature) if why is None else []
        if written:
            why = f"its chain writes its input in{written[0]} in place (a buffer, an attribute's tensor, an argument)"
        # The instances' own attributes need not be alike (a layer index the forward never reads); they
        # say which other instances of the class the card may serve (engine.cast.loader), and with their
        # submodules (classes and attributes) which modules it may serve at all: a forward that calls a
        # child computes what the child does.
        states = [b.pop("state", None) for b in got if not isinstance(b, str)]
        helds = [b.pop("held", None) for b in got if not isinstance(b, str)]
        if why is None and len(got) != expected[card.card_id]:
            why = f"{expected[card.card_id] - len(got)} of its instances were not seen"
        if why is None and any(b != got[0] for b in got[1:]):
            why = "its instances bind their forward's arguments or tensors differently"
        if why is not None:
            found.notes[f"module card {card.chain['module_class']} ({card.card_id})"] = (
                f"no module binding, ships as a pattern card: {why}")
            # What it is from here on, for the capture's table, the TUI, audit and the planner (which gave
            # an unbound card its members' eager calls as if a module card could serve them).
            card.chain.update(kind="pattern", unbound=why)
            continue
        # `returns`: every instance was seen returning the chain's output tensor itself (`_return_problem`); a cast
        # exported before captures checked it has no such fact, and audit says its returns are unchecked
        card.chain.update(got[0], paths=list(card.chain["modules"]), returns="output")
        if states and all(x is not None for x in states):
            card.chain["states"] = [x for i, x in enumerate(states) if x not in states[:i]]
        # what the instances hold (a config's flags, their own plain attributes), compared at install: a model
        # built with another config is not the one proven, even where `states` cannot be recorded
        card.chain["held"] = [x for i, x in enumerate(helds) if x not in helds[:i]]


def synthetic_chain_card(folder: Path, signature: dict[str, Any], samples: int = 2, *, device: str = "cuda",
                         seed: int = 0) -> Any:
    """A chain card's lane reference with `samples` sample files of random inputs (normal values with the
    signature's dtypes, shapes and strides, on `device`), outputs by `run_chain`: how tests and benchmarks
    give a hand-made chain card what a capture would. Returns an engine.cards.CardRef."""
    from engine.capture.chains import CHAIN_OP, chain_card_id, run_chain
    from engine.capture.samples import snapshot_inputs, snapshot_outputs
    from engine.cards import CardRef

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cpu").manual_seed(seed)
    files, outputs = [], None
    for i in range(samples):
        inputs = []
        for a in signature["args"]:
            dtype = getattr(torch, a["dtype"])
            size = sum((s - 1) * st for s, st in zip(a["shape"], a["stride"])) + 1
            base = torch.randn(size, generator=g).to(dtype) if dtype.is_floating_point else \
                torch.randint(0, 8, (size,), generator=g).to(dtype)
            inputs.append((a["name"], base.to(device).as_strided(a["shape"], a["stride"])))
        with torch.no_grad():
            outs = run_chain(signature, [t for _, t in inputs])
        outputs = outputs or [describe_tensor(o) for o in outs]
        snap, layout = snapshot_inputs(inputs)
        out_layout, mutated = snapshot_outputs(snap, outs, {})
        path = folder / f"chain.{i}.safetensors"
        save_sample(path, snap, {"op": CHAIN_OP, "inputs": layout, "outputs": out_layout, "mutated": mutated})
        files.append(str(path))
    return CardRef(chain_card_id(signature), CHAIN_OP, signature, outputs or [], 0, files)
