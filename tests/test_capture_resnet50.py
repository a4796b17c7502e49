"""ResNet-50 capture on the CPU: the real per-forward op counts, stable ids, bit-exact samples."""

import asyncio
import contextlib
import hashlib
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, OutErr, capture_json

from engine.capture.samples import load_sample
from engine.capture.wide_compute import WideCompute, widens
from engine.store import Store, db_path

CONFIG = CONFIGS / "models" / "resnet50.toml"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    doc = capture_json(CONFIG, ws, OutErr(), "--samples", "2")
    return ws, doc


def test_real_per_forward_counts(captured):
    _, doc = captured
    calls = Counter()
    for card in doc["cards"]:
        calls[card["op"]] += card["calls"]
    # 1 stem conv + 16 bottlenecks × 3 convs + 4 downsample convs = 53; a batch-norm after each;
    # relu_: 1 stem + 3 per bottleneck = 49; add_: one residual per bottleneck = 16.
    assert calls["aten::convolution"] == 53
    assert calls["aten::native_batch_norm"] == 53
    assert calls["aten::relu_"] == 49
    assert calls["aten::add_.Tensor"] == 16
    assert calls["aten::max_pool2d_with_indices"] == 1
    assert calls["aten::addmm"] == 1  # fc (linear decomposes to t + addmm under no_grad)
    # adaptive_avg_pool2d to 1x1 is a CompositeImplicitAutograd op that becomes mean.dim.
    (pool,) = [c for c in doc["cards"] if "avgpool" in c["module_paths"]]
    assert pool["op"] == "aten::mean.dim" and pool["calls"] == 1
    assert set(calls) == {"aten::convolution", "aten::native_batch_norm", "aten::relu_",
                          "aten::add_.Tensor", "aten::max_pool2d_with_indices", "aten::addmm",
                          "aten::mean.dim"}
    assert doc["total_calls"] == 174
    # No view, constructor or composite op became a card.
    assert not any(c["op"] in ("aten::view", "aten::t", "aten::linear", "aten::empty.memory_format")
                   for c in doc["cards"])
    assert doc["skipped"]["view"] >= 2


def test_json_document_shape(captured):
    _, doc = captured
    assert doc["model"] == "resnet50"
    assert doc["device"] == "cpu" and doc["dtype"] == "float16" and doc["small"] is True
    shares = [c["share"] for c in doc["cards"]]
    assert shares == sorted(shares, reverse=True)
    assert abs(sum(shares) - 1.0) < 1e-3
    for card in doc["cards"]:
        assert {"id", "op", "signature", "calls", "share", "bytes"} <= set(card)
        assert len(card["id"]) == 16 and card["bytes"] > 0
    conv = next(c for c in doc["cards"] if "conv1" in c["module_paths"] and c["op"] == "aten::convolution")
    # stem conv: 2x3x224x224 fp16 input, 64x3x7x7 weight, 2x64x112x112 output
    assert conv["bytes"] == 2 * (2 * 3 * 224 * 224 + 64 * 3 * 7 * 7 + 2 * 64 * 112 * 112)
    assert conv["signature"].startswith("f16[2,3,224,224], f16[64,3,7,7], None, stride=[2,2], padding=[3,3]")


def test_card_ids_are_stable_across_runs(captured, tmp_path, capsys):
    _, first = captured
    second = capture_json(CONFIG, tmp_path, capsys, "--samples", "0")
    assert {c["id"]: c["calls"] for c in first["cards"]} == {c["id"]: c["calls"] for c in second["cards"]}


def test_store_holds_capture_cards_and_sample_digests(captured):
    ws, doc = captured

    async def read():
        async with await Store.open(db_path(ws)) as store:
            cap = await store.latest_capture("resnet50")
            cards = await store.get_cards(cap["id"])
            samples = [s for c in cards for s in await store.get_samples(cap["id"], c["card_id"])]
            return cap, cards, samples

    cap, cards, samples = asyncio.run(read())
    assert cap["id"] == doc["capture"] and cap["total_calls"] == 174
    everything = doc["cards"] + doc.get("chains", [])  # chain cards are stored as cards too
    assert {c["card_id"] for c in cards} == {c["id"] for c in everything}
    assert len(samples) == sum(c["samples"] for c in everything) >= len(cards)
    for s in samples:
        data = (Path(ws) / s["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["sha256"]
    assert not list((Path(ws) / "samples").glob(".partial-*"))


def _card(doc, op, path):
    return next(c for c in doc["cards"] if c["op"] == op and path in c["module_paths"])


@pytest.mark.parametrize("op,path", [("aten::convolution", "conv1"), ("aten::relu_", "relu"),
                                     ("aten::add_.Tensor", "layer1.0"), ("aten::native_batch_norm", "bn1")])
def test_samples_replay_bit_exactly(captured, op, path):
    """Re-running the op on a loaded sample reproduces the stored eager output to the bit (computed as the
    capture did: in float32 where the sample's header says so, engine.capture.wide_compute)."""
    ws, doc = captured
    card = _card(doc, op, path)
    files = sorted((Path(ws) / "samples" / doc["capture"]).glob(f"{card['id']}.*.safetensors"))
    assert len(files) == card["samples"] >= 1
    sample = load_sample(files[0])
    args, kwargs = sample.call_args()
    for (_name, value), spec in zip(sample.args, card["args"]):
        if spec["kind"] == "tensor" and not spec.get("absent"):
            assert list(value.shape) == spec["shape"] and list(value.stride()) == spec["stride"]
            assert str(value.dtype) == "torch." + spec["dtype"]
    packet = getattr(torch.ops.aten, op.split("::")[1].split(".")[0])
    overload = getattr(packet, op.split(".")[1] if "." in op else "default")
    if op == "aten::relu_":
        assert (args[0] < 0).any(), "sample must hold the pre-call state of an in-place op"
    widened = op == "aten::convolution" and widens(torch.device("cpu"), torch.float16)
    assert (sample.meta.get("compute") == "float32") == widened
    with WideCompute() if sample.meta.get("compute") == "float32" else contextlib.nullcontext():
        out = overload(*args, **kwargs)
    expected = sample.outputs if isinstance(sample.outputs, list) else [sample.outputs]
    got = list(out) if isinstance(out, (tuple, list)) else [out]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.stride() == e.stride() and g.dtype == e.dtype
        assert torch.equal(bits(g), bits(e))


def bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


def test_human_table_lists_every_card(captured, tmp_path, cli):
    code, out, err = cli("capture", CONFIGS / "models" / "resnet50.toml", "--small", "--device", "cpu",
                         "--samples", "0", "--workspace", tmp_path)
    assert code == 0, err
    assert "resnet50 on cpu (float16, small): 54 cards, 174 calls per forward" in out
    lines = [ln for ln in out.splitlines() if "aten::" in ln]
    assert len(lines) == 54
    assert any("aten::max_pool2d_with_indices" in ln and "kernel_size=[3,3]" in ln for ln in lines)
