"""Conv-bias folds: GroupNorm -> SiLU chain cards with the convolution's bias add in front, which eager never shows.

On CUDA, `aten::convolution` adds its bias inside its own kernel (engine.capture.hidden), so a captured VAE block
shows `convolution(x, w, b)` then a GroupNorm -> SiLU chain card on its output. Under torch.compile, Inductor peels
the bias off into a pointwise add of its own (torch/_inductor/kernel/conv.py) and runs a whole pass over the
tensor to compute it into the layout the chain's kernel is handed. A chain kernel that adds the bias on its loads
saves that pass. Its card is an ordinary chain card, `add.Tensor(in0, in1[1, C, 1, 1])` -> `native_group_norm` ->
`silu`: it means exactly that for any per-channel add before a GroupNorm, so guards, fallbacks, twins and
verification are the chain machinery's. The design: docs/results/vae-split-2026-12-06h/h100-2026-12-07b/
conv_bias_fold_design.md.

Which chains get one: where, in the captured forward, the GroupNorm's input is the output of a biased,
non-transposed `aten::convolution` of the same dtype, and the GroupNorm is that output's only reader (a conv
output also read by a residual add keeps its bias: the add's result is needed whole). `folding_conv` decides per
instance while the chain cards are made (engine.capture.chain_cards records `conv_bias` on the chain's facts);
`conv_bias_folds` derives the cards after the capture, as the twins (engine.capture.twins) and hidden calls
(engine.capture.hidden) are. The card's signature names its plain chain card (`folded_from`).

Samples: none of its own. It shares the plain chain card's files and derives its inputs from them when loaded
(engine.capture.samples.folded_args): the GroupNorm input stored there, minus a stand-in bias, and that bias.
Its calls are the plain chain's foldable instances; its share, the plain chain's part for them (an upper bound),
is not counted again in any total: chain cards overlap the op cards and are in no total.

Which captures get them: `[capture] conv_bias_folds` in the model config: "auto" (the default: a CUDA capture
whose forward ran a convolution, see `wanted`), true or false.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.capture.chains import CHAIN_OP, chain_card_id, chain_text
from engine.capture.signature import contiguous_strides
from engine.cards import OperatorCard, call_of

if TYPE_CHECKING:
    from engine.capture.chains import Chain, TraceCall

PLAIN_OPS = ("aten::native_group_norm", "aten::silu")   # the chain a bias folds into
FOLD_OPS = ("aten::add.Tensor", *PLAIN_OPS)              # the folded card's members
CONVOLUTION = "aten::convolution"   # what a captured forward shows (and what Inductor's graph holds)
HOW = "convolution bias"            # engine.capture.samples.folded_args derives the inputs for it
BIAS = "in1"                        # the folded card's input that is the bias, [1, C, 1, 1]


def _arg(signature: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((a for a in signature.get("args", []) if a.get("name") == name), None)


def folding_conv(calls: Sequence[TraceCall], chain: Chain, maker: dict[int, int],
                 readers: dict[int, list[int]]) -> TraceCall | None:
    """The convolution whose bias could fold into this GroupNorm -> SiLU chain instance, or None: the chain's
    first input must be the GroupNorm's input, made by a biased, non-transposed `aten::convolution` whose bias is
    one dense [C] vector of the output's dtype, with the GroupNorm its only reader, and the input 4-D (the
    channels-last kernels and the compiled graph's split are for images). `maker` and `readers`: value id -> the
    call index that made it / that read it, over the whole trace."""
    if tuple(c.op for c in chain.calls) != PLAIN_OPS or not chain.inputs:
        return None
    gn, x = chain.calls[0], chain.inputs[0]
    if gn.reads[:1] != [("input", x)] or readers.get(x) != [gn.index]:
        return None
    p = maker.get(x)
    conv = calls[p] if p is not None else None
    if conv is None or conv.op != CONVOLUTION or conv.writes[:1] != [x]:
        return None
    bias, out = _arg(conv.signature, "bias"), _arg(gn.signature, "input")
    transposed = _arg(conv.signature, "transposed")
    if not bias or bias.get("kind") != "tensor" or bias.get("absent") or not out or (transposed or {}).get("value"):
        return None
    shape = [int(n) for n in out.get("shape", [])]
    if len(shape) != 4 or bias.get("dtype") != out.get("dtype") or list(bias.get("shape", [])) != shape[1:2] \
            or list(bias.get("stride", [])) != [1]:
        return None
    return conv


def _moved(ref: list) -> list:
    """A tensor reference of the plain chain as the folded chain has it: its first input is now the add's result
    (node 0), its other inputs one later (the bias is in1), its members one later."""
    if ref[0] == "in":
        return ["node", 0, 0] if ref[1] == 0 else ["in", ref[1] + 1]
    return ["node", ref[1] + 1, ref[2]]


def folded_signature(plain: dict[str, Any], bias: dict[str, Any], plain_id: str, convs: list[str]) -> dict[str, Any]:
    """The folded chain's signature from the plain GroupNorm -> SiLU chain's and the convolution's bias
    description: in0 the convolution's output without the bias (the plain chain's in0 description), in1 the bias
    as [1, C, 1, 1], then the plain chain's other inputs; the add, then the plain chain's members reading its
    result. Without `folded_from`, it is what a capture of a real `x + b` -> GroupNorm -> SiLU chain gives."""
    x = plain["args"][0]
    c = int(x["shape"][1])
    bshape = [1, c] + [1] * (len(x["shape"]) - 2)
    in1 = {**{k: v for k, v in bias.items() if k != "name"}, "name": BIAS, "kind": "tensor", "shape": bshape,
           "stride": contiguous_strides(bshape)}
    rest = [{**a, "name": f"in{i + 2}"} for i, a in enumerate(plain["args"][1:])]
    nodes = [{"op": FOLD_OPS[0], "args": [{"name": "self", "tensor": ["in", 0]}, {"name": "other", "tensor": ["in", 1]},
                                          {"name": "alpha", "value": 1}], "results": 1}]
    for node in plain["chain"]["nodes"]:
        args = []
        for a in node["args"]:
            if "tensor" in a:
                a = {**a, "tensor": _moved(a["tensor"])}
            elif "tensors" in a:
                a = {**a, "tensors": [None if r is None else _moved(r) for r in a["tensors"]]}
            args.append(a)
        nodes.append({**node, "args": args})
    # each input of the folded card but the bias, read from the plain chain's sample by that sample's name
    inputs = {"in0": "in0", **{f"in{i + 2}": a["name"] for i, a in enumerate(plain["args"][1:])}}
    return {**{k: v for k, v in plain.items() if k not in ("args", "chain")},
            "args": [dict(x), in1, *rest],
            "chain": {"nodes": nodes, "outputs": [[j + 1, k] for j, k in plain["chain"]["outputs"]]},
            "folded_from": {"card": plain_id, "convs": list(convs), "how": HOW, "bias": BIAS, "inputs": inputs}}


def folded_card(chain: OperatorCard, conv: OperatorCard) -> OperatorCard | None:
    """The conv-bias fold of a GroupNorm -> SiLU chain card whose facts record foldable instances
    (`chain["conv_bias"]`), with `conv` the convolution card of one of them; None where the chain has none or no
    samples to derive from."""
    import torch

    fact = (chain.chain or {}).get("conv_bias")
    bias = _arg(conv.signature, "bias")
    if chain.op != CHAIN_OP or not fact or not chain.samples or not bias or bias.get("absent") \
            or chain.signature.get("twin_of"):
        return None   # (a twin's fold is the fold's twin: engine.capture.twins makes it)
    if tuple(n.get("op") for n in chain.signature.get("chain", {}).get("nodes", [])) != PLAIN_OPS:
        return None
    sig = folded_signature(chain.signature, bias, chain.card_id, fact["cards"])
    bshape = sig["args"][1]["shape"]
    # Its outputs are the plain chain's as captured: the add's result takes in0's layout, so the members are handed
    # what they were; the meta kernels need not agree with the device's kernels (a CPU GroupNorm keeps a
    # channels-last input's layout, its meta kernel does not), and eager is what a candidate is checked against.
    outputs = [dict(o) for o in chain.outputs]
    paths = {p: int(n) for p, n in fact["module_paths"].items()}
    calls = sum(paths.values())
    ops = ["add", "native_group_norm", "silu"]
    return dataclasses.replace(
        chain, card_id=chain_card_id(sig), signature=sig, signature_text=chain_text(ops, sig), outputs=outputs,
        calls=calls, captured_calls=int(fact["instances"]), module_paths=paths,
        share=chain.share * calls / chain.calls if chain.calls > 0 else 0.0,   # its part of the chain's: an upper bound
        bytes=chain.bytes + math.prod(bshape) * getattr(torch, bias["dtype"]).itemsize,   # and the bias, read once
        eager_us=None, roofline_us=None, compile_us=None, copy_us=None, compile_note=None, compile_untried=False,
        # a pattern card: it runs only where compiled code holds the add (no module's forward is this chain)
        chain={"kind": "pattern", "module_class": (chain.chain or {}).get("module_class", ""), "modules": [],
               "members": list((chain.chain or {}).get("members", [])), "ops": ops})


def conv_bias_folds(chains: Sequence[OperatorCard], cards: Sequence[OperatorCard]) -> dict[str, OperatorCard]:
    """Plain chain card id -> its conv-bias fold, for every chain card of a capture that has one (`cards`: the
    capture's op cards, which hold the convolutions), leaving out any whose call is a card already: a model with a
    real add -> GroupNorm -> SiLU chain of the same call keeps that card, with its own samples (two cards of one
    call would share a guard key, and a cast routes only one)."""
    have = {call_of(c.op, c.signature) for c in chains}
    by_id = {c.card_id: c for c in cards}
    out: dict[str, OperatorCard] = {}
    for c in chains:
        fact = (c.chain or {}).get("conv_bias")
        conv = next((by_id[i] for i in (fact or {}).get("cards", []) if i in by_id), None)
        f = folded_card(c, conv) if conv is not None else None
        if f is not None and call_of(f.op, f.signature) not in have:
            out[c.card_id] = f
            have.add(call_of(f.op, f.signature))
    return out


def folded_from(signature: dict[str, Any]) -> str | None:
    """The id of the plain chain card a folded card derives from (and whose samples it shares), or None."""
    f = signature.get("folded_from") if isinstance(signature, dict) else None
    return f.get("card") if isinstance(f, dict) else None


def wanted(setting: Any, device: str, cards: Sequence[OperatorCard]) -> bool:
    """Whether a capture gets conv-bias folds: `setting` true/false, or "auto": on a CUDA capture that ran a
    convolution, where Inductor splits a convolution's bias off into an add of its own (on the CPU it keeps it in
    mkldnn's convolution, so compiled code holds no add to match)."""
    if setting is True or setting is False:
        return setting
    return device == "cuda" and any(c.op == CONVOLUTION for c in cards)


def data_flow(calls: Sequence[TraceCall]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Over a trace: value id -> the index of the call that made it, and -> those of the calls that read it (what
    `folding_conv` is given)."""
    maker: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for c in calls:
        for _, v in c.reads:
            readers.setdefault(v, []).append(c.index)
        for v in c.writes:
            maker[v] = c.index
    return maker, readers
