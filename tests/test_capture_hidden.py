"""Hidden calls (engine/capture/hidden.py): the bias add a CUDA convolution makes after cuDNN, as a card.

sd35_medium's VAE decode spent 7.3 ms of its 52 ms of kernels in 63 of these `add_` calls, at half a copy's rate,
and no card held them: the capture sees `aten::convolution` only (H100, docs/results/sd35-layout-2026-12-06d/).
On the CPU the convolution adds its bias itself, so these tests build the card from a CPU capture of the
convolution described as a CUDA one, and check that its signature is exactly what a capture of the real
`add_` records: the key a cast's route at the CUDA key compares that call with."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from card_helpers import brief, captured, cudaify

from engine.capture.hidden import HIDDEN_OP, bias_card, hidden_cards, hidden_in, hidden_shares, makers_of
from engine.capture.run import CaptureResult
from engine.capture.samples import load_sample, save_sample, snapshot_inputs, snapshot_outputs
from engine.capture.signature import bind_arguments, signature_of

ADD_ = torch.ops.aten.add_.Tensor
CONV = torch.ops.aten.convolution.default


def _conv(dtype=torch.bfloat16, bias=True, shape=(1, 8, 6, 5), layout=torch.contiguous_format):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype).contiguous(memory_format=layout)
    w = torch.randn(16, shape[1], 3, 3).to(dtype)
    b = torch.randn(16).to(dtype) if bias else None
    c = captured(lambda: F.conv2d(x, w, b, padding=1), lambda o: o == "aten::convolution")
    card = dataclasses.replace(brief(c.op, c.signature, c.outputs, card_id="conv0"), samples=2, calls=5,
                               share=0.04, capture_us=100.0)
    return card, (x, w, b)


def _write_sample(path, x, w, b):
    """A sample file of the convolution's call, as the capture writes one; its output."""
    bound = bind_arguments(CONV, (x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {})
    y = CONV(*[v for _, v in bound])
    snap, layout = snapshot_inputs(bound)
    out_layout, mutated = snapshot_outputs(snap, y, {})
    save_sample(path, snap, {"op": "aten::convolution", "card": "conv0", "inputs": layout, "outputs": out_layout,
                             "mutated": mutated})
    return y


def _real_add_signature(y, b):
    """What a capture records for the add_ itself, on a CUDA tensor of y's layout."""
    return cudaify(signature_of(ADD_, bind_arguments(ADD_, (y, b.reshape(1, -1, 1, 1)), {})))


def test_the_card_is_the_add_the_convolution_makes_in_both_layouts():
    card, (x, w, b) = _conv()
    y = F.conv2d(x, w, None, padding=1)
    h = bias_card(card)
    assert h.op == HIDDEN_OP and hidden_in(h.signature) == "conv0"
    assert {k: v for k, v in h.signature.items() if k != "hidden_in"} == _real_add_signature(y, b)
    assert h.outputs == [{k: v for k, v in h.signature["args"][0].items() if k != "name"}]   # returns self
    assert (h.calls, h.share, h.samples) == (5, 0.04, 2)
    assert h.signature_text.startswith("bf16[1,16,6,5], bf16[1,16,1,1], alpha=1")
    cl = bias_card(card, channels_last=True)
    want = _real_add_signature(y.contiguous(memory_format=torch.channels_last), b)
    assert {k: v for k, v in cl.signature.items() if k != "hidden_in"} == want
    assert cl.card_id != h.card_id
    assert set(hidden_cards([card], channels_last=True)) == {h.card_id, cl.card_id}
    assert set(hidden_cards([card])) == {h.card_id}
    assert hidden_cards([card, h]) == {}   # a card already


def test_none_where_there_is_no_such_call():
    card, _ = _conv()
    assert bias_card(_conv(bias=False)[0]) is None
    assert bias_card(dataclasses.replace(card, samples=0)) is None            # nothing to derive samples from
    cpu = dataclasses.replace(card, signature={**card.signature, "args": [
        {**a, "device": "cpu"} if a.get("name") == "input" else a for a in card.signature["args"]]})
    assert bias_card(cpu) is None                                            # the CPU adds the bias in the kernel
    assert bias_card(_conv(dtype=torch.float64)[0]) is None
    assert bias_card(dataclasses.replace(card, op="aten::mm")) is None
    # a channels-last capture has no second, channels-last form
    assert bias_card(_conv(layout=torch.channels_last)[0], channels_last=True) is None


@pytest.mark.parametrize("channels_last", [False, True])
def test_its_samples_are_the_convolutions_output_and_bias(tmp_path, channels_last):
    card, (x, w, b) = _conv()
    y = _write_sample(tmp_path / "s.safetensors", x, w, b)
    h = bias_card(card, channels_last=channels_last)
    s = load_sample(tmp_path / "s.safetensors", "cpu", h.signature)
    names = [n for n, _ in s.args]
    assert names == ["self", "other", "alpha"] and s.outputs is None and s.mutated == {}
    me, other, alpha = (v for _, v in s.args)
    assert torch.equal(me, y) and list(me.stride()) == h.signature["args"][0]["stride"]
    assert torch.equal(other, b.reshape(1, -1, 1, 1)) and list(other.stride()) == [16, 1, 1, 1] and alpha == 1
    # the card's call, as a lane makes it: eager's add_ of the loaded arguments
    want = y + b.reshape(1, -1, 1, 1)
    assert torch.equal(ADD_(me, other, alpha=alpha), want)
    plain = load_sample(tmp_path / "s.safetensors", "cpu", card.signature)   # the convolution's own, unchanged
    assert [n for n, _ in plain.args][:3] == ["input", "weight", "bias"] and torch.equal(plain.outputs, y)


def test_convolutions_that_make_the_same_call_share_one_card():
    """A 16 -> 16 and an 8 -> 16 convolution both add a bias into bf16[1,16,6,5]: one card of that call (two
    would share a guard key, and a cast routes only the first: on the H100 the export left 10 of sd35_medium's
    26 bias-add cards out, "the guard did not match the variant's own inputs"), with both convolutions' calls and
    shares, the first one's samples, and each share part counted once its eager time is known."""
    a, _ = _conv()
    b, _ = _conv(shape=(1, 16, 6, 5))
    b = dataclasses.replace(b, card_id="conv1", calls=3, share=0.02, capture_us=50.0,
                            module_paths={"up.conv1": 3})
    assert {k: v for k, v in bias_card(a).signature.items() if k != "hidden_in"} == \
        {k: v for k, v in bias_card(b).signature.items() if k != "hidden_in"}
    found = hidden_cards([a, b], channels_last=True)
    assert len(found) == 2                                      # one per layout, not per convolution
    for h in found.values():
        assert makers_of(h.signature) == ["conv0", "conv1"] and hidden_in(h.signature) == "conv0"
        assert (h.calls, h.share, h.samples) == (8, pytest.approx(0.06), 2)
        assert h.module_paths["up.conv1"] == 3
        timed = dataclasses.replace(h, eager_us=25.0)
        assert hidden_shares([a, b, timed])[2].share == pytest.approx(0.04 * 25 / 100 + 0.02 * 25 / 50)
    assert makers_of(bias_card(a).signature) == ["conv0"] and makers_of({"op": "x"}) == []


def test_its_share_is_its_part_of_the_convolutions_once_eager_is_timed():
    card, _ = _conv()
    h = bias_card(card)
    assert hidden_shares([card, h])[1].share == 0.04   # not timed yet: the convolution's (an upper bound)
    timed = dataclasses.replace(h, eager_us=40.0)
    assert hidden_shares([card, timed])[1].share == pytest.approx(0.04 * 40 / 100)
    slow = dataclasses.replace(h, eager_us=400.0)   # timed alone slower than the whole call was captured
    assert hidden_shares([card, slow])[1].share == 0.04
    assert hidden_shares([timed])[0].share == 0.04  # its convolution not among the cards: left as it is


def test_a_capture_counts_its_calls_in_the_convolutions_and_gives_it_their_samples():
    card, _ = _conv()
    h = bias_card(card)
    r = CaptureResult(capture_id="c", model="m", device="cuda", dtype="bfloat16", small=False, wall_s=1.0,
                      cards=[card, h], skipped={}, notes={}, sample_dir="s", hidden={h.card_id: "conv0"})
    assert r.total_calls == 5
    assert r.shares_samples_of(h.card_id) == "conv0" and r.shares_samples_of("conv0") == "conv0"
    assert r.to_json()["hidden"] == {h.card_id: "conv0"}


def test_the_h200_captures_bias_adds_are_taken_by_the_builtin_proposer_and_compile():
    """Every convolution with a bias in the shipped H200 captures (the SD3.5 VAE's among them): its bias add, in
    its captured layout and channels-last, goes to the elementwise template with 8-wide vectors (where the
    channels come in eights) and compiles for sm_90."""
    from card_helpers import h200_cards
    from test_builtin_templates_norms import _compile_all

    from engine.propose.builtin.proposer import BuiltinProposer

    convs = [dataclasses.replace(c, samples=1) for c in h200_cards(lambda o: o == "aten::convolution")]
    cards = list(hidden_cards(convs, channels_last=True).values())
    assert len(cards) >= 16 and any(c.signature_text.startswith("bf16[1,128,1024,1024], bf16[1,128,1,1]")
                                    for c in cards)
    proposer, jobs = BuiltinProposer(), {}
    for card in cards:
        t, _ = proposer.template_for(card)
        assert t is not None and t.name == "elementwise", card.signature_text
        r = t.render(card, t.default(card))
        if card.signature["args"][1]["shape"][1] % 8 == 0:   # (conv_out's 3 channels, channels-last: no vector)
            assert r.params["vec"] == 8, (card.signature_text, r.params)
        jobs[r.source] = (card.signature_text, {r.spec.split('"')[1]})
    _compile_all(jobs)


def test_a_cuda_capture_adds_them_by_share_and_a_cpu_capture_not():
    from engine.capture.run import with_hidden_calls

    card, _ = _conv()
    other = dataclasses.replace(card, card_id="x", op="aten::mm", share=0.5)
    notes = {}
    cards, hidden = with_hidden_calls([other, card], "cuda", True, notes)
    assert [c.op for c in cards] == ["aten::mm", "aten::add_.Tensor", "aten::add_.Tensor", "aten::convolution"]
    assert set(hidden.values()) == {"conv0"} and len(hidden) == 2 and "2 card(s) of the bias add" in notes["hidden calls"]
    assert with_hidden_calls([other, card], "cuda", False, {})[1].keys() == {bias_card(card).card_id}
    notes = {}
    assert with_hidden_calls([other, card], "cpu", True, notes) == ([other, card], {}) and notes == {}


def test_the_lanes_verification_takes_the_card_on_its_derived_samples(tmp_path):
    """What a lane checks a candidate for the card by (engine.verify.pipeline.card_check on the samples the
    loader derives): eager's add_ itself passes every input set; a kernel that returns the sum without writing
    it into `self` fails (eager leaves `self` written), as does one that adds the bias of the wrong channel."""
    from engine.verify.pipeline import card_check

    card, (x, w, b) = _conv()
    _write_sample(tmp_path / "s.safetensors", x, w, b)
    h = bias_card(card)
    check = card_check(HIDDEN_OP, h.signature, [load_sample(tmp_path / "s.safetensors", "cpu", h.signature).args])

    def eager(bd, prefill):
        return [bd[0][1].add_(bd[1][1])]

    def not_in_place(bd, prefill):
        return [bd[0][1] + bd[1][1]]

    def rolled(bd, prefill):
        return [bd[0][1].add_(bd[1][1].roll(1, 1))]

    v = check.check(eager)
    assert v.ok and v.sets_checked == len(check.sets) > 1, v.message
    assert not check.check(not_in_place).ok and not check.check(rolled).ok


def test_store_rows_count_it_at_its_part_of_the_convolution():
    """Tables and coverage sums read shares from the store, where a bias add holds its convolution's whole share
    (scripts/run_table.py, scripts/reproduce.py's coverage): `row_shares` gives its part once eager was timed."""
    import json

    from engine.capture.hidden import row_shares

    card, _ = _conv()
    h = dataclasses.replace(bias_card(card), eager_us=25.0)
    rows = {c.card_id: {**c.row(), "signature": json.dumps(c.signature), "eager_us": c.eager_us} for c in (card, h)}
    assert row_shares(rows) == {"conv0": 0.04, h.card_id: pytest.approx(0.01)}


def test_the_capture_report_says_where_its_share_is_counted():
    from engine.capture import report

    card, _ = _conv()
    h = bias_card(card)
    r = CaptureResult(capture_id="c", model="m", device="cuda", dtype="bfloat16", small=False, wall_s=1.0,
                      cards=[card, h], skipped={}, notes={}, sample_dir="s", hidden={h.card_id: "conv0"})
    assert report._share(r, h) == "inside" and report._share(r, card) == "4.0%"
    assert report._twin(r, h) == "  (the bias add inside convolution conv0)" and report._twin(r, card) == ""


def test_the_tuis_card_table_shows_a_hidden_calls_part_of_its_makers_share():
    """The TUI's cards screen reads a hidden call's share as the tables do: its part of its maker's once its
    eager time is known (it showed the convolution's whole share, the store's upper bound)."""
    import json
    import sqlite3

    from kforge_tui.launcher import demo_copy
    from kforge_tui.readmodel import ReadModel

    db = demo_copy()
    conn = sqlite3.connect(db)
    (maker, share), (hidden, hsig) = (
        conn.execute("SELECT card_id, share FROM cards ORDER BY share DESC").fetchone(),
        conn.execute("SELECT card_id, signature FROM cards ORDER BY share ASC").fetchone())
    assert maker != hidden and share > 0
    conn.execute("UPDATE cards SET capture_us = 200.0 WHERE card_id = ?", (maker,))
    conn.execute("UPDATE cards SET share = ?, eager_us = 50.0, signature = ? WHERE card_id = ?",
                 (share, json.dumps({**json.loads(hsig), "hidden_in": {"card": maker, "how": "convolution bias"}}),
                  hidden))
    conn.commit()
    conn.close()
    model = ReadModel(db)
    model.poll(model.runs()[0].id)
    assert model.cards[hidden].share == pytest.approx(share * 0.25)
    assert model.cards[maker].share == pytest.approx(share)
    model.close()
