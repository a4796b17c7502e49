"""Capture of the other reference models with --small: their characteristic ops become cards."""

from collections import Counter

import pytest
from conftest import CONFIGS, capture_json


def _capture(name, tmp_path, capsys):
    return capture_json(CONFIGS / "models" / f"{name}.toml", tmp_path, capsys, "--samples", "0")


def _calls(doc, where=""):
    c = Counter()
    for card in doc["cards"]:
        n = sum(v for p, v in card["module_paths"].items() if p.startswith(where))
        if n:
            c[card["op"]] += n
    return c


def test_sd35_medium(tmp_path, capsys):
    doc = _capture("sd35_medium", tmp_path, capsys)
    vae, mmdit = _calls(doc, "vae."), _calls(doc, "transformer.")
    # VAE decoder: group_norm before every conv of its resnets, mid-block attention and the output.
    assert vae["aten::native_group_norm"] >= 20
    assert vae["aten::convolution"] >= 20
    assert vae["aten::silu"] >= 20
    sdpa = [op for op in mmdit if "scaled_dot_product" in op]
    assert sdpa, "MMDiT attention must be captured as its SDPA kernel"
    # 24 joint attentions (one per block) + 13 image-only attentions of the dual-attention blocks.
    assert sum(mmdit[op] for op in sdpa) == 24 + 13
    assert mmdit["aten::native_layer_norm"] > 0
    # The three blocks are scaled to the 24 of the real model: block 0 ×13, block 1 ×10, block 2 ×1.
    per_block = Counter()
    for card in doc["cards"]:
        for path, n in card["module_paths"].items():
            if path.startswith("transformer.transformer_blocks.") and "ff.net" in path:
                per_block[path.split(".")[2]] += n
    assert per_block["0"] / per_block["1"] == pytest.approx(13 / 10)
    assert doc["dtype"] == "bfloat16"


def test_gemma4_e2b(tmp_path, capsys):
    doc = _capture("gemma4_e2b", tmp_path, capsys)
    calls = _calls(doc)
    assert any("scaled_dot_product" in op for op in calls), sorted(calls)
    # RMS norms (as their decomposed mean/rsqrt/mul or the fused op), GELU-tanh MLPs, big vocab logits.
    assert calls["aten::gelu"] > 0 or calls.get("aten::gelu_", 0) > 0
    assert any(op in calls for op in ("aten::rsqrt", "aten::_fused_rms_norm", "aten::mean.dim"))
    assert calls["aten::tanh"] > 0  # final_logit_softcapping
    # Layers scale to the 35 of the real model: the MLP down projection runs once per layer.
    downs = sum(n for c in doc["cards"] for p, n in c["module_paths"].items() if p.endswith("mlp.down_proj"))
    assert downs == 35
    assert any(c["signature"].endswith("262144]") or "262144" in c["signature"] for c in doc["cards"])


def test_qwen35_a3b_moe(tmp_path, capsys):
    doc = _capture("qwen35_a3b", tmp_path, capsys)
    calls = _calls(doc)
    # MoE routing: softmax over 256 experts and top-8; experts as grouped GEMMs (2 per layer × 40).
    assert calls["aten::topk"] == 40
    router = [c for c in doc["cards"] if c["op"] in ("aten::_softmax", "aten::softmax.int")
              and any(".mlp.gate" in p for p in c["module_paths"])]
    assert router and "256]" in router[0]["signature"]
    assert calls["aten::_grouped_mm"] == 80
    # Gated DeltaNet's depthwise causal conv1d (kernel 4) in the 30 linear-attention layers.
    convs = [c for c in doc["cards"] if c["op"] == "aten::convolution" and "groups=" in c["signature"]]
    assert sum(c["calls"] for c in convs) == 30
