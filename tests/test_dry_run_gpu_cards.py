"""A dry run on a CPU capture proposes for the GPU's calls (issue 24, item 5): CUDA's outputs, CPU-only ops
not proposed with the reason said, shares from a roofline on the named GPU, and never a silent 'done'."""

import json

import pytest
import torch
from conftest import ROOT

from engine.capture.signature import bind_arguments, describe_tensor, signature_of
from engine.cards import card_from_row
from engine.propose.hardware_profiles import profile
from engine.run.as_gpu import CPU_ONLY, CUDA_OUTPUT_OVERRIDES, estimated_us, gpu_row, gpu_shares, is_cpu_only

A = torch.ops.aten


def _cpu_card(op, *args, run: bool = True):
    """The card row a CPU capture records for one call (its signature and the CPU's outputs). With run=False
    the outputs' layout comes from the op's meta kernel, for a test that reads only the signature: ResNet's
    float16 3x3 convolution took 13 s on a CI core."""
    bound = bind_arguments(op, args, {})
    if run:
        out = op(*args)
    else:
        meta = op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
        out = tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
                    for t in (meta if isinstance(meta, tuple) else (meta,)))
    outs = [describe_tensor(t) for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
    return {"card_id": "c1", "op": op.name(), "signature": signature_of(op, bound), "outputs": outs,
            "bytes": 1000, "calls": 1, "share": 1.0}


def _triples(outs):
    return [(o["dtype"], o["shape"], o["stride"]) for o in outs]


def test_layer_norm_statistics_are_float32_on_cuda_where_the_cpu_records_bf16():
    x, w = torch.randn(2, 8, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    row = _cpu_card(A.native_layer_norm.default, x, [64], w, w, 1e-5)
    assert [o["dtype"] for o in row["outputs"]] == ["bfloat16"] * 3  # what the CPU records
    g = gpu_row(row)
    assert [o["dtype"] for o in g.row["outputs"]] == ["bfloat16", "float32", "float32"]
    assert {o["device"] for o in g.row["outputs"]} == {"cuda"}
    assert {a["device"] for a in g.row["signature"]["args"] if a.get("kind") == "tensor"} == {"cuda"}
    assert g.outputs_changed and g.not_proposed is None
    assert g.row["bytes"] > row["bytes"]  # float32 statistics are wider than the CPU's bf16 ones


def test_eval_batch_norm_returns_float32_statistics_per_channel_on_cuda():
    x = torch.randn(2, 16, 5, 5, dtype=torch.float16)
    w = torch.ones(16, dtype=torch.float16)
    row = _cpu_card(A.native_batch_norm.default, x, w, w, w.clone(), w.clone(), False, 0.1, 1e-5)
    assert _triples(row["outputs"])[1] == ("float16", [0], [1])  # the CPU's empty statistics
    outs = gpu_row(row).row["outputs"]
    assert _triples(outs)[1:] == [("float32", [16], [1]), ("float32", [16], [1])]


def test_channels_last_group_norm_output_is_contiguous_on_cuda():
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    w = torch.ones(8)
    row = _cpu_card(A.native_group_norm.default, x, w, w, 2, 8, 16, 2, 1e-5)
    assert row["outputs"][0]["stride"] == [128, 1, 32, 8]  # the CPU keeps channels-last
    assert gpu_row(row).row["outputs"][0]["stride"] == [128, 16, 4, 1]


def _to_cpu(x):
    if isinstance(x, dict):
        return {k: ("cpu" if k == "device" and v == "cuda" else _to_cpu(v)) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_cpu(v) for v in x]
    return x


@pytest.mark.parametrize("model", ["resnet50", "sd35_medium", "gemma4_e2b", "qwen35_a3b"])
def test_converted_cards_match_what_the_h200_recorded(model):
    """Every card of the H200 captures, made a CPU card, converts back to the outputs the H200 returned:
    the check behind CUDA_OUTPUT_OVERRIDES (the cuDNN attention entry) and behind needing no other."""
    doc = json.loads((ROOT / "docs" / "results" / "capture-h200" / f"{model}.json").read_text())
    wrong, overridden = [], set()
    for c in doc["cards"]:
        row = {"card_id": c["id"], "op": c["op"], "bytes": c["bytes"], "outputs": _to_cpu(c["outputs"]),
               "signature": _to_cpu({"op": c["op"], "args": c["args"], "aliases": c["aliases"]})}
        g = gpu_row(row)
        assert g.not_proposed is None, c["op"]
        if _triples(g.row["outputs"]) != _triples(c["outputs"]):
            wrong.append((c["op"], _triples(g.row["outputs"]), _triples(c["outputs"])))
        if c["op"] in CUDA_OUTPUT_OVERRIDES:
            overridden.add(c["op"])
    assert not wrong, wrong[:3]
    if model in ("sd35_medium", "gemma4_e2b", "qwen35_a3b"):
        assert "aten::_scaled_dot_product_cudnn_attention" in overridden


def test_cpu_only_ops_are_not_proposed_and_say_why():
    assert is_cpu_only("aten::_scaled_dot_product_flash_attention_for_cpu")
    assert is_cpu_only("aten::mkldnn_convolution")
    assert not is_cpu_only("aten::native_layer_norm") and not is_cpu_only("aten::relu_")
    q = torch.randn(1, 2, 8, 16)
    row = _cpu_card(A._scaled_dot_product_flash_attention_for_cpu.default, q, q, q)
    g = gpu_row(row)
    assert g.not_proposed == CPU_ONLY == "cpu-only op: the GPU runs a different op"


def test_shares_follow_the_gpu_roofline_not_the_cpu_clock():
    conv = card_from_row(_cpu_card(A.convolution.default, torch.randn(2, 256, 56, 56, dtype=torch.float16),
                                   torch.randn(256, 256, 3, 3, dtype=torch.float16), None, [1, 1], [1, 1], [1, 1],
                                   False, [0, 0], 1, run=False) | {"card_id": "conv", "share": 0.99, "bytes": 500_000})
    relu = card_from_row(_cpu_card(A.relu.default, torch.randn(2, 64, 28, 28, dtype=torch.float16))
                         | {"card_id": "relu", "share": 0.0005, "bytes": 400_000, "calls": 16})
    spark = profile("dgx-spark")
    got = {c.card_id: c for c in gpu_shares([conv, relu], spark)}
    assert got["conv"].share + got["relu"].share == pytest.approx(1.0)
    relu_us = 16 * 400_000 / spark.bandwidth_bps * 1e6  # memory bound: bytes over bandwidth
    assert got["relu"].share == pytest.approx(relu_us / (relu_us + estimated_us(conv, spark)))
    assert got["relu"].share > 0.1  # from 0.05 % on the CPU's clock to a card worth a kernel
    assert estimated_us(conv, spark) > 500_000 / spark.bandwidth_bps * 1e6  # the conv is FLOP-bound


SDPA_ONLY = '''
import torch


class Attn(torch.nn.Module):
    def forward(self, q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def build(device="cpu", dtype=torch.float32):
    return Attn().to(device), (torch.randn(1, 4, 64, 32, device=device, dtype=dtype),)
'''


class Ran:
    """What `kforge-tui ARGV` gave: exit code, stdout, stderr."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _dry_run(cli, tmp_path, config, *extra):
    """`run --dry-run` in this process (the cli fixture, as the other CLI tests): a fresh process spent ~4 s
    importing torch and Dynamo again."""
    return Ran(*cli("run", config, "--dry-run", "--no-tui", "--device", "cpu", "--json", "--workspace",
                    tmp_path / "ws", *extra))


def test_a_dry_run_of_only_cpu_only_ops_says_why_nothing_was_proposed(cli, tmp_path):
    (tmp_path / "attn.py").write_text(SDPA_ONLY)
    (tmp_path / "attn.toml").write_text('name = "attn"\nbuilder = "attn.py:build"\n')
    r = _dry_run(cli, tmp_path, tmp_path / "attn.toml", "--iterations", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["proposals"] == 0
    assert "nothing proposed" in doc["nothing_proposed"] and CPU_ONLY in doc["nothing_proposed"]
    assert f"kforge: {doc['nothing_proposed']}" in r.stderr
    cpu_cards = [c for c in doc["cards"] if c["op"].endswith("_for_cpu")]
    assert cpu_cards and all(c["note"] == CPU_ONLY and c["stopped"] == "declined" for c in cpu_cards)


@pytest.mark.slow
def test_resnet50_small_dry_run_on_the_cpu_proposes_batch_norm_and_relu(cli, tmp_path):
    r = _dry_run(cli, tmp_path, ROOT / "configs" / "models" / "resnet50.toml", "--small", "--iterations", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["proposals"] > 0, doc.get("nothing_proposed")
    proposed = {c["op"] for c in doc["cards"] if c["candidates"]}
    assert "aten::native_batch_norm" in proposed and "aten::relu_" in proposed, proposed
    assert "shares from a roofline" in r.stderr


def test_a_meta_kernel_that_raises_prints_nothing(capfd):
    # A float32 _grouped_mm's CUDA meta kernel raises (it takes bfloat16): FakeTensorMode logged 21 lines of
    # traceback per card of a dry run before fake_outputs took the raise as "keep the captured outputs".
    from engine.capture.fake_outputs import fake_outputs

    sig = {"args": [
        {"name": "self", "kind": "tensor", "dtype": "float32", "shape": [64, 64], "stride": [64, 1], "device": "cuda"},
        {"name": "mat2", "kind": "tensor", "dtype": "float32", "shape": [4, 64, 64], "stride": [4096, 1, 64],
         "device": "cuda"},
        {"name": "offs", "kind": "tensor", "dtype": "int32", "shape": [4], "stride": [1], "device": "cuda"}]}
    assert fake_outputs("aten::_grouped_mm", sig) is None
    out, err = capfd.readouterr()
    assert "Traceback" not in err + out and "failed while attempting to run meta" not in err + out
