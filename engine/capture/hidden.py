"""Hidden calls: cards for ATen calls PyTorch's own kernels make below the capture.

The capture records what the model calls (a TorchDispatchMode sees `aten::convolution`); what that call's CUDA
kernel calls through the dispatcher in turn, it does not see. One such call costs real time: on CUDA,
`aten::convolution` runs cuDNN without the bias and then adds it in a separate `output.add_(bias.reshape(1, C,
1, 1))` (ATen's `_convolution`, the cuDNN and MIOpen paths), through PyTorch's non-vectorised broadcast kernel at
about half the rate of a copy of the same bytes. On sd35_medium's VAE decode that was 63 launches and 7.3 ms of
its 52 ms of kernel time (H100, docs/results/sd35-layout-2026-12-06d/).

A cast's route sits at the CUDA dispatch key, so it serves such a call like any other: it needs only a card
whose signature is the hidden call's. For each convolution card with a bias, captured on CUDA, this adds one:
`aten::add_.Tensor` of the convolution's output (its captured layout) and the bias as `[1, C, 1, ...]`, the
signature naming the convolution card (`hidden_in`). Where layout twins are wanted (a convolutional CUDA
capture, engine.capture.twins), also the same with a channels-last output: what a layout route's convolutions
hand it. The card shares the convolution card's samples: its `self` is the convolution's output, its `other`
the bias (`engine.capture.samples.load_sample`). Its calls are the convolution's, and so is its time: its share
is the convolution card's (an upper bound), not counted twice in totals. Convolutions of other inputs can make
the same call (a 256 -> 128 and a 128 -> 128 convolution both add a bias into bf16[1,128,1024,1024]): that is
one card, its calls and share the sum of theirs, its samples the first one's, its signature naming them all
(`hidden_in.cards`). Two cards of one call would share a guard key, and a cast routes only the first.

Not every CUDA convolution takes that path (a depthwise one may go to a kernel that adds the bias itself, a
transposed one to cuDNN's transpose with the same add): a card whose call never comes is never hit, and the
export's whole-model check keeps only what made the model faster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from engine.capture.signature import card_id, contiguous_strides, dense_order, signature_text
from engine.capture.twins import channels_last_strides
from engine.cards import OperatorCard, call_of, hidden_makers, hidden_part

HIDDEN_OP = "aten::add_.Tensor"
CONVOLUTION = "aten::convolution"
_FLOATS = ("float32", "float16", "bfloat16")
_HOW = "convolution bias"   # engine.capture.samples.hidden_args derives its arguments


def _arg(card: OperatorCard, name: str) -> dict[str, Any] | None:
    return next((a for a in card.signature.get("args", []) if a.get("name") == name), None)


def bias_card(card: OperatorCard, channels_last: bool = False) -> OperatorCard | None:
    """The `add_` of `card`'s bias into its output (a convolution card captured on CUDA with a bias), the output
    laid out as captured, or channels-last with `channels_last`; None where the card is not such a call, or has
    no samples or no recorded output to derive it from."""
    if card.op != CONVOLUTION or not card.samples or len(card.outputs) != 1:
        return None
    x, bias, out = _arg(card, "input"), _arg(card, "bias"), card.outputs[0]
    if not x or not bias or bias.get("kind") != "tensor" or bias.get("absent") or x.get("device") != "cuda":
        return None
    if out.get("kind", "tensor") != "tensor" or out.get("dtype") not in _FLOATS or bias.get("dtype") != out["dtype"]:
        return None
    shape, c = [int(n) for n in out["shape"]], int(bias["shape"][0]) if len(bias["shape"]) == 1 else -1
    if len(shape) < 3 or c != shape[1] or list(bias["stride"]) != [1] or math.prod(shape) == 0:
        return None
    if dense_order(shape, out["stride"]) is None:
        return None
    self_ = {k: v for k, v in out.items() if k != "name"}
    if channels_last:
        if len(shape) != 4 or shape[1] <= 1 or math.prod(shape[2:]) <= 1:
            return None
        self_["stride"] = channels_last_strides(shape)
        if list(self_["stride"]) == list(out["stride"]):
            return None   # captured channels-last already: that is the plain card
    bshape = [1, c] + [1] * (len(shape) - 2)
    other = {**{k: v for k, v in bias.items() if k != "name"}, "shape": bshape, "stride": contiguous_strides(bshape)}
    sig = {"op": HIDDEN_OP, "args": [{"name": "self", **self_, "kind": "tensor"},
                                     {"name": "other", **other, "kind": "tensor"},
                                     {"kind": "value", "name": "alpha", "value": 1}],
           "aliases": [], "hidden_in": {"card": card.card_id, "how": _HOW}}
    outputs = [{k: v for k, v in self_.items() if k != "name"}]
    return OperatorCard(card_id=card_id(sig), op=HIDDEN_OP, signature=sig, signature_text=signature_text(sig),
                        outputs=outputs, calls=card.calls, share=card.share,
                        bytes=2 * _nbytes(self_) + _nbytes(other),   # as the recorder counts: reads + writes
                        captured_calls=card.captured_calls, module_paths=dict(card.module_paths),
                        samples=card.samples)


def _nbytes(t: dict[str, Any]) -> int:
    import torch

    return getattr(torch, t["dtype"]).itemsize * math.prod(int(n) for n in t["shape"])


def _merged(same: list[OperatorCard]) -> OperatorCard:
    """One card for a hidden call several cards make: the first's samples, the calls and shares summed, every
    maker named (`hidden_in.cards`)."""
    import dataclasses

    first = same[0]
    if len(same) == 1:
        return first
    makers = [h.signature["hidden_in"]["card"] for h in same]
    sig = {**first.signature, "hidden_in": {**first.signature["hidden_in"], "cards": makers}}
    paths: dict[str, int] = {}
    for h in same:
        for p, n in h.module_paths.items():
            paths[p] = paths.get(p, 0) + n
    return dataclasses.replace(first, card_id=card_id(sig), signature=sig, calls=sum(h.calls for h in same),
                               share=sum(h.share for h in same), module_paths=paths,
                               captured_calls=sum(h.captured_calls for h in same))


def hidden_cards(cards: Sequence[OperatorCard], channels_last: bool = False) -> dict[str, OperatorCard]:
    """Hidden card id -> its card, for every convolution card with a bias (and, with `channels_last`, its
    channels-last form too), one card per call however many convolutions make it, leaving out any that is a
    card already."""
    have = {c.card_id for c in cards}
    by_call: dict[str, list[OperatorCard]] = {}
    for c in cards:
        for cl in (False, True) if channels_last else (False,):
            h = bias_card(c, channels_last=cl)
            if h is not None and h.card_id not in have:
                by_call.setdefault(call_of(h.op, h.signature), []).append(h)
    out: dict[str, OperatorCard] = {}
    for same in by_call.values():
        h = _merged(same)
        out[h.card_id] = h
    return out


def hidden_in(signature: dict[str, Any]) -> str | None:
    """The id of the card whose call makes this hidden call (and whose samples it shares), or None."""
    h = signature.get("hidden_in") if isinstance(signature, dict) else None
    return h.get("card") if isinstance(h, dict) else None


makers_of = hidden_makers   # the ids of every card whose call makes a hidden call (engine.cards)


def hidden_shares(cards: list[OperatorCard]) -> list[OperatorCard]:
    """The cards, each hidden call's share made its part of its maker's once eager was timed for it: the
    maker's share × (the call's eager µs / the maker's captured µs per call), at most the maker's share. Until
    then, and where its maker is not among `cards`, the maker's share (an upper bound) stays."""
    import dataclasses

    by_id = {c.card_id: c for c in cards}
    out = []
    for c in cards:
        makers = [by_id.get(m) for m in hidden_makers(c.signature)]
        if makers and all(m is not None for m in makers):
            part = hidden_part(c.eager_us, [(m.share, m.capture_us) for m in makers if m is not None])
            if part is not None:
                c = dataclasses.replace(c, share=part)
        out.append(c)
    return out


def row_shares(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Card id -> share for store rows (signatures as dicts or JSON text), a hidden call's made its part of its
    maker's (`hidden_shares`): what tables and coverage sums count, so a bias add is not counted at its
    convolution's whole share."""
    import json

    def one(r: dict[str, Any]) -> dict[str, Any]:
        sig = r.get("signature")
        return {**r, "signature": json.loads(sig) if isinstance(sig, str) else (sig or {})}

    from engine.cards import card_from_row

    return {c.card_id: c.share for c in hidden_shares([card_from_row(one(r)) for r in rows.values()])}
