"""Channels-last twins: cards for the layout torch.compile hands a cast's ops, which eager never shows.

On a convolutional model, Inductor's layout optimization runs the convolutions channels-last, and an op after
a convolution (a GroupNorm) is handed a channels-last input. A cast whose variant was proven for eager's
contiguous input gets a copy of it first; one proven for the channels-last input is passed it as it is
(engine.cast.compose, `inputs_as_held`). The capture sees eager's layout only, so for each card of an op with
a builtin channels-last kernel (TWIN_OPS) whose input is a contiguous image batch, it adds a twin: the same
call with a channels-last input, its signature naming its original (`twin_of`). Its values and samples are
the original's; the samples are shared and laid out as the twin's signature says when loaded
(`engine.capture.samples.laid_out_as`). Its outputs are laid out as the op's meta kernel gives them for the
channels-last input (`engine.capture.fake_outputs`): compiled code that hands the op a held input asserts
those strides of its outputs (torch 2.11's CUDA GroupNorm: a channels-last output; H200, 2026-12-03e). Its
eager is what PyTorch's kernel costs there: the input copied to contiguous (CUDA native_group_norm rejects a
channels-last input), the op, the outputs copied into those strides (`engine.ops.eager_call`).

Which captures get them: `[capture] layout_twins` in the model config: "auto" (the default: a CUDA capture
whose forward ran a convolution, see `wanted`), true or false. Their path under compile
passed on the H200 on 2026-12-03 (tests/test_layout_twins_gpu.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from engine.capture.chains import CHAIN_OP, chain_text
from engine.capture.fake_outputs import fake_chain_outputs, fake_outputs
from engine.capture.signature import card_id, contiguous_strides, dense_order, signature_text
from engine.cards import OperatorCard, call_of

TWIN_OPS = ("aten::native_group_norm",    # ops with a channels-last builtin kernel: group_norm_cl,
            "aten::upsample_nearest2d")  # resample (a layout route's Decoder upsamples channels-last)
# Chains (their members' ops, in order) whose first member reads the chain's first input and has a builtin
# channels-last kernel: GroupNorm -> SiLU (chain_group_norm_silu on group_norm_cl). A VAE block's GroupNorm
# after a convolution and the SiLU before the next one, taking the first's output as held and writing the
# layout the second wants. And the same with the convolution's bias add in front (engine.capture.folds), whose
# first member, the add, reads the convolution's output without the bias.
TWIN_CHAINS = (("aten::native_group_norm", "aten::silu"),
               ("aten::add.Tensor", "aten::native_group_norm", "aten::silu"))
CONVOLUTIONS = ("aten::convolution", "aten::cudnn_convolution", "aten::_convolution", "aten::conv2d")


def channels_last_strides(shape: Sequence[int]) -> list[int]:
    """[N, C, *spatial] laid out as [N, *spatial, C] contiguous."""
    n, c, *sp = (int(s) for s in shape)
    inner = math.prod(sp)
    strides = [inner * c, 1]
    acc = c
    rest = []
    for s in reversed(sp):
        rest.append(acc)
        acc *= s
    return strides + list(reversed(rest))


def _contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Row-major contiguous, size-1 dims' strides aside (dense, its dims in their own order)."""
    return dense_order(shape, stride) == [d for d, n in enumerate(shape) if n > 1]


def _channels_last_in_name_only(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Laid out channels-last, size-1 dims aside, yet not channels-last to PyTorch: a batch of one whose batch
    stride is C, as a residual add after an attention block leaves it (sd35_medium's first upsampling,
    bf16[1,512,128,128] at (512, 1, 65536, 512)). Eager calls it NCHW; under a layout route the same call gets
    a true channels-last tensor, which its twin covers (the guard tells the two apart: engine.ops)."""
    from engine.ops import channels_last_by_strides

    if len(shape) != 4:
        return False
    return (dense_order(shape, stride) == [d for d in (0, 2, 3, 1) if shape[d] > 1]
            and not channels_last_by_strides(shape, stride))


def twin_of(card: OperatorCard) -> OperatorCard | None:
    """The card's channels-last twin, or None where it has none: another op (or a chain not of TWIN_CHAINS),
    an input that is not a contiguous [N, C, H, W(, ...)] batch with C > 1 and more than one pixel (for an op
    card, one channels-last in name only counts as contiguous: `_channels_last_in_name_only`), or no
    samples. A chain's outputs are its members' meta kernels' for the channels-last input."""
    chain = card.op == CHAIN_OP and _twin_chain(card.signature)
    if (card.op not in TWIN_OPS and not chain) or not card.samples or not card.signature.get("args"):
        return None
    x = card.signature["args"][0]
    shape = [int(s) for s in x.get("shape", [])]
    if x.get("kind") != "tensor" or len(shape) < 4 or shape[1] <= 1 or math.prod(shape[2:]) <= 1:
        return None
    if not _contiguous(shape, x["stride"]) and (chain or not _channels_last_in_name_only(shape, x["stride"])):
        return None
    args: list[dict[str, Any]] = [dict(a) for a in card.signature["args"]]
    args[0] = {**x, "stride": channels_last_strides(shape)}
    sig = {**card.signature, "args": args, "twin_of": card.card_id}
    outputs = fake_chain_outputs(sig, card.outputs) if chain else fake_outputs(card.op, sig, card.outputs)
    if outputs is None:
        return None   # no meta kernel to tell the layouts compiled code asserts: no twin
    if card.outputs:  # the card's, in the meta kernel's strides
        if [(o["dtype"], o["shape"]) for o in outputs] != [(o.get("dtype"), o.get("shape")) for o in card.outputs]:
            return None
        outputs = [{**c, "stride": o["stride"]} for c, o in zip(card.outputs, outputs)]
    text = signature_text(sig)
    if chain:  # as its original's: the members, then the inputs (the first now channels-last)
        ops = (card.chain or {}).get("ops") or [n["op"].split("::")[-1].split(".")[0] for n in sig["chain"]["nodes"]]
        text = chain_text(list(ops), sig)
    return dataclasses.replace(card, card_id=card_id(sig), signature=sig, signature_text=text,
                               outputs=outputs, eager_us=None, roofline_us=None, compile_us=None, copy_us=None,
                               compile_note=None, compile_untried=False)


def _twin_chain(signature: dict[str, Any]) -> bool:
    """A chain of TWIN_CHAINS whose first member's first tensor argument is the chain's first input."""
    nodes = (signature.get("chain") or {}).get("nodes") or []
    if tuple(n.get("op") for n in nodes) not in TWIN_CHAINS:
        return False
    first = next((a for a in nodes[0].get("args", []) if "tensor" in a), None)
    return first is not None and list(first["tensor"]) == ["in", 0]


def untwinned(signature: dict[str, Any]) -> dict[str, Any]:
    """A twin's signature as its original's (the first input row-major contiguous, no `twin_of`): what the
    compiled graph traced, where torch.compile hands the twin its input as held. Others: unchanged."""
    if not signature.get("twin_of"):
        return signature
    args = [dict(a) for a in signature["args"]]
    args[0]["stride"] = contiguous_strides([int(n) for n in args[0]["shape"]])
    return {**{k: v for k, v in signature.items() if k != "twin_of"}, "args": args}


def twinnable(op: str, signature: dict[str, Any]) -> bool:
    """A card that may have a channels-last twin: an op of TWIN_OPS, or a chain of TWIN_CHAINS."""
    return op in TWIN_OPS or (op == CHAIN_OP and _twin_chain(signature))


def call_key(op: str, signature: dict[str, Any]) -> str:
    """The same for a card and its twin (the first argument's strides left out for TWIN_OPS and TWIN_CHAINS):
    what a share of the model's time is counted once by."""
    import json

    if isinstance(signature, str):  # a store row's JSON text
        signature = json.loads(signature)
    args = list(signature.get("args", []))
    if twinnable(op, signature) and args:
        args[0] = {k: v for k, v in args[0].items() if k != "stride"}
    rest = {k: v for k, v in signature.items() if k != "twin_of"}
    return op + json.dumps({**rest, "args": args}, sort_keys=True, default=str)


def twins_among(cards: Sequence[tuple[str, str, Any]]) -> dict[str, str]:
    """Among (card id, op, signature) of one capture: twin id -> its original's id (a card of TWIN_OPS or
    TWIN_CHAINS whose first input is not contiguous, with the same call as a card whose first input is)."""
    import json

    def first_contiguous(sig: Any) -> bool:
        sig = json.loads(sig) if isinstance(sig, str) else sig
        a = (sig.get("args") or [{}])[0]
        return a.get("kind") == "tensor" and _contiguous([int(v) for v in a["shape"]], [int(v) for v in a["stride"]])

    def loaded(sig: Any) -> dict[str, Any]:
        return json.loads(sig) if isinstance(sig, str) else sig

    plain = {call_key(op, sig): cid for cid, op, sig in cards if twinnable(op, loaded(sig)) and first_contiguous(sig)}
    ids = {cid for cid, _, _ in cards}
    out = {}
    for cid, op, sig in cards:
        sig = loaded(sig)
        if not twinnable(op, sig) or first_contiguous(sig):
            continue
        if sig.get("twin_of"):    # named by the capture (twin_of), counted where its original is a card
            if sig["twin_of"] in ids:
                out[cid] = sig["twin_of"]
        elif call_key(op, sig) in plain:   # a capture of before (a real channels-last call looks the same)
            out[cid] = plain[call_key(op, sig)]
    return out


def wanted(setting: Any, device: str, cards: Sequence[OperatorCard]) -> bool:
    """Whether a capture gets twins: `setting` true/false, or "auto": on a CUDA capture that ran a
    convolution. Without a bias, a convolution stores its channels-last output as it is. With one, Inductor
    peels the bias off into a pointwise add on CUDA (cudnn is slower with it) and computes that add straight
    into the layout a cast's op asks for: a twin's channels-last layout where one was proven (engine.cast.compose,
    `inputs_computed_as_held`)."""
    if setting is True or setting is False:
        return setting
    return device == "cuda" and any(c.op in CONVOLUTIONS for c in cards)


def channels_last_twins(cards: Sequence[OperatorCard]) -> dict[str, OperatorCard]:
    """Original card id -> its twin, for every card that has one and whose call is not a card already (a model
    that also makes the channels-last call itself: that card is the call's, with its own samples; a twin of the
    same call would share its guard key, and a cast routes one of the two)."""
    have = {call_of(c.op, c.signature) for c in cards}
    out = {}
    for c in cards:
        t = twin_of(c)
        call = call_of(t.op, t.signature) if t is not None else None
        if t is not None and call not in have:
            out[c.card_id] = t
            have.add(call)
    return out
