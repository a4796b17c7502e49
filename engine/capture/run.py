"""Capture a model config into operator cards and store them (with samples) in the workspace."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.capture.chain_cards import (
    CapturingSampler,
    ChainSampling,
    MemberTrace,
    chain_cards,
    sample_chains,
)
from engine.capture.folds import conv_bias_folds
from engine.capture.folds import wanted as folds_wanted
from engine.capture.hidden import hidden_cards
from engine.capture.recorder import CaptureMode, CardTally, ModulePaths
from engine.capture.samples import SampleWriter, Snapshot, storage_key
from engine.capture.signature import dtype_name, signature_text
from engine.capture.twins import channels_last_twins
from engine.capture.twins import wanted as twins_wanted
from engine.capture.wide_compute import WideCompute, widens
from engine.cards import OperatorCard
from engine.config import ModelConfig, build_target
from engine.errors import UsageError
from engine.models.forwards import output_tensor
from engine.models.random_init import fill_period
from engine.models.target import ModelExited
from engine.store.sample_folders import PARTIAL_PREFIX, SampleFolderLock, capture_writing
from engine.store.workspace import samples_dir

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CaptureResult:
    """One capture: its cards (by share, largest first) and how it was taken."""

    capture_id: str
    model: str
    device: str
    dtype: str
    small: bool
    wall_s: float
    cards: list[OperatorCard]
    skipped: dict[str, int]
    notes: dict[str, str]
    sample_dir: str  # relative to the workspace
    # Wall seconds per phase: build, warm-up, captured forward (without queueing samples), writing samples
    # (queueing them, and waiting at the end for the background writer), chain samples (finding the chains,
    # and one more forward where the warm-up could not plan them).
    phases: dict[str, float] = field(default_factory=dict)
    # Chain cards (op `kforge::chain`): chains of memory-bound calls, by share; they overlap the op cards
    # (a chain's calls are also its members' op cards' calls), so `total_calls` does not count them (nor the
    # folded chain cards and chain twins among them).
    chains: list[OperatorCard] = field(default_factory=list)
    # sample file name -> (sha256, bytes), hashed as written; a file not listed here is hashed when stored
    sample_digests: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Channels-last twins among `cards` (engine.capture.twins): twin card id -> the card whose samples it shares
    twins: dict[str, str] = field(default_factory=dict)
    # Hidden calls among `cards` (engine.capture.hidden): card id -> the card whose call makes it (and whose
    # samples it shares)
    hidden: dict[str, str] = field(default_factory=dict)
    # Conv-bias folded chain cards among `chains` (engine.capture.folds): card id -> the plain GroupNorm -> SiLU
    # chain card it derives from (and whose samples it shares)
    folded: dict[str, str] = field(default_factory=dict)

    @property
    def total_calls(self) -> int:
        # a twin's calls are its original's, a hidden call's part of the call that makes it
        return sum(c.calls for c in self.cards if c.card_id not in self.twins and c.card_id not in self.hidden)

    def shares_samples_of(self, card_id: str) -> str:
        """The card whose sample files `card_id` reads: its own, or, link by link, a twin's original's, a folded
        chain's plain chain's, a hidden call's maker's (a folded card's twin: the plain chain's)."""
        seen = set()
        while card_id not in seen:
            seen.add(card_id)
            nxt = self.twins.get(card_id) or self.folded.get(card_id) or self.hidden.get(card_id)
            if nxt is None:
                break
            card_id = nxt
        return card_id

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "capture": self.capture_id, "device": self.device, "dtype": self.dtype,
            "small": self.small, "wall_s": round(self.wall_s, 3), "total_calls": self.total_calls,
            "skipped": self.skipped, "notes": self.notes, "cards": [c.to_json() for c in self.cards],
            "chains": [c.to_json() for c in self.chains],
            "twins": dict(self.twins), "hidden": dict(self.hidden), "folded": dict(self.folded),
        }


def resolve_device(requested: str | None) -> torch.device:
    """`--device`: cuda when asked for and present; default cuda if present, else cpu."""
    if requested not in (None, "cpu", "cuda"):
        raise UsageError(f"--device {requested}: unknown device; use cpu or cuda")
    if requested == "cuda" or (requested is None and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA GPU is visible to PyTorch here; use --device cpu")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# What torch raises where a forward asks for CUDA on a machine without it (no driver, no GPU, a CPU-only build);
# on one with a GPU, a CUDA tensor then meets the CPU's ("Expected all tensors to be on the same device").
_NO_CUDA = ("Found no NVIDIA driver", "Torch not compiled with CUDA", "No CUDA GPUs are available",
            "CUDA driver initialization failed")


def _run_forward(config: ModelConfig, forward: Callable[[], Any], what: str,
                 device: torch.device | None = None, switched: torch.nn.Module | None = None) -> Any:
    """The forward's output; a UsageError naming the model where it raises or runs on 'meta'. `switched`: the
    model, where the builder returned it in training mode and it runs in eval mode: a forward that raises is tried
    once in training mode, and the error says so where only eval mode fails."""
    try:
        with torch.no_grad():
            out = forward()
    except ModelExited as e:
        raise _model_exited(config, what, e) from e
    except Exception as e:
        text = str(e)
        if device is not None and device.type != "cuda" and (
                any(s in text for s in _NO_CUDA)
                or ("Expected all tensors to be on the same device" in text and "cuda" in text)):
            raise UsageError(f"{config.path}: the model's {what} forward asks for CUDA while it runs on {device} "
                             f"({_one_line(e)}): a device written into the forward (device=\"cuda\", .cuda()); "
                             "make its tensors on its inputs' device (x.device), or capture on a GPU "
                             "(--device cuda)") from e
        if any(s in text for s in _NEEDS_GRAD):
            raise UsageError(f"{config.path}: the model's {what} forward takes gradients ({_one_line(e)}), and "
                             "Kernel Forge runs forwards under torch.no_grad() (inference): wrap the part of the "
                             "forward that calls torch.autograd.grad or .backward() in "
                             "`with torch.enable_grad():`") from e
        # A forward that works only in training mode (a detector wrapped to sum its losses) fails in eval mode,
        # where its own code expects another output: that the mode was switched is what the user needs to know.
        mode = ("; Kernel Forge ran it in eval mode, and the builder returned it in training mode, where it runs: a "
                "forward that works only in training mode (a detector's losses) cannot be captured, capture its "
                "inference forward" if switched is not None and _runs_in_training(switched, forward) else "")
        raise UsageError(f"{config.path}: the model raised during its {what} forward: "
                         f"{_one_line(e)}{mode}; fix the model or its [params] (--debug shows the traceback)") from e
    with contextlib.suppress(TypeError):  # no tensor in the output: the captured forward notes it
        if output_tensor(out).is_meta:
            raise UsageError(f"{config.path}: the model's output is on the 'meta' device (no data): its example "
                             "inputs are meta tensors; Kernel Forge runs the model on real data: create them on the "
                             "`device` the builder is passed")
    return out


# What autograd raises where a forward takes gradients (torch.autograd.grad, .backward(): a force field's forces,
# a gradient penalty) of tensors made under torch.no_grad(), which runs without torch.no_grad().
_NEEDS_GRAD = ("does not require grad and does not have a grad_fn", "One of the differentiated Tensors does not "
               "require grad")


# Elements of the output kept to compare two forwards: enough to see a changed input, few enough for an LM's logits.
_PROBE_ELEMENTS = 1 << 16


def _output_probe(out: Any) -> torch.Tensor | None:
    """Evenly spaced elements of the forward's output tensor, in float64 (None where it holds no tensor)."""
    try:
        t = output_tensor(out).detach()
    except TypeError:
        return None
    with torch.no_grad():
        flat = (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)
        if flat.numel() > _PROBE_ELEMENTS:
            idx = torch.arange(_PROBE_ELEMENTS, device=flat.device) * (flat.numel() - 1) // (_PROBE_ELEMENTS - 1)
            flat = flat[idx]
        return flat.double().cpu()


def _repeat_note(first: torch.Tensor | None, again: torch.Tensor | None) -> str | None:
    """What the capture says where the warm-up's and the captured forward's outputs differ: export's whole-model
    check would refuse the model for it, after a whole run on the GPU."""
    from engine.bench.agreement import unrepeatable

    if first is None or again is None:
        return None
    why = ("not repeatable: its two forwards here gave outputs of other shapes" if first.shape != again.shape
           else unrepeatable(first, again))
    if why is None:
        return None
    return (f"the model's output is {why}; export's whole-model check cannot vouch for a cast on such a model: "
            "make the forward repeatable on the builder's inputs (no in-place change of its inputs or buffers, "
            "no random numbers)")


def _call_shapes(calls: Any) -> Counter:
    """The calls a traced forward made, each as its op and the shapes of its tensor arguments (views aside)."""
    def shapes(a: dict[str, Any]) -> Any:
        if a.get("kind") == "tensor":
            return tuple(a.get("shape") or ())
        if a.get("kind") == "tensor_list":
            return tuple(None if d is None else tuple(d.get("shape") or ()) for d in a.get("items") or ())
        return None

    return Counter((c.op, tuple(shapes(a) for a in c.signature.get("args", ()))) for c in calls if not c.view)


def _calls_note(warm: Counter | None, captured: Counter | None) -> str | None:
    """What the capture says where its two forwards on the same inputs made other calls (other ops, or the same
    ops on other shapes): the model keeps state across forwards (a KV cache that grows on every call, a step
    counter that picks a branch), so the cards, taken from its second forward, are not what its next forwards
    call, and the run and export call it many more times."""
    if warm is None or captured is None:
        return None
    new = captured - warm
    if not new:   # at most calls of the first forward alone: a one-time set-up (a table built on the first call)
        return None
    gone = warm - captured
    (op, args), _ = next(iter(new.items()))
    shown = ", ".join("[" + ",".join(map(str, a)) + "]" if a and all(isinstance(d, int) for d in a)
                      else "[" + ", ".join("[" + ",".join(map(str, d)) + "]" for d in a if d is not None) + "]"
                      for a in args if a is not None)
    return (f"the model's two forwards on the same inputs made other calls ({sum(new.values())} call(s) of the "
            f"second were not in the first, {sum(gone.values())} of the first not in the second; e.g. {op} on "
            f"{shown or 'no tensor'}, made in the second and not the first): it keeps state across forwards (a KV "
            "cache or buffer that grows on every call, a counter that picks another branch), so the cards, taken "
            "from the second forward, are not what later forwards call, and the run and export call it many times "
            "more; make the builder's forward the same on every call (reset state at the start of forward; a cache "
            "passed in as an input that the forward appends to, as transformers' DynamicCache, grows on every call "
            "too: rebuild or copy it inside forward)")


def _top_level_note(calls: Any) -> str | None:
    """What the capture says where much of the forward's memory-bound work runs in the model's own forward,
    outside any submodule (a flat model): chain cards (one kernel for a run of pointwise ops) are made only of
    calls inside submodules (engine.capture.chains), so such a model gets none, and nothing said why."""
    from engine.capture.recorder import TOP_LEVEL

    def nbytes(c: Any) -> int:   # what the call reads, by its signature
        descs = [d for a in c.signature.get("args", ()) for d in
                 ([a] if a.get("kind") == "tensor" else a.get("items") or [] if a.get("kind") == "tensor_list" else [])
                 if d and d.get("shape") is not None and not d.get("absent")]
        return sum(math.prod(d["shape"]) * getattr(torch, d["dtype"]).itemsize for d in descs)

    memory = [c for c in calls if not c.compute and not c.view]
    top = [c for c in memory if c.path in (TOP_LEVEL, "")]
    made = {v for c in top for v in c.writes}
    linked = [c for c in top if any(v in made for _, v in c.reads)]   # reads another such call's output
    if not linked:
        return None
    top_bytes, all_bytes = sum(nbytes(c) for c in top), sum(nbytes(c) for c in memory)
    if all_bytes == 0 or top_bytes < all_bytes / 4:   # a mask made at the top (transformers'), a final scale
        return None
    return (f"{len(top)} of the forward's {len(memory)} memory-bound calls ({100 * top_bytes / all_bytes:.0f} % of "
            "their bytes read), run in the model's own forward, outside any submodule, one after another: chain "
            "cards, one kernel for a run of such calls, are made only of calls inside submodules, so these have "
            "none; in your own model, move that code into a submodule (an nn.Module of its own, called from the "
            "forward) to get them")


def _degenerate_note(out: torch.Tensor) -> str | None:
    """What the capture says where the model's output is degenerate on the builder's inputs (a batch of 0, a head
    that starts at zero, NaN): export's whole-model check, after a whole run on the GPU, would find that agreement
    with it proves nothing."""
    from engine.bench.agreement import degenerate

    with torch.no_grad():
        why = degenerate(out.detach())
    if why is None:
        return None
    return (f"the model's output, of shape {list(out.shape)}, is {why}: export's whole-model check cannot tell from "
            "it whether a cast changes the model's output; give the builder inputs and weights that make an output "
            "of varied, finite values")


def _integer_note(out: torch.Tensor) -> str | None:
    """What the capture says where the output tensor export's whole-model check compares holds integers or booleans
    (labels, token ids, a mask: `argmax`, `topk` indices, a comparison): a kernel within its rounding tolerance
    flips one where two scores are close, which the check reads as a large error (relative L2 of label values)."""
    if out.is_floating_point() or out.is_complex():
        return None
    return (f"the output tensor export's whole-model check compares (the output's first tensor, depth first) holds "
            f"{dtype_name(out.dtype)} values (labels, indices or a mask, as argmax or a comparison gives): a kernel "
            "within its rounding tolerance can flip one where two scores are close, and the check reads that as a "
            "large error; return the float scores they come from first")


def _returned_as_is_note(out: torch.Tensor, target: Any) -> str | None:
    """What the capture says where the output tensor export's whole-model check compares is one of the example
    inputs, or a parameter or buffer, that the forward returns as it is (`return x, y`): no cast changes it, so
    the check would read agreement whatever a cast did to the rest of the model."""
    def plain(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_nested and t.numel() > 0

    if not plain(out):
        return None
    key = storage_key(out)
    held = [*(("one of the builder's example inputs", t) for t in _tensors_in(target.inputs, 0)),
            *((f"the model's '{name}'", t) for name, t in [*target.module.named_parameters(),
                                                           *target.module.named_buffers()])]
    what = next((what for what, t in held if plain(t) and storage_key(t) == key), None)
    if what is None:
        return None
    return (f"the output tensor export's whole-model check compares (the output's first tensor, depth first) is "
            f"{what}, returned as it is: no cast changes it, so that check would read agreement whatever a cast "
            "did to the model; return the tensor the model computes first")


def _runs_in_training(model: torch.nn.Module, forward: Callable[[], Any]) -> bool:
    """Whether the forward runs with `model` in training mode (it is put back in eval mode after)."""
    try:
        model.train()
        with torch.no_grad():
            forward()
        return True
    except Exception:  # noqa: BLE001 - any failure: the mode is not what made it fail
        return False
    finally:
        model.eval()


def _tensors_in(v: Any, depth: int) -> list[torch.Tensor]:
    """The tensors in example inputs: a tensor, or tuples, lists and dicts of them (not into other objects)."""
    if isinstance(v, torch.Tensor):
        return [v]
    if depth > 32:
        return []
    items = v.values() if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else ()
    return [t for x in items for t in _tensors_in(x, depth + 1)]


def _captured_forward_failed(config: ModelConfig, target: Any, what: str, e: BaseException) -> UsageError:
    """The error for a forward that raised under capture after the model's own forward ran: a Kernel Forge bug,
    unless the model raises again without capture (it changes its state between forwards: a cache that fills
    up, a counter with a limit), which is the model's doing. A sys.exit in the forward is the model's doing."""
    if isinstance(e, ModelExited):
        return _model_exited(config, what, e)
    try:
        with torch.no_grad():
            target.forward()
    except Exception as again:  # noqa: BLE001 - any failure of a plain forward is the model's
        return UsageError(f"{config.path}: the model raised during the {what} forward, and again without capture: "
                          f"{_one_line(again)}; it changes its state between forwards, and Kernel Forge runs its "
                          "forward several times on the same inputs: make the builder's forward repeatable")
    return UsageError(f"{config.path}: the model raised during the {what} forward: {_one_line(e)}; it runs "
                      "without capture, so this is likely a Kernel Forge bug: please report it with --debug output")


def _model_exited(config: ModelConfig, what: str, e: ModelExited) -> UsageError:
    return UsageError(f"{config.path}: {e} during its {what} forward; a forward returns the model's output: take "
                      "the sys.exit out of the forward and the code it calls")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _to_card(t: CardTally, total_us: float) -> OperatorCard:
    return OperatorCard(
        card_id=t.id, op=t.op, signature=t.signature, signature_text=signature_text(t.signature),
        calls=t.weighted_calls, captured_calls=t.calls,
        share=(t.weighted_us() / total_us) if total_us > 0 else 0.0, bytes=t.bytes,
        module_paths=t.module_paths, outputs=t.outputs, capture_us=t.mean_us(), samples=t.samples,
        output_varies=t.output_varies,
    )


def capture_model(config: ModelConfig, device: torch.device, workspace: Path, *,
                  samples: int | None = None, progress: Progress = lambda msg: None,
                  chains: bool = True, wide_compute: bool | None = None,
                  held: contextlib.ExitStack | None = None) -> CaptureResult:
    """Build the model, warm it up, capture one forward, and write samples under the workspace.

    With `chains`, the captured forward is also traced for chains of memory-bound calls, which become
    chain cards; their samples are taken in the captured forward as planned from the traced warm-up, or
    where the two forwards differ, in one more forward (engine.capture.chain_cards says how).
    Samples go to a `.partial-*` folder that is renamed only when the capture succeeded, so a failed
    or interrupted capture leaves nothing that looks complete. The caller stores the cards. This process holds
    the folder's lock (engine.store.sample_folders) while it writes it, and with `held` until that stack
    closes (the caller has stored or removed the samples); without, until this returns.
    `wide_compute` (default: on a CPU without native instructions for the model's half-precision dtype)
    computes its convolutions and large matmuls in float32; the cards are the same
    (engine.capture.wide_compute says why).
    """
    t_start = time.perf_counter()
    capture_id = f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    progress(f"building {config.name} on {device.type} ({dtype_name(config.dtype_for(device.type))}"
             f"{', small' if config.small else ''})")
    target = build_target(config, device)
    with contextlib.suppress(NotImplementedError):   # a torch.export program's module: build_target noted it
        target.module.eval()
    t_built = time.perf_counter()
    dtype = config.dtype_for(device.type)
    # What the model is in, which the builder decides: one that takes no `dtype` argument builds float32
    # whatever the config says, and the header said the config's dtype over float32 cards.
    floats = [p.dtype for p in target.module.parameters() if p.is_floating_point()]
    built = max(set(floats), key=floats.count) if floats else dtype
    built_note = None
    if built != dtype:
        built_note = (f"the config asks {dtype_name(dtype)} on {device.type} ([dtype]) and the builder made the "
                      f"model's parameters {dtype_name(built)}: does it take a `dtype` argument?")
        dtype = built
    if wide_compute is None:
        wide_compute = widens(device, dtype)
    # Entered before (below) the capture's modes: they see each call as the model makes it.
    wide = WideCompute(target.module.parameters()) if wide_compute else None
    below = wide if wide is not None else contextlib.nullcontext()
    if wide is not None:
        progress(f"{dtype_name(dtype)} convolutions and large matmuls computed in float32 on this CPU "
                 "(the cards are those of the real calls)")
    k = config.samples if samples is None else samples
    budget, total_budget = config.sample_budget_mb << 20, config.total_sample_budget_mb << 20
    paths = ModulePaths(target.module, target.multiplicity)
    progress("warm-up forward" + (" (traced for chains)" if chains else ""))
    # The warm-up's trace plans the chain samples, so the captured forward can take them (chain_cards says how).
    warm_trace = MemberTrace(paths.current, None, entered=paths.entered) if chains else None
    with paths, below, (warm_trace if warm_trace is not None else contextlib.nullcontext()):
        warm_out = _run_forward(config, target.forward, "warm-up", device,
                                switched=target.module if target.notes.get("eval mode", "").startswith(
                                    "the builder returned") else None)
    warm_probe = _output_probe(warm_out)  # outside the trace: its own ops are no part of the model
    del warm_out
    _sync(device)
    t_warm = time.perf_counter()
    write_s = 0.0

    samples_root = samples_dir(workspace)
    partial = samples_root / f"{PARTIAL_PREFIX}{capture_id}"
    final = samples_root / capture_id
    # Sample files are written (and hashed) on a background thread while the forward computes.
    # The model's parameters and buffers are referenced, not copied, until written; those a tiled random fill
    # made (a reference model's weights) are stored as one period where their bytes still repeat.
    state = [*target.module.parameters(), *target.module.buffers()]
    writer = SampleWriter(frozenset(storage_key(t) for t in state),
                          periods={storage_key(t): p for t in state if (p := fill_period(t)) is not None})
    del state
    lock: SampleFolderLock | None = None
    try:
        # Inside: a stop that lands right after it still removes the folder. Locked from its creation: another
        # capture's sweep_partials, prune and the TUI then know that a live process writes it.
        lock = SampleFolderLock.create(partial)
        if held is not None:
            held.callback(lock.release)

        def sink(tally: CardTally, idx: int, snap: Snapshot, meta: dict[str, Any]) -> int:
            nonlocal write_s
            t0 = time.perf_counter()
            if wide is not None and wide.widened_last(meta["op"]):
                meta = {**meta, "compute": "float32"}  # its outputs are float32 results, rounded
            try:
                return writer.submit(partial / f"{tally.id}.{idx}.safetensors", snap, meta)
            finally:
                write_s += time.perf_counter() - t0

        early = None  # the chain samples planned from the warm-up, taken during the captured forward
        warm_calls = None if warm_trace is None else _call_shapes(warm_trace.calls)
        if warm_trace is not None:
            planned = chain_cards(warm_trace, target.module, paths.weight, 0.0, samples=k,
                                  sample_budget_bytes=budget, total_budget_bytes=total_budget)
            if planned.planned:
                early = ChainSampling(planned, warm_trace.calls, partial, target.module, writer)
            del warm_trace, planned
        progress(f"capturing one forward (up to {k} samples per card"
                 + (f"; {len(early.found.planned)} chain instances" if early is not None else "") + ")")
        mode = CaptureMode(path_of=paths.current, weight_of=paths.weight, samples=k,
                           sample_budget_bytes=budget, sink=sink, use_cuda_events=device.type == "cuda",
                           total_budget_bytes=total_budget, progress=progress, before_write=writer.before_write)
        # The trace is entered after the capture, so it sees each call first and the capture's timed
        # region around the op holds none of the trace's bookkeeping.
        trace = None
        if chains:
            trace = (MemberTrace(paths.current, mode, entered=paths.entered) if early is None
                     else CapturingSampler(paths.current, mode, early, entered=paths.entered))
        with paths, (early.hooks(trace) if early is not None else contextlib.nullcontext()):
            try:
                with torch.no_grad(), below, mode, (trace if trace is not None else contextlib.nullcontext()):
                    output = target.forward()
            except Exception as e:
                raise _captured_forward_failed(config, target, "captured", e) from e
        _sync(device)
        t_captured = time.perf_counter()
        repeat_note = _repeat_note(warm_probe, _output_probe(output))
        try:
            first = output_tensor(output)
            output_note = _degenerate_note(first) or _returned_as_is_note(first, target) or _integer_note(first)
            del first
        except TypeError:
            kind = type(output).__name__
            what = "None" if output is None else f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} with no tensor in it"
            output_note = (f"the forward returns {what}: export's whole-model check has nothing to compare (return "
                           "the model's output tensor)")
        del output
        if early is not None:
            write_s += early.write_s
        queue_s = write_s  # queueing samples during the captured forward (copies of what it may change)
        progress(f"captured {mode.ops} ops into {len(mode.cards)} cards, "
                 f"{mode.total_sample_bytes / 1e6:.0f} MB of samples ({writer.file_bytes / 1e6:.0f} MB of files so far)")
        total_us = sum(t.weighted_us() for t in mode.cards.values())
        cards = sorted((_to_card(t, total_us) for t in mode.cards.values()),
                       key=lambda c: (-c.share, c.op, c.card_id))
        chain_list, chain_notes, t_chains = [], {}, time.perf_counter()
        calls_note = top_note = None
        if trace is not None:
            calls_note = _calls_note(warm_calls, _call_shapes(trace.calls))
            top_note = _top_level_note(trace.calls)
            trace.resolve_times()
            # Chain samples have a total budget of their own, the one the warm-up planned them with: were it
            # what the op samples left, the captured forward's plan would be smaller than the warm-up's whenever
            # the op samples took much of it (Gemma's), those samples would be dropped and one more forward
            # taken; and as the plan spends it in order of measured time, which instances were kept varied
            # from run to run.
            found = chain_cards(trace, target.module, paths.weight, total_us, samples=k,
                                sample_budget_bytes=budget, total_budget_bytes=total_budget)
            chain_list = found.cards
            written = None
            if early is not None:
                # The captured forward's own plan decides; the early samples stand only where they are its.
                written = early.finish(trace, found) if found.planned else early.discard()
            if found.planned and written is None:
                progress(f"sampling {len(found.planned)} chain instances of {len(chain_list)} chain cards "
                         "(one more forward)")
                writer.flush()  # no capture below this forward waits for the queued files before a write
                try:
                    with below:
                        written = sample_chains(target.forward, found, trace.calls, partial, model=target.module)
                except Exception as e:
                    raise _captured_forward_failed(config, target, "chain-sampling", e) from e
                _sync(device)
            if found.planned:
                chain_list = [dataclasses.replace(c, samples=written.get(c.card_id, 0)) for c in chain_list]
            chain_notes = found.notes
            del trace  # the trace holds weak references only, but its call list is large
        t_chains = time.perf_counter() - t_chains
        t0 = time.perf_counter()
        writer.close()
        write_s += time.perf_counter() - t0
        lock.rename(final)
    except BaseException:
        with contextlib.suppress(BaseException):  # what the writer raised, if anything, comes second
            writer.close()
        shutil.rmtree(partial, ignore_errors=True)
        if lock is not None and held is None:
            lock.release()
        raise
    if held is None:
        lock.release()
    notes = {**{k: str(v) for k, v in target.notes.items()}, **chain_notes}
    if output_note:
        notes["model output"] = output_note
    if repeat_note:
        notes["repeatable"] = repeat_note
    if calls_note:
        notes["calls"] = calls_note
    if top_note:
        notes["chains"] = top_note
    if built_note:
        notes["dtype"] = built_note
    if mode.skipped.get("nested"):
        notes["nested"] = (
            f"{mode.skipped['nested']} calls took or made nested tensors (rows of several lengths), which no kernel "
            "takes, so they are not cards: nn.TransformerEncoder makes one of a batch with a src_key_padding_mask in "
            "eval; build it with enable_nested_tensor=False for cards of its layers' ops")
    quantized = mode.skipped.get("packed", 0) + mode.skipped.get("quantized", 0)
    if quantized:
        # A dynamically quantized MLP showed its one ReLU card at 100 % of the model's time, and nothing about the
        # linears that are almost all of it.
        notes["quantized"] = (
            f"{quantized} calls take a packed weight or a quantized tensor (torch.ao's quantized Linear and "
            "convolution), which no kernel reads, so they are not cards, and the shares count the cards' calls "
            "only; torch.ao's quantized ops run on the CPU, so on a GPU this model does not run as built")
    if mode.skipped.get("data-dependent"):
        notes["data-dependent"] = (
            f"{mode.skipped['data-dependent']} calls return a shape that depends on their input values (nonzero, "
            "unique, masked_select, x[mask], bincount, a detector's nms): a kernel writes outputs of one shape, so they are not "
            "cards; the calls after them take shapes these values chose, so a detector's cards depend on the input")
    if mode.skipped.get("random"):
        notes["random"] = (
            f"{mode.skipped['random']} calls draw random numbers (dropout with training=True, bernoulli, multinomial, "
            "exponential_, normal): a kernel cannot draw the numbers eager draws, so no candidate could match them and "
            "they are not cards; the shares count the cards' calls only")
    if wide is not None:
        half = dtype_name(dtype)
        notes["cpu compute"] = (
            f"{half} convolutions and large matmuls/attention computed in float32 and returned in {half} with "
            f"the real call's layout ({wide.widened} calls over the capture's forwards, {wide.kept} ran as they "
            f"are): this CPU has no native {half}. Cards are those of the real calls; their samples' outputs are "
            "float32 results, rounded (sample header: compute=float32)")
    if target.multiplicity:
        notes["multiplicity"] = ", ".join(f"{k}×{v}" for k, v in target.multiplicity.items())
    folded: dict[str, str] = {}
    if folds_wanted(getattr(config, "conv_bias_folds", "auto"), device.type, cards):
        folds = conv_bias_folds(chain_list, cards)
        if folds:
            # before the twins: a folded card's channels-last twin is the one torch.compile hands its input as held
            folded = {f.card_id: plain for plain, f in folds.items()}
            chain_list = [*chain_list, *folds.values()]
            notes["conv-bias folds"] = (
                f"{len(folds)} GroupNorm -> SiLU chain card(s) also with the bias add of the convolution before them "
                "in front (`add` of [1, C, 1, 1]), which torch.compile splits off the convolution: where the "
                "GroupNorm is the convolution output's only reader (inputs derived from the chain's samples, share "
                "counted there; engine/capture/folds.py)")
    twins: dict[str, str] = {}
    if twins_wanted(getattr(config, "layout_twins", "auto"), device.type, cards):
        found = channels_last_twins(cards)
        found_chains = channels_last_twins(chain_list)
        if found or found_chains:
            twins = {t.card_id: orig for orig, t in [*found.items(), *found_chains.items()]}
            cards = sorted([*cards, *found.values()], key=lambda c: (-c.share, c.op, c.card_id))
            chain_list = [*chain_list, *found_chains.values()]
            of_folds = sum(orig in folded for orig in found_chains)
            notes["channels-last twins"] = (
                f"{len(found)} GroupNorm or upsampling card(s) and {len(found_chains) - of_folds} GroupNorm -> SiLU "
                f"chain card(s){f' and {of_folds} conv-bias folded one(s)' if of_folds else ''} also as "
                "channels-last input, the layout torch.compile or a layout route hands them after a convolution "
                "(same values and samples; engine/capture/twins.py)")
    cards, hidden = with_hidden_calls(cards, device.type, twins_wanted(
        getattr(config, "layout_twins", "auto"), device.type, cards), notes)
    return CaptureResult(
        capture_id=capture_id, model=config.name, device=device.type,
        dtype=dtype_name(dtype), small=config.small,
        wall_s=time.perf_counter() - t_start, cards=cards, skipped=dict(mode.skipped), notes=notes,
        sample_dir=str(final.relative_to(workspace)), chains=chain_list, sample_digests=dict(writer.digests),
        twins=twins, hidden=hidden, folded=folded,
        phases={"build": t_built - t_start, "warm-up": t_warm - t_built,
                "captured forward": t_captured - t_warm - queue_s, "writing samples": write_s,
                "chain samples": t_chains},
    )


def with_hidden_calls(cards: list[OperatorCard], device_type: str, channels_last: bool,
                      notes: dict[str, str]) -> tuple[list[OperatorCard], dict[str, str]]:
    """The cards with the hidden calls of a CUDA capture added (engine.capture.hidden; with `channels_last`,
    their channels-last forms too), by share, and hidden card id -> the card that makes the call; a note says so."""
    if device_type != "cuda":
        return cards, {}
    found = hidden_cards(cards, channels_last=channels_last)
    if not found:
        return cards, {}
    notes["hidden calls"] = (
        f"{len(found)} card(s) of the bias add each CUDA convolution makes after cuDNN (`add_` of [1, C, 1, 1] "
        "into its output), which the capture does not see: same samples as their convolution, share counted "
        "there (engine/capture/hidden.py)")
    return (sorted([*cards, *found.values()], key=lambda c: (-c.share, c.op, c.card_id)),
            {c.card_id: c.signature["hidden_in"]["card"] for c in found.values()})


def discard_samples(workspace: Path, result: CaptureResult) -> None:
    """Remove a capture's sample folder (when storing its cards failed)."""
    shutil.rmtree(workspace / result.sample_dir, ignore_errors=True)


def sweep_partials(workspace: Path) -> None:
    """Remove sample folders left by captures that were killed before they finished: `.partial-*` folders
    whose lock no process holds (one without a lock file once unchanged for a while: capture_writing says)."""
    root = samples_dir(workspace)
    if root.is_dir():
        for p in root.glob(f"{PARTIAL_PREFIX}*"):
            if capture_writing(p) is None:
                shutil.rmtree(p, ignore_errors=True)


