"""Conv-bias folded GroupNorm -> SiLU chain cards (engine.capture.folds), captured on the CPU.

Under torch.compile Inductor splits a convolution's bias off into an add of its own; a chain card with that add in
front (`add.Tensor(in0, in1[1, C, 1, 1])` -> GroupNorm -> SiLU) lets a kernel make it on its loads. The capture
derives it from the plain chain card where the GroupNorm is the biased convolution's only reader; it shares the
plain card's samples, derives its inputs from them when loaded, is counted in no total, and has a channels-last
twin."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
import torch
from rich.console import Console
from test_chains import _patterns
from torch import nn

from engine.capture.chain_cards import MemberTrace, chain_cards
from engine.capture.chains import run_chain
from engine.capture.folds import conv_bias_folds, data_flow, folded_card, folded_from, folding_conv, wanted
from engine.capture.recorder import ModulePaths
from engine.capture.report import print_cards
from engine.capture.run import CaptureResult, capture_model
from engine.capture.samples import folded_args, load_sample
from engine.capture.store import capture_and_store
from engine.capture.twins import channels_last_strides, channels_last_twins, twin_of, untwinned
from engine.cards import OperatorCard
from engine.config import load_config
from engine.errors import UsageError
from engine.store import Store, db_path

CL = torch.channels_last

MODEL = '''
import torch
from torch import nn

class Block(nn.Module):
    """conv -> GroupNorm -> SiLU -> conv; with `residual`, the first convolution's output is also added back."""

    def __init__(self, residual=False):
        super().__init__()
        self.conv, self.norm, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.Conv2d(8, 8, 3, padding=1)
        self.residual = residual

    def forward(self, x):
        h = self.conv(x)
        y = self.conv2(torch.nn.functional.silu(self.norm(h)))
        return y + h if self.residual else y

def build(device, dtype):
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(residual=True)).to(device=device, dtype=dtype).eval(), \\
        (torch.randn(2, 8, 6, 6, device=device, dtype=dtype),)
'''


def _config(tmp_path: Path, capture: str) -> Path:
    (tmp_path / "folds.py").write_text(MODEL)
    path = tmp_path / "folds.toml"
    path.write_text('name = "folds"\nbuilder = "folds.py:build"\n[dtype]\ncpu = "float32"\ncuda = "bfloat16"\n'
                    f"[capture]\nsamples = 2\n{capture}\n")
    return path


def _ops(card):
    return tuple(n["op"] for n in card.signature["chain"]["nodes"])


class Block(nn.Module):
    """`conv` -> GroupNorm -> SiLU -> conv, as a VAE block; with `residual`, the first convolution's output is also
    added back after the second."""

    def __init__(self, conv: nn.Module, residual: bool = False):
        super().__init__()
        self.conv, self.norm, self.conv2, self.residual = conv, nn.GroupNorm(4, 8), nn.Conv2d(8, 8, 1), residual

    def forward(self, x):
        h = self.conv(x)
        y = self.conv2(torch.nn.functional.silu(self.norm(h)))
        return y + h if self.residual else y


class BiasThenNorm(nn.Module):
    """A real add of a [1, C, 1, 1] parameter before GroupNorm -> SiLU: what a folded card means."""

    def __init__(self):
        super().__init__()
        self.b, self.norm = nn.Parameter(torch.randn(1, 8, 1, 1)), nn.GroupNorm(4, 8)

    def forward(self, x):
        return torch.nn.functional.silu(self.norm(x + self.b))


def _traced_chains(model, x):
    """The trace of one forward of `model` and its chain cards (engine.capture.chain_cards), sampled nowhere."""
    paths = ModulePaths(model, {})
    trace = MemberTrace(paths.current, None, entered=paths.entered)
    with paths, torch.no_grad(), trace:
        model(x)
    return trace, chain_cards(trace, model, paths.weight, 1.0, samples=1, sample_budget_bytes=1 << 30,
                              total_budget_bytes=1 << 30).cards


def _plain_and_conv(model, x):
    """The GroupNorm -> SiLU chain card of `model`'s forward and the convolution card that makes its input."""
    trace, cards = _traced_chains(model, x)
    (plain,) = [c for c in cards if _ops(c) == ("aten::native_group_norm", "aten::silu")]
    conv = next(c for c in trace.calls if c.op == "aten::convolution")
    return plain, OperatorCard(conv.card_id, conv.op, conv.signature, "", [])


def test_a_chain_records_which_instances_a_convolutions_bias_could_fold_into():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    model = nn.Sequential(Block(nn.Conv2d(8, 8, 3, padding=1)), Block(nn.Conv2d(8, 8, 3, padding=1), True)).eval()
    plain, conv = _plain_and_conv(model, x)
    # the second block's convolution output is also read by its residual add: its bias stays where it is
    assert plain.chain["conv_bias"] == {"cards": [conv.card_id], "instances": 1, "of": 2, "module_paths": {"0": 1}}
    folded = folded_card(plain, conv)
    assert folded.signature_text == "chain[add native_group_norm silu] in0 f32[2,8,6,6] in1 f32[1,8,1,1] in2 f32[8] in3 f32[8]"
    assert (folded.calls, folded.captured_calls, folded.module_paths) == (1, 1, {"0": 1})
    assert folded.share == pytest.approx(plain.share / 2) and folded.samples == plain.samples
    assert folded.chain == {"kind": "pattern", "module_class": "Block", "modules": [],
                            "members": plain.chain["members"], "ops": ["add", "native_group_norm", "silu"]}
    assert folded_from(folded.signature) == plain.card_id and folded_from(plain.signature) is None
    assert folded.bytes == plain.bytes + 8 * 4    # and the bias, read once
    # outputs: the plain chain's (mean, rstd, the SiLU), as the members' meta kernels give them
    assert folded.outputs == plain.outputs
    assert conv_bias_folds([plain], [conv]) == {plain.card_id: folded}
    assert conv_bias_folds([plain], []) == {}   # no convolution card to take the bias from


def test_no_fold_without_a_bias_through_a_transposed_convolution_or_where_the_output_has_other_readers():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    for conv, residual in [(nn.Conv2d(8, 8, 3, padding=1, bias=False), False),
                           (nn.ConvTranspose2d(8, 8, 3, padding=1), False),
                           (nn.Conv2d(8, 8, 3, padding=1), True)]:
        model = nn.Sequential(Block(conv, residual)).eval()
        trace, cards = _traced_chains(model, x)
        (plain,) = [c for c in cards if _ops(c) == ("aten::native_group_norm", "aten::silu")]
        assert "conv_bias" not in plain.chain, (conv, residual)
    # folding_conv on the instance itself: the biased convolution whose only reader is the GroupNorm
    model = nn.Sequential(Block(nn.Conv2d(8, 8, 3, padding=1))).eval()
    trace, pats = _patterns(model, x)
    ch = next(p.instances[0] for p in pats if p.instances[0].calls[0].op == "aten::native_group_norm")
    maker, readers = data_flow(trace.calls)
    assert folding_conv(trace.calls, ch, maker, readers).op == "aten::convolution"


def test_the_folded_signature_is_that_of_a_real_bias_add_before_group_norm_silu():
    """Without `folded_from`, the folded card is what a capture of `x + b` -> GroupNorm -> SiLU gives; a model that
    makes that very call keeps its own card (with its own samples) and gets no fold of it."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    plain, conv = _plain_and_conv(nn.Sequential(Block(nn.Conv2d(8, 8, 3, padding=1))).eval(), x)
    folded = folded_card(plain, conv)
    _, real_cards = _traced_chains(nn.Sequential(BiasThenNorm()).eval(), x)
    (real,) = [c for c in real_cards if _ops(c) == ("aten::add.Tensor", "aten::native_group_norm", "aten::silu")]
    assert {k: v for k, v in folded.signature.items() if k != "folded_from"} == real.signature
    assert folded.signature["folded_from"] == {"card": plain.card_id, "convs": [conv.card_id], "how": "convolution bias",
                                               "bias": "in1", "inputs": {"in0": "in0", "in2": "in1", "in3": "in2"}}
    assert conv_bias_folds([plain, real], [conv]) == {}


def test_a_folded_card_has_a_channels_last_twin():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    plain, conv = _plain_and_conv(nn.Sequential(Block(nn.Conv2d(8, 8, 3, padding=1))).eval(), x)
    folded = folded_card(plain, conv)
    twins = channels_last_twins([plain, folded])
    twin = twins[folded.card_id]
    assert set(twins) == {plain.card_id, folded.card_id}
    assert twin.signature["twin_of"] == folded.card_id and twin.signature["folded_from"] == folded.signature["folded_from"]
    assert twin.signature["args"][0]["stride"] == channels_last_strides([2, 8, 6, 6])
    assert twin.signature["args"][1:] == folded.signature["args"][1:]    # the bias stays [1, C, 1, 1]
    assert untwinned(twin.signature) == folded.signature and twin_of(twin) is None
    assert folded_card(twins[plain.card_id], conv) is None   # the plain chain's twin has no fold of its own
    assert twin.signature_text.startswith("chain[add native_group_norm silu] in0 f32[2,8,6,6](s=288,1,48,8)")
    # its eager: the chain on a contiguous copy, the outputs in its members' meta kernels' strides
    ins = [torch.randn(2, 8, 6, 6).contiguous(memory_format=CL), torch.randn(1, 8, 1, 1), torch.randn(8), torch.randn(8)]
    got, want = run_chain(twin.signature, ins), run_chain(folded.signature, [ins[0].contiguous(), *ins[1:]])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_folded_cards_inputs_derive_from_the_plain_chains_sample(dtype):
    """The stand-in bias is each channel's mean of the stored GroupNorm input, rounded; in0 + bias gives that input
    back within a unit in the last place, so the chain on the derived inputs is the plain chain on the stored one
    within the dtype's rounding."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    model = nn.Sequential(Block(nn.Conv2d(8, 8, 3, padding=1))).to(dtype).eval()
    x = torch.randn(2, 8, 6, 6, dtype=dtype)
    plain, conv = _plain_and_conv(model, x)
    folded = folded_card(plain, conv)
    s = ((torch.randn(2, 8, 6, 6, generator=g) * 0.5 + torch.randn(1, 8, 1, 1, generator=g) * 4).to(dtype))
    w, b = (torch.randn(8, generator=g) * 0.3 + 1).to(dtype), (torch.randn(8, generator=g) * 0.2).to(dtype)
    args = folded_args(folded.signature, [("in0", s), ("in1", w), ("in2", b)])
    assert [n for n, _ in args] == ["in0", "in1", "in2", "in3"]
    named = dict(args)
    bias = named["in1"]
    assert bias.shape == (1, 8, 1, 1) and bias.dtype == dtype and bias.is_contiguous()
    assert torch.equal(bias.flatten(), s.float().mean(dim=(0, 2, 3)).to(dtype))
    assert named["in2"] is w and named["in3"] is b
    # one rounding of s - bias, one of in0 + bias: within a unit in the last place of the larger of s and in0
    back = (named["in0"].float() + bias.float()).to(dtype)
    ulp = torch.maximum(s.float().abs(), named["in0"].float().abs()) * torch.finfo(dtype).eps
    assert bool(((back.float() - s.float()).abs() <= ulp).all()) and not torch.equal(named["in0"], s)
    got, want = run_chain(folded.signature, [t for _, t in args]), run_chain(plain.signature, [s, w, b])
    for gt, wt in zip(got, want):
        torch.testing.assert_close(gt.float(), wt.float(), atol=1e-5 if dtype == torch.float32 else 2e-2,
                                   rtol=1e-5 if dtype == torch.float32 else 2e-2)
    with pytest.raises(ValueError, match="folded chain the sample loader does not know"):
        folded_args({**folded.signature, "folded_from": {"how": "something else"}}, args)


def test_a_capture_adds_the_fold_and_its_twin_sharing_the_plain_chains_samples(tmp_path):
    """Through the capture and the store: the fold among the chain cards, named in `folded`, its twin in `twins`,
    both stored with the plain chain's sample files and loaded as their signatures say; the totals as without."""
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_and_store(load_config(_config(tmp_path, "layout_twins = true\nconv_bias_folds = true")), "cpu",
                               ws, samples=2)
    (plain,) = [c for c in result.chains if _ops(c) == ("aten::native_group_norm", "aten::silu")
                and c.card_id not in result.twins]
    (folded,) = [c for c in result.chains if c.card_id in result.folded]
    (twin,) = [c for c in result.chains if result.twins.get(c.card_id) == folded.card_id]
    assert result.folded == {folded.card_id: plain.card_id}
    conv = next(c for c in result.cards if c.card_id == plain.chain["conv_bias"]["cards"][0])
    assert conv.op == "aten::convolution"   # the trace's convolution is the op card
    assert (folded.calls, plain.calls, folded.samples) == (1, 2, plain.samples) and plain.samples >= 1
    assert result.shares_samples_of(twin.card_id) == result.shares_samples_of(folded.card_id) == plain.card_id
    assert "conv-bias folds" in result.notes and "1 conv-bias folded one(s)" in result.notes["channels-last twins"]
    doc = result.to_json()
    assert doc["folded"] == result.folded and doc["twins"][twin.card_id] == folded.card_id

    async def paths():
        store = await Store.open(db_path(ws))
        async with store:
            return {cid: [r["path"] for r in await store.get_samples(result.capture_id, cid)]
                    for cid in (plain.card_id, folded.card_id, twin.card_id)}

    got = asyncio.run(paths())
    assert got[folded.card_id] == got[twin.card_id] == got[plain.card_id]   # the same files
    for p in got[plain.card_id]:
        stored = load_sample(ws / p)
        as_folded = load_sample(ws / p, signature=folded.signature)
        as_twin = load_sample(ws / p, signature=twin.signature)
        assert as_folded.outputs is None and as_folded.mutated == {}
        f, t = dict(as_folded.args), dict(as_twin.args)
        assert [n for n, _ in as_folded.args] == ["in0", "in1", "in2", "in3"] and f["in1"].shape == (1, 8, 1, 1)
        assert f["in0"].is_contiguous() and t["in0"].is_contiguous(memory_format=CL) and torch.equal(f["in0"], t["in0"])
        out = run_chain(folded.signature, [v for _, v in as_folded.args])
        for o, e in zip(out, stored.outputs):
            torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)
    # The capture's listing names what the fold stands for; its calls are in no total
    text = io.StringIO()
    print_cards(result, ws, Console(file=text, width=300, force_terminal=False))
    line = next(ln for ln in text.getvalue().splitlines() if folded.card_id in ln)
    assert f"(the convolution's bias add in front of {plain.card_id[:8]}, for torch.compile)" in line
    plain_run = capture_model(load_config(_config(tmp_path, "layout_twins = true\nconv_bias_folds = false")),
                              torch.device("cpu"), ws)
    assert plain_run.folded == {} and plain_run.total_calls == result.total_calls
    assert len(plain_run.chains) == len(result.chains) - 2   # no fold, no twin of it


def test_which_captures_get_folds(tmp_path):
    conv = OperatorCard("c", "aten::convolution", {"args": []}, "", [])
    gn = OperatorCard("g", "aten::native_group_norm", {"args": []}, "", [])
    assert wanted("auto", "cuda", [conv, gn])
    assert not wanted("auto", "cpu", [conv, gn])  # on the CPU Inductor keeps the bias in the convolution
    assert not wanted("auto", "cuda", [gn])
    assert wanted(True, "cpu", []) and not wanted(False, "cuda", [conv])
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_model(load_config(_config(tmp_path, "")), torch.device("cpu"), ws)
    assert result.folded == {} and "conv-bias folds" not in result.notes   # "auto" on a CPU capture
    assert load_config(_config(tmp_path, "")).conv_bias_folds == "auto"
    assert load_config(_config(tmp_path, "conv_bias_folds = false")).conv_bias_folds is False
    with pytest.raises(UsageError, match=r'capture.conv_bias_folds.*must be true, false or "auto"'):
        load_config(_config(tmp_path, 'conv_bias_folds = "yes"'))


def test_shared_samples_follow_twins_folds_and_hidden_calls_to_the_card_that_has_files():
    result = CaptureResult("c", "m", "cuda", "bfloat16", False, 0.0, [], {}, {}, "s",
                           twins={"twin": "fold", "gn-twin": "gn"}, folded={"fold": "plain"},
                           hidden={"add": "conv", "loop": "loop"})
    assert result.shares_samples_of("twin") == "plain"      # twin -> folded card -> plain chain
    assert result.shares_samples_of("fold") == "plain"
    assert result.shares_samples_of("gn-twin") == "gn" and result.shares_samples_of("add") == "conv"
    assert result.shares_samples_of("plain") == "plain" and result.shares_samples_of("loop") == "loop"
