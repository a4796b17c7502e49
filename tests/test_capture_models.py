"""Capture of the other reference models with --small: their characteristic ops become cards."""

import re
from collections import Counter

import pytest
from conftest import CONFIGS, capture_json


def _capture(name, tmp_path, capsys, seq_len=None):
    """The model's --small capture; with `seq_len`, of a copy of its config whose [small] table sets that length."""
    config = CONFIGS / "models" / f"{name}.toml"
    if seq_len is not None:
        text, n = re.subn(r"(?m)(^\[small\]\nseq_len = )\d+$", rf"\g<1>{seq_len}", config.read_text())
        assert n == 1, f"{config}: no [small] seq_len to replace"
        config = tmp_path / config.name
        config.write_text(text)
    return capture_json(config, tmp_path, capsys, "--samples", "0")


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


@pytest.mark.xdist_group("gemma_small_capture")
def test_gemma4_e2b(gemma_small_capture):
    # The small config's capture as shipped, which test_capture_chains reads too (conftest makes it once): a
    # capture of its own at 16 tokens took 10.9 s on a CI core; what is checked does not depend on the length
    _, doc = gemma_small_capture
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
    # 16 tokens rather than --small's 64: the calls, experts and shapes checked do not depend on the length (the
    # router's softmax is over 256 experts whatever the tokens). The bfloat16 logits (64 x 2048 x 248320) and
    # expert GEMMs over 64 tokens took ~25 s of its 33 s on a CI core.
    doc = _capture("qwen35_a3b", tmp_path, capsys, seq_len=16)
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
    # --small: the 4 layers' experts read one set of weights (same calls and shapes as with 4 sets)
    assert "every layer's experts read model.layers.0's expert weights" in doc["notes"]["weights"]


def test_qwen_experts_shared_before_any_weight_is_filled(monkeypatch):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    from engine.models import random_init
    from engine.models.qwen35 import share_experts
    from engine.models.random_init import random_model

    order = []
    fill = random_init._fill_random_
    monkeypatch.setattr(random_init, "_fill_random_",
                        lambda params, **k: (order.append(len(params)), fill(params, **k)))

    config = Qwen3_5MoeTextConfig(vocab_size=64, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                                  linear_num_key_heads=2, linear_num_value_heads=2, num_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=8, shared_expert_intermediate_size=8,
                                  num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    def before_fill(model):
        experts = model.model.layers[1].mlp.experts
        assert not order  # nothing filled yet: the dropped experts' memory is never written
        assert share_experts(model) == experts.gate_up_proj.nbytes + experts.down_proj.nbytes
        order.append("shared")

    model = random_model(Qwen3_5MoeForCausalLM, config, device=torch.device("cpu"), dtype=torch.float32, seed=0,
                         before_fill=before_fill)
    assert order[0] == "shared" and len(order) == 2
    a, b = (layer.mlp.experts for layer in model.model.layers)
    assert a.gate_up_proj is b.gate_up_proj and a.down_proj is b.down_proj
    assert a.gate_up_proj.std().item() > 0  # filled once, as the shared weight it is
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == (1, 3, 64)


def test_gemma_rotary_tables_in_one_order_whatever_the_hash_seed():
    """transformers iterates a set of layer-type strings to make Gemma's rotary tables; the set's order (and
    so the capture's rotary chain cards) followed PYTHONHASHSEED until the builder fixed one order."""
    import torch

    from engine.config import build_target, load_config

    model = build_target(load_config(CONFIGS / "models" / "gemma4_e2b.toml", small=True),
                         torch.device("meta")).module
    assert model.model.unique_layer_types == ["full_attention", "sliding_attention"]
