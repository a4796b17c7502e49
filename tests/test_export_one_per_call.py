"""engine.export.package.one_per_call: a cast routes only the first variant of a guard key, so two cards of one
call (two convolutions adding a bias into the same tensor shape made two bias-add cards before 8555308) keep the
faster one before confirmation; the other is left out with a reason naming it (on the H100 it was confirmed for
nothing and left out as "the guard did not match the variant's own inputs", 10 of sd35_medium's 47)."""

from __future__ import annotations

import torch
from card_helpers import cudaify

from engine.capture.signature import bind_arguments, signature_of
from engine.export.package import ExportVariant, one_per_call

ADD_ = torch.ops.aten.add_.Tensor


def _variant(card_id, x, speedup, maker):
    sig = cudaify(signature_of(ADD_, bind_arguments(ADD_, (x, torch.randn(1, x.shape[1], 1, 1)), {})))
    sig["hidden_in"] = {"card": maker, "how": "convolution bias"}   # what tells the two cards apart
    card = {"card_id": card_id, "op": "aten::add_.Tensor", "signature": sig, "outputs": []}
    return ExportVariant(card=card, candidate={"id": f"c-{card_id}", "speedup": speedup}, cubin=None, ptx=None,
                         arch="sm_90")


def test_two_cards_of_one_call_keep_the_faster_and_say_why():
    x = torch.randn(1, 8, 4, 4)
    slow, fast = _variant("aaaa0000", x, 1.9, "conv0"), _variant("bbbb0000", x, 2.2, "conv1")
    cl = _variant("cccc0000", x.contiguous(memory_format=torch.channels_last), 2.0, "conv0")  # another call
    other = _variant("dddd0000", torch.randn(1, 8, 4, 5), 1.5, "conv2")
    excluded, said = [], []
    kept = one_per_call([slow, fast, cl, other], excluded, said.append)
    assert kept == [fast, cl, other]
    assert excluded == [{"card_id": "aaaa0000", "op": "aten::add_.Tensor",
                         "reason": "the same call as add__Tensor-bbbb0000 (2.20x in the lane against 1.90x), "
                                   "which serves it"}]
    assert said == ["1 variant(s) left out: the same call as a faster one of another card"]


def test_distinct_calls_and_chains_pass_unchanged():
    a, b = _variant("aaaa0000", torch.randn(1, 8, 4, 4), 2.0, "c"), _variant("bbbb0000", torch.randn(2, 8, 4, 4), 2.0, "c")
    chain = ExportVariant(card={"card_id": "eeee0000", "op": "kforge::chain", "signature": {"nodes": []},
                                "outputs": []}, candidate={"speedup": 3.0}, cubin=None, ptx=None, arch="sm_90")
    excluded = []
    assert one_per_call([a, b, chain], excluded) == [a, b, chain] and excluded == []
