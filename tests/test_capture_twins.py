"""Channels-last twins of GroupNorm cards (engine.capture.twins), captured on the CPU.

A twin is the card's call with a channels-last input: the layout torch.compile hands a GroupNorm after a
convolution. It shares the original's samples, loaded in its own layout, and the channels-last builtin
template takes it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine.capture.fake_outputs import fake_outputs
from engine.capture.run import capture_model
from engine.capture.samples import load_sample
from engine.capture.store import capture_and_store
from engine.capture.twins import channels_last_strides, twin_of, wanted
from engine.cards import OperatorCard, card_from_row
from engine.config import load_config
from engine.errors import UsageError
from engine.store import Store, db_path

MODEL = '''
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16)

    def forward(self, x):
        return torch.nn.functional.silu(self.norm(self.conv(x)))

def build(device, dtype):
    torch.manual_seed(0)
    return Block().to(device=device, dtype=dtype).eval(), (torch.randn(2, 8, 6, 6, device=device, dtype=dtype),)
'''


def _config(tmp_path: Path, twins: str) -> Path:
    (tmp_path / "convgn.py").write_text(MODEL)
    path = tmp_path / "convgn.toml"
    path.write_text('name = "convgn"\nbuilder = "convgn.py:build"\n[dtype]\ncpu = "float32"\ncuda = "bfloat16"\n'
                    f"[capture]\nsamples = 2\n{twins}\n")
    return path


def _gn(cards):
    return [c for c in cards if c.op == "aten::native_group_norm"]


def test_a_captured_groupnorm_gets_a_channels_last_twin_sharing_its_samples(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_and_store(load_config(_config(tmp_path, "layout_twins = true")), "cpu", ws, samples=2)
    (orig,) = [c for c in _gn(result.cards) if c.card_id not in result.twins]
    (twin,) = [c for c in _gn(result.cards) if c.card_id in result.twins]
    assert result.twins == {twin.card_id: orig.card_id}
    assert twin.signature["args"][0]["stride"] == channels_last_strides([2, 16, 6, 6]) == [576, 1, 96, 16]
    assert "(s=576,1,96,16)" in twin.signature_text
    assert (twin.calls, twin.samples) == (orig.calls, orig.samples)
    # its outputs: the original's, in the strides the meta kernel gives for a channels-last input
    assert [(o["dtype"], o["shape"]) for o in twin.outputs] == [(o["dtype"], o["shape"]) for o in orig.outputs]
    assert [o["stride"] for o in twin.outputs] == [o["stride"] for o in fake_outputs(twin.op, twin.signature)]
    assert "channels-last twins" in result.notes

    async def rows():
        store = await Store.open(db_path(ws))
        async with store:
            cards = {r["card_id"]: card_from_row(r) for r in await store.get_cards(result.capture_id)}
            return cards, {cid: [r["path"] for r in await store.get_samples(result.capture_id, cid)] for cid in cards}

    cards, paths = asyncio.run(rows())
    assert cards[twin.card_id].signature == twin.signature
    assert paths[twin.card_id] == paths[orig.card_id] and len(paths[twin.card_id]) == orig.samples >= 1  # the same files
    for p in paths[twin.card_id]:
        plain = dict(load_sample(ws / p).args)["input"]
        as_twin = dict(load_sample(ws / p, signature=twin.signature).args)["input"]
        assert plain.is_contiguous() and as_twin.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(plain, as_twin)


def test_the_channels_last_template_takes_the_twin():
    from card_helpers import brief, captured

    from engine.propose.builtin.proposer import BuiltinProposer

    x = torch.randn(1, 64, 8, 8, dtype=torch.bfloat16)
    c = captured(lambda: torch.nn.functional.group_norm(x, 32), lambda op: "norm" in op)
    card = brief(c.op, c.signature, c.outputs)  # marked cuda, as a GPU capture records it
    card = dataclasses.replace(card, samples=1)
    twin = twin_of(card)
    assert BuiltinProposer().template_for(card)[0].name == "group_norm"
    assert BuiltinProposer().template_for(twin)[0].name == "group_norm_cl"
    assert twin_of(twin) is None  # not contiguous: no twin of a twin


def test_which_captures_get_twins(tmp_path):
    def conv(bias):
        args = [{"name": "input", "kind": "tensor"}, {"name": "weight", "kind": "tensor"},
                {"name": "bias", "kind": "tensor", **({"shape": [8]} if bias else {"absent": True})}]
        return OperatorCard("c", "aten::convolution", {"args": args}, "", [])

    gn = OperatorCard("g", "aten::native_group_norm", {"args": []}, "", [])
    assert wanted("auto", "cuda", [conv(False), gn])
    # On CUDA Inductor peels a bias off into a pointwise add and computes it into the twin's channels-last
    # layout under a cast's compile (compose, inputs_computed_as_held)
    assert wanted("auto", "cuda", [conv(True), gn])
    assert not wanted("auto", "cpu", [conv(False)])  # the twin is for the GPU's compiled graph
    assert not wanted("auto", "cuda", [gn])  # no convolution: nothing goes channels-last
    assert wanted(True, "cpu", []) and not wanted(False, "cuda", [conv(False)])
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_model(load_config(_config(tmp_path, 'layout_twins = "auto"')), torch.device("cpu"), ws)
    assert result.twins == {} and len(_gn(result.cards)) == 1  # auto on a CPU capture
    # "auto" unless the config says otherwise: their path under compile passed on the H200 (docs/compile.md)
    assert load_config(_config(tmp_path, "")).layout_twins == "auto"
    with pytest.raises(UsageError, match=r'capture.layout_twins.*must be true, false or "auto"'):
        load_config(_config(tmp_path, 'layout_twins = "yes"'))


def test_a_card_and_its_twin_are_the_same_calls_for_the_models_time():
    import json

    from card_helpers import brief, captured

    from engine.capture.twins import call_key

    x = torch.randn(1, 64, 8, 8)
    c = captured(lambda: torch.nn.functional.group_norm(x, 32), lambda op: "norm" in op)
    card = dataclasses.replace(brief(c.op, c.signature, c.outputs), samples=1)
    twin = twin_of(card)
    assert call_key(card.op, card.signature) == call_key(twin.op, json.dumps(twin.signature))
    y = torch.randn(1, 64, 8, 4)
    other = captured(lambda: torch.nn.functional.group_norm(y, 32), lambda op: "norm" in op)
    assert call_key(card.op, card.signature) != call_key(other.op, other.signature)


def test_the_capture_listing_says_which_card_is_a_twin(tmp_path):
    import io

    from rich.console import Console

    from engine.capture.report import print_cards

    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_model(load_config(_config(tmp_path, "layout_twins = true")), torch.device("cpu"), ws)
    (twin_id, orig_id), = result.twins.items()
    assert result.total_calls == 3  # conv, GroupNorm, SiLU: the twin's call is its original's
    out = io.StringIO()
    print_cards(result, ws, Console(file=out, width=300, force_terminal=False))
    line = next(ln for ln in out.getvalue().splitlines() if twin_id in ln)
    assert "twin" in line.split()[3] and f"(channels-last twin of {orig_id[:8]}, for torch.compile)" in line
    assert "3 calls per forward" in out.getvalue() and result.to_json()["twins"] == {twin_id: orig_id}


def test_a_runs_card_table_finds_the_twins_among_a_captures_cards():
    from card_helpers import brief, captured

    from engine.capture.twins import twins_among

    x = torch.randn(1, 64, 8, 8)
    c = captured(lambda: torch.nn.functional.group_norm(x, 32), lambda op: "norm" in op)
    card = dataclasses.replace(brief(c.op, c.signature, c.outputs), samples=1)
    twin = twin_of(card)
    rows = [(card.card_id, card.op, card.signature), (twin.card_id, twin.op, twin.signature),
            ("conv", "aten::convolution", {"args": []})]
    assert twins_among(rows) == {twin.card_id: card.card_id}
    assert twins_among(rows[1:]) == {}  # a channels-last GroupNorm without its contiguous card: a card of its own


def test_a_twins_eager_is_the_op_on_its_input_made_contiguous_as_compile_would_call_it():
    """CUDA native_group_norm rejects a channels-last input: a twin's eager calls the op on its input made
    contiguous, then gives the outputs the strides the op's meta kernel gives for the channels-last input, which
    compiled code asserts (torch 2.11's CUDA GroupNorm: channels-last; H200, 2026-12-03e). Here the twin's
    outputs are recorded in those strides, and its eager's values are the op's on the contiguous input."""
    from engine.capture.signature import signature_text
    from engine.cards import OperatorCard
    from engine.verify.pipeline import card_check

    x = torch.randn(2, 8, 5, 5)
    w, b = torch.randn(8), torch.randn(8)
    args = [("input", x), ("weight", w), ("bias", b), ("N", 2), ("C", 8), ("HxW", 25), ("group", 4), ("eps", 1e-5)]
    from engine.capture.signature import bind_arguments, signature_of
    from engine.ops import meta_output_strides

    op = torch.ops.aten.native_group_norm.default
    sig = signature_of(op, bind_arguments(op, [v for _, v in args], {}))
    card = OperatorCard("orig", "aten::native_group_norm", sig, signature_text(sig), [], samples=1)
    twin = twin_of(card)
    assert twin.signature["twin_of"] == "orig"
    cl = [("input", x.contiguous(memory_format=torch.channels_last)), *args[1:]]
    meta = meta_output_strides(op, cl)
    assert [o["stride"] for o in twin.outputs] == [list(s) for s in meta]
    out = card_check("aten::native_group_norm", twin.signature, [cl]).eager(cl)
    assert [t.stride() for t in out] == meta and torch.equal(out[0], op(x, w, b, 2, 8, 25, 4, 1e-5)[0])
    plain = card_check("aten::native_group_norm", card.signature, [cl]).eager(cl)
    assert not plain[0].is_contiguous()   # the card's own eager: the op as called (CPU: channels-last out)


def test_a_twin_says_whose_calls_it_doubles_in_the_run_json_and_the_card_table():
    """The run's JSON names a twin's original, and the TUI's card table shows 'twin' for its share (the calls
    are counted once, on the original) instead of the same share twice."""
    from types import SimpleNamespace

    from engine.capture.signature import bind_arguments, signature_of
    from engine.run.plan import CardState
    from engine.run.report import card_summaries
    from kforge_tui.readmodel import CardRow, _twin_of
    from kforge_tui.screens.cards import COLUMNS

    op = torch.ops.aten.native_group_norm.default
    x = torch.randn(1, 8, 4, 4, dtype=torch.bfloat16)
    sig = signature_of(op, bind_arguments(op, [x, None, None, 1, 8, 16, 4, 1e-5], {}))
    card = OperatorCard("orig", "aten::native_group_norm", sig, "", [], share=0.3, samples=1)
    twin = twin_of(card)
    o = SimpleNamespace(cards={c.card_id: CardState(c, []) for c in (card, twin)}, records={})
    doc = {c["id"]: c for c in card_summaries(o)}
    assert doc[twin.card_id]["twin_of"] == "orig" and doc["orig"]["twin_of"] is None

    share_cell = next(col for col in COLUMNS if col[0] == "share")[2]
    rows = [CardRow(c.card_id, c.op, "", 1, 0.3, None, None, None, None, None, "queued", 0, 0, {}, None,
                    twin_of=_twin_of(json.dumps(c.signature))) for c in (card, twin)]
    assert [str(share_cell(r)) for r in rows] == ["30.0%", "twin"]


def test_the_card_table_names_a_channels_last_layout_instead_of_raw_strides():
    from kforge_tui.format import layouts
    from kforge_tui.readmodel import CardRow

    text = "bf16[1,128,64,64](s=524288,1,8192,128), bf16[128], bf16[128], N=1, C=128, HxW=4096, group=32"
    row = CardRow("t", "aten::native_group_norm", text, 1, 0.1, None, None, None, None, None, "queued", 0, 0, {},
                  None)
    assert row.detail.startswith("bf16[1,128,64,64] channels-last, bf16[128]")
    # N = 1: its stride does not matter; other strides stay as they are
    assert layouts("f32[1,8,4,4](s=8,1,32,8)") == "f32[1,8,4,4] channels-last"
    assert layouts("bf16[2,1,1536](s=9216,1536,1)") == "bf16[2,1,1536](s=9216,1536,1)"
    assert layouts("f32[2,8,4,4](s=128,1,32,8)") == "f32[2,8,4,4] channels-last"
    assert layouts("f32[2,8,4,4](s=100,1,32,8)") == "f32[2,8,4,4](s=100,1,32,8)"


def test_no_twin_where_the_model_makes_the_channels_last_call_itself():
    """A model that upsamples the same tensor shape in both layouts has a card of each; the NCHW card's twin
    would be the channels-last card's call again (one guard key: a cast routes one of the two), so it gets none."""
    from card_helpers import brief, captured

    from engine.capture.twins import channels_last_twins

    x = torch.randn(1, 8, 4, 4)
    up = lambda t: torch.nn.functional.interpolate(t, scale_factor=2.0, mode="nearest")  # noqa: E731

    def card(t, cid):
        c = captured(lambda: up(t), lambda op: "upsample" in op)
        return dataclasses.replace(brief(c.op, c.signature, c.outputs, card_id=cid), samples=1)

    nchw, cl = card(x, "nchw0000"), card(x.contiguous(memory_format=torch.channels_last), "cl000000")
    assert set(channels_last_twins([nchw])) == {"nchw0000"}       # alone: a twin
    assert channels_last_twins([nchw, cl]) == {}                   # the model's own channels-last card is the call


def test_a_chain_twin_is_counted_with_its_original():
    """A GroupNorm -> SiLU chain's channels-last twin makes the same calls as its original: one key for shares
    (reproduce's covered share, the run table's 'twin of') as for an op's twin; another chain's stays its own."""
    from engine.capture.twins import call_key, twins_among

    x = {"name": "in0", "kind": "tensor", "dtype": "bfloat16", "shape": [1, 64, 8, 8], "stride": [4096, 64, 8, 1]}
    nodes = [{"op": "aten::native_group_norm", "args": [{"tensor": ["in", 0]}]},
             {"op": "aten::silu", "args": [{"tensor": ["node", 0]}]}]
    plain = {"op": "kforge::chain", "args": [x], "chain": {"nodes": nodes}}
    twin = {**plain, "args": [{**x, "stride": [4096, 1, 512, 64]}], "twin_of": "p"}
    relu = {**plain, "chain": {"nodes": [{**nodes[0]}, {"op": "aten::relu", "args": [{"tensor": ["node", 0]}]}]}}
    relu_cl = {**relu, "args": twin["args"]}
    assert call_key("kforge::chain", plain) == call_key("kforge::chain", twin)
    assert call_key("kforge::chain", relu) != call_key("kforge::chain", relu_cl)  # no twin kernel: another call
    cards = [("p", "kforge::chain", plain), ("t", "kforge::chain", json.dumps(twin)), ("r", "kforge::chain", relu),
             ("rc", "kforge::chain", relu_cl)]
    assert twins_among(cards) == {"t": "p"}
