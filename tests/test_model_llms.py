"""Gemma 4 E2B and Qwen3.5-35B-A3B reference builders: small (CPU) builds have the real layer kinds and widths."""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

os.environ["HF_HUB_OFFLINE"] = "1"  # random weights from configs only; never reach the hub

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("transformers")

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "models"
CPU = torch.device("cpu")
# The forward here runs on 16 tokens rather than the [small] table's 128 (Gemma) or 64 (Qwen): nothing checked
# here depends on the length, and the capture tests run the small configs as shipped (test_capture_models,
# test_capture_chains). Gemma's bfloat16 matmuls over 128 tokens took most of its 19 s on a CI core.
SEQ_LEN = 16


def _load(name: str):
    """(config table, builder, small params, cpu dtype) for configs/models/<name>.toml."""
    config = tomllib.loads((CONFIGS / f"{name}.toml").read_text())
    module_name, func_name = config["builder"].split(":")
    builder = getattr(importlib.import_module(module_name), func_name)
    params = {**config["params"], **config.get("small", {})}
    assert set(params) <= set(inspect.signature(builder).parameters), "config params the builder does not take"
    return config, builder, params, getattr(torch, config["dtype"]["cpu"])


def _check_logits(out, seq_len: int, vocab: int) -> torch.Tensor:
    logits = out.logits
    assert logits.shape == (1, seq_len, vocab)
    assert torch.isfinite(logits).all()
    assert logits.float().std() > 0
    return logits


def test_gemma4_e2b_small_build():
    config, build, params, dtype = _load("gemma4_e2b")
    target = build(device=CPU, dtype=dtype, **{**params, "seq_len": SEQ_LEN})
    model = target.module
    text = model.config
    layers = model.model.layers

    # Real E2B widths (the class defaults are a different model).
    assert text.hidden_size == 1536 and text.vocab_size == 262_144
    assert text.num_attention_heads == 8 and text.final_logit_softcapping == 30.0
    assert text.hidden_size_per_layer_input == 256 and text.sliding_window == 512
    assert model.lm_head.weight is model.model.embed_tokens.weight

    # One layer of each kind, in this order: sliding/own K/V, full/own K/V, sliding/shared, full/shared.
    kinds = [(layer.self_attn.layer_type, bool(layer.self_attn.is_kv_shared_layer)) for layer in layers]
    assert kinds == [("sliding_attention", False), ("full_attention", False),
                     ("sliding_attention", True), ("full_attention", True)]
    for layer, (layer_type, shared) in zip(layers, kinds):
        head_dim = 512 if layer_type == "full_attention" else 256
        attn = layer.self_attn
        assert attn.head_dim == head_dim
        assert attn.q_proj.weight.shape == (8 * head_dim, 1536)
        assert attn.o_proj.weight.shape == (1536, 8 * head_dim)
        if shared:
            assert not hasattr(attn, "k_proj")
        else:
            assert attn.k_proj.weight.shape == (1 * head_dim, 1536)  # one KV head
            assert attn.v_proj.weight.shape == (1 * head_dim, 1536)
        intermediate = 12288 if shared else 6144
        assert layer.mlp.intermediate_size == intermediate
        assert layer.mlp.gate_proj.weight.shape == (intermediate, 1536)
        assert layer.mlp.down_proj.weight.shape == (1536, intermediate)
        assert layer.per_layer_input_gate.weight.shape == (256, 1536)
    assert all(p.dtype == dtype for p in model.parameters())

    # Multiplicities: config == builder, covering the real 35 layers (12 + 3 + 16 + 4).
    assert dict(target.multiplicity) == config["multiplicity"]
    assert dict(target.multiplicity) == {"model.layers.0": 12, "model.layers.1": 3,
                                         "model.layers.2": 16, "model.layers.3": 4}
    assert sum(target.multiplicity.values()) == 35
    assert "sdpa" in target.notes["attention"] and "per_layer_model_projection" in target.notes["shrink"]

    logits = _check_logits(target.forward(), SEQ_LEN, 262_144)
    assert logits.abs().max() <= 30.0  # final logit soft-capping
    del target, model, layers, logits
    gc.collect()


@pytest.mark.slow
def test_qwen35_a3b_small_build():
    config, build, params, dtype = _load("qwen35_a3b")
    target = build(device=CPU, dtype=dtype, **{**params, "seq_len": SEQ_LEN})
    model = target.module
    text = model.config
    layers = model.model.layers

    assert text.hidden_size == 2048 and text.vocab_size == 248_320
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert model.lm_head.weight.shape == (248_320, 2048)
    assert [hasattr(layer, "linear_attn") for layer in layers] == [True, True, True, False]

    for layer in layers[:3]:  # Gated DeltaNet: 16 key heads, 32 value heads of 128, conv k=4
        gdn = layer.linear_attn
        assert gdn.in_proj_qkv.weight.shape == (2 * 16 * 128 + 32 * 128, 2048)
        assert gdn.in_proj_z.weight.shape == (32 * 128, 2048)
        assert gdn.in_proj_a.weight.shape == (32, 2048) and gdn.in_proj_b.weight.shape == (32, 2048)
        assert gdn.conv1d.weight.shape == (8192, 1, 4) and gdn.conv1d.groups == 8192
        assert gdn.out_proj.weight.shape == (2048, 32 * 128)
    attn = layers[3].self_attn  # gated full attention: q_proj carries the output gate
    assert attn.q_proj.weight.shape == (2 * 16 * 256, 2048)
    assert attn.k_proj.weight.shape == (2 * 256, 2048) and attn.v_proj.weight.shape == (2 * 256, 2048)
    assert attn.o_proj.weight.shape == (2048, 16 * 256)
    for layer in layers:  # all 256 experts, top-8, expert and shared-expert MLP 512
        moe = layer.mlp
        assert moe.gate.weight.shape == (256, 2048) and moe.gate.top_k == 8
        assert moe.experts.gate_up_proj.shape == (256, 2 * 512, 2048)
        assert moe.experts.down_proj.shape == (256, 2048, 512)
        assert moe.shared_expert.gate_proj.weight.shape == (512, 2048)
        assert moe.shared_expert_gate.weight.shape == (1, 2048)
    assert all(p.dtype == dtype for p in model.parameters())

    assert dict(target.multiplicity) == config["multiplicity"]
    assert dict(target.multiplicity) == {f"model.layers.{i}": 10 for i in range(4)}
    assert sum(target.multiplicity.values()) == 40
    assert text._experts_implementation == params["experts_implementation"]
    assert params["experts_implementation"] in target.notes["experts"]

    _check_logits(target.forward(), SEQ_LEN, 248_320)
    del target, model, layers, attn
    gc.collect()
