"""GPU: a CUDA convolution's bias add (engine/capture/hidden.py) as a card, served from inside the convolution.

1. A route at the CUDA key for the hidden card's signature is hit from inside `F.conv2d` (ATen's `_convolution`
   adds the bias after cuDNN through the dispatcher), in NCHW and channels-last, and the result is eager's.
2. A capture of a small convolutional model on CUDA holds the hidden cards, and their samples load as the
   convolution's output and bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu


def test_a_route_for_the_bias_add_is_hit_from_inside_the_convolution():
    from engine.capture.hidden import bias_card
    from engine.capture.signature import bind_arguments, signature_of, signature_text
    from engine.cards import OperatorCard
    from engine.cast import runtime
    from engine.cast.guard import first_shape, layout_of, proven_formats, signature_key

    torch.manual_seed(0)
    x = torch.randn(1, 64, 32, 32, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.05
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    conv = torch.ops.aten.convolution.default
    bound = bind_arguments(conv, (x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {})
    sig = signature_of(conv, bound)
    y = conv(*[v for _, v in bound])
    out = {k: v for k, v in signature_of(torch.ops.aten.relu.default, [("self", y)])["args"][0].items()
           if k != "name"}
    card = OperatorCard("conv", "aten::convolution", sig, signature_text(sig), [out], calls=1, samples=1)
    add_ = torch.ops.aten.add_.Tensor
    lay = layout_of(add_)
    seen = []

    def plan(bound_args):   # what a kernel would do, counted: eager's add_ with the route suspended
        seen.append(tuple(bound_args[0].stride()))
        with runtime.suspended():
            return add_(bound_args[0], bound_args[1], alpha=bound_args[2])

    owner = object()
    entries = []
    for cl in (False, True):
        h = bias_card(card, channels_last=cl)
        p = runtime.Plan(h.card_id, plan)
        p.formats = proven_formats(lay, h.signature)
        entries.append((lay.op_name, signature_key(lay, h.signature, 0), p, first_shape(h.signature)))
    runtime.add_entries(owner, entries, "CUDA")
    try:
        with torch.no_grad():
            got = F.conv2d(x, w, b, padding=1)
            got_cl = F.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, padding=1)
    finally:
        runtime.remove_owner(owner)
    with torch.no_grad():
        want = F.conv2d(x, w, b, padding=1)
        want_cl = F.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, padding=1)
    assert seen == [tuple(want.stride()), tuple(want_cl.stride())], seen   # both calls, from inside conv2d
    assert torch.equal(got, want) and torch.equal(got_cl, want_cl) and got_cl.stride() == want_cl.stride()


def test_a_cuda_capture_holds_the_bias_adds_and_their_samples(tmp_path):
    import json

    from engine.capture.hidden import bias_card
    from engine.capture.run import capture_model
    from engine.capture.samples import load_sample
    from engine.config import load_config

    cfg = load_config("configs/examples/sd35_vae.toml", small=True)
    result = capture_model(cfg, torch.device("cuda"), tmp_path)
    hidden = [c for c in result.cards if c.card_id in result.hidden]
    convs = {c.card_id: c for c in result.cards if c.op == "aten::convolution"}
    assert hidden and all(c.op == "aten::add_.Tensor" and result.hidden[c.card_id] in convs for c in hidden)
    assert any(c.signature["args"][0]["stride"][1] == 1 for c in hidden)   # channels-last forms too
    # one card per call, however many convolutions make it (two cards of one call share a guard key)
    calls = [json.dumps({k: v for k, v in c.signature.items() if k != "hidden_in"}, sort_keys=True) for c in hidden]
    assert len(set(calls)) == len(calls)
    forms = sum(c.calls for c in convs.values() for cl in (False, True) if bias_card(c, channels_last=cl))
    assert sum(c.calls for c in hidden) == forms   # every convolution's calls, each in one card
    h = hidden[0]
    maker = result.hidden[h.card_id]
    s = load_sample(tmp_path / result.sample_dir / f"{maker}.0.safetensors", "cuda", h.signature)
    me, other, alpha = (v for _, v in s.args)
    assert list(me.shape) == h.signature["args"][0]["shape"] and list(other.shape) == h.signature["args"][1]["shape"]
    assert alpha == 1 and result.total_calls == sum(c.calls for c in result.cards
                                                    if c.card_id not in result.twins and c.card_id not in result.hidden)
