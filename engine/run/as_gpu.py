"""A CPU capture's cards as the GPU would call them, for a dry run that prepares kernels for a GPU.

A capture on the CPU records the CPU's calls. Three things differ on CUDA, and each is fixed here:

- **Outputs.** Some ops give other output dtypes, shapes or strides on CUDA (`native_layer_norm`'s
  mean/rstd are float32 there and the input dtype on the CPU; `native_batch_norm` in eval returns
  float32 `[C]` statistics on CUDA and empty ones in the input dtype on the CPU). The outputs are
  recomputed by calling the op on fake CUDA tensors (meta storage, device `cuda`: PyTorch's meta kernels
  then follow CUDA's rules, no GPU needed); `CUDA_OUTPUT_OVERRIDES` holds the ops where they do not.
- **Ops.** CPU-only ops (`_scaled_dot_product_flash_attention_for_cpu`, mkldnn ops) are not what the
  GPU runs: their cards are not proposed, with `CPU_ONLY` as the stated reason.
- **Shares.** The CPU's wall clock is not the GPU's (fp16 convolutions take nearly all of it on a CPU).
  Shares are re-estimated from a roofline on the target GPU: max(bytes / bandwidth, FLOPs / peak).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from engine.bench.floor import card_flops, operand_dtypes, peak_flops
from engine.capture.fake_outputs import fake_outputs
from engine.cards import OperatorCard, chain_cover
from engine.propose.base import Hardware

CPU_ONLY = "cpu-only op: the GPU runs a different op"

# Boost clocks (Hz) by arch, for the compute bound of a named GPU (a profile carries no clock): the
# published boost clock of each profile's GPU (H200/H100 1.98 GHz, A100 1.41, L40S 2.52, RTX 4090 2.52,
# B200 1.965, RTX 5090 2.41, GB10 ~2.5). An estimate for scheduling only, never a floor.
_CLOCK_HZ = {"sm_80": 1.41e9, "sm_86": 1.70e9, "sm_89": 2.52e9, "sm_90": 1.98e9, "sm_100": 1.965e9,
             "sm_120": 2.41e9, "sm_121": 2.5e9}
_DEFAULT_CLOCK_HZ = 1.8e9

_CPU_ONLY_MARKS = ("_for_cpu", "mkldnn", "onednn", "_mkl_", "nnpack")


def is_cpu_only(op_name: str) -> bool:
    """An op the GPU never runs: named for the CPU (mkldnn, `_for_cpu`), or without a CUDA kernel.

    A PyTorch built without CUDA (a `+cpu` wheel) registers no CUDA kernel for any op: there only the name
    tells, else relu, batch norm and most of a model read 'cpu-only op' and a dry run proposed for none of them."""
    import torch

    base = op_name.split("::", 1)[-1]
    if any(mark in base for mark in _CPU_ONLY_MARKS):
        return True
    if not torch.backends.cuda.is_built():
        return False
    try:
        return not torch._C._dispatch_has_computed_kernel_for_dispatch_key(op_name, "CUDA")
    except RuntimeError:  # an op this PyTorch does not know: leave it to the proposer
        return False


def _on_cuda(sig: Any) -> Any:
    """The same description with every device 'cpu' made 'cuda'."""
    if isinstance(sig, dict):
        return {k: ("cuda" if k == "device" and v == "cpu" else _on_cuda(v)) for k, v in sig.items()}
    if isinstance(sig, list):
        return [_on_cuda(x) for x in sig]
    return sig


def _cudnn_attention(signature: dict[str, Any], outs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The meta kernel always returns a float32 logsumexp; CUDA returns none unless compute_log_sumexp
    # (the H200 capture of SD3.5 records output, philox seed, philox offset).
    wants = next((a.get("value") for a in signature["args"] if a["name"] == "compute_log_sumexp"), True)
    if wants or len(outs) < 2 or outs[1]["dtype"] != "float32":
        return outs
    return [outs[0], *outs[2:]]


# Ops whose meta kernel does not follow CUDA's rule, and CUDA's outputs: (signature, meta's outputs) ->
# outputs. Each entry is checked against the H200 captures in docs/results/capture-h200
# (tests/test_dry_run_gpu_cards.py), which also show that every other op the shipped models call needs none.
CUDA_OUTPUT_OVERRIDES: dict[str, Callable[[dict[str, Any], list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "aten::_scaled_dot_product_cudnn_attention": _cudnn_attention,
}


def _keep_unit_strides(outs: list[dict[str, Any]], captured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where an output differs from the captured one only in the stride of size-1 dimensions (which
    address nothing), keep the captured strides: TensorIterator picks them the same way on CPU and CUDA,
    the meta kernels differently."""
    kept = []
    for i, o in enumerate(outs):
        c = captured[i] if i < len(captured) else None
        if (c and c["dtype"] == o["dtype"] and c["shape"] == o["shape"] and len(c["stride"]) == len(o["stride"])
                and all(a == b or n == 1 for a, b, n in zip(o["stride"], c["stride"], o["shape"]))):
            o = {**o, "stride": list(c["stride"])}
        kept.append(o)
    return kept


def _nbytes(descs: list[dict[str, Any]]) -> int:
    """Bytes the described outputs hold (dense: what writing each once costs)."""
    import math

    return sum(math.prod(d["shape"]) * _itemsize(d["dtype"]) for d in descs if d and d.get("shape") is not None)


def _itemsize(dtype: str) -> int:
    import torch

    return getattr(torch, dtype).itemsize


@dataclasses.dataclass(frozen=True)
class GpuCard:
    """A CPU card made a GPU card: the row to build it from and, for a CPU-only op, why it is not proposed."""

    row: dict[str, Any]
    not_proposed: str | None = None
    outputs_changed: bool = False


def gpu_row(row: dict[str, Any]) -> GpuCard:
    """A CPU capture's card row as the GPU calls it: devices 'cuda', outputs by CUDA's rules, the bytes of
    one call adjusted to those outputs; a CPU-only op keeps its outputs and says it is not proposed."""
    sig = _on_cuda(row["signature"])
    captured = _on_cuda(list(row.get("outputs") or []))
    if is_cpu_only(row["op"]):
        return GpuCard({**row, "signature": sig, "outputs": captured}, not_proposed=CPU_ONLY)
    outs = fake_outputs(row["op"], sig, captured)
    if outs is not None and row["op"] in CUDA_OUTPUT_OVERRIDES:
        outs = CUDA_OUTPUT_OVERRIDES[row["op"]](sig, outs)
    if outs is None:
        return GpuCard({**row, "signature": sig, "outputs": captured})
    outs = _keep_unit_strides(outs, captured)
    changed = [(o["dtype"], o["shape"], o["stride"]) for o in outs] != \
        [(o["dtype"], o["shape"], o["stride"]) for o in captured]
    nbytes = int(row.get("bytes") or 0)
    if changed and nbytes:
        nbytes = max(0, nbytes - _nbytes(captured) + _nbytes(outs))
    return GpuCard({**row, "signature": sig, "outputs": outs, "bytes": nbytes}, outputs_changed=changed)


def estimated_us(card: OperatorCard, hardware: Hardware) -> float:
    """Roofline time of one call on `hardware`, in µs: max(bytes / bandwidth, FLOPs / peak)."""
    memory = card.bytes / hardware.bandwidth_bps if hardware.bandwidth_bps > 0 else 0.0
    compute = 0.0
    flops = card_flops(card.op, card.signature)
    if flops:
        clock = _CLOCK_HZ.get(hardware.arch, _DEFAULT_CLOCK_HZ)
        rates = [peak_flops(hardware.arch, hardware.sms, clock, d) for d in operand_dtypes(card.op, card.signature) or ()]
        rates = [r for r in rates if r]
        if rates:
            compute = flops / max(rates)
    return max(memory, compute) * 1e6


def gpu_shares(cards: list[OperatorCard], hardware: Hardware) -> list[OperatorCard]:
    """The cards with `share` re-estimated as their fraction of the model's roofline time on `hardware`
    (calls × one call's estimate); unchanged when no card has an estimate. The model's time is its op
    cards'; a chain card's share is what its calls are of its members' (`engine.cards.chain_cover`)."""
    spent = [0.0 if c.chain is not None else max(1, c.calls) * estimated_us(c, hardware) for c in cards]
    total = sum(spent)
    if total <= 0:
        return list(cards)
    out = [dataclasses.replace(c, share=s / total) for c, s in zip(cards, spent)]
    held: dict[str, float] = {}
    for by_chain in chain_cover(out).values():
        for chain_id, s in by_chain.items():
            held[chain_id] = held.get(chain_id, 0.0) + s
    return [dataclasses.replace(c, share=held.get(c.card_id, 0.0)) if c.chain is not None else c for c in out]
