"""scripts/bench_decode.py on the CPU with the stand-in for torch.cuda.graph: the control flow (a class whose
routes replay with a static cache, the same tokens, the report), not a measurement."""

from __future__ import annotations

import json

from conftest import load_script
from test_cast_graph_routes import StandIn

# Qwen3.5's layers as the shipped builder makes them ([linear_attention x3, full_attention], Gated DeltaNet, gated
# attention, top-k MoE experts, grouped_mm) at test widths: the control flow is the same; at the real widths
# (qwen35_a3b --small) the bfloat16 depthwise conv1d over 8192 channels alone took 60 of 84 s on a CPU core.
TINY_QWEN = """
import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from engine.models.random_init import random_model
from engine.models.target import CaptureTarget


def build(device, dtype):
    config = Qwen3_5MoeTextConfig(vocab_size=64, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                  head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                                  linear_num_key_heads=2, linear_num_value_heads=2, num_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=8, shared_expert_intermediate_size=8,
                                  num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                                  attn_implementation="sdpa", experts_implementation="grouped_mm")
    model = random_model(Qwen3_5MoeForCausalLM, config, device=device, dtype=dtype, seed=0)
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0)).to(device)
    return CaptureTarget(module=model, forward=lambda: model(input_ids=ids))
"""


def _tiny_qwen(tmp_path):
    (tmp_path / "tiny_qwen.py").write_text(TINY_QWEN)
    config = tmp_path / "tiny_qwen.toml"
    config.write_text('name = "tiny_qwen"\nbuilder = "tiny_qwen.py:build"\n[dtype]\ncpu = "bfloat16"\ncuda = "bfloat16"\n')
    return config


def test_decoding_with_a_static_cache_replays_the_decoder_layers_and_keeps_the_tokens(tmp_path, monkeypatch):
    bench = load_script("bench_decode")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "BACKEND", StandIn())
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--model", str(_tiny_qwen(tmp_path)), "--prompt", "8",
                       "--tokens", "4", "--rounds", "1"]) == 0
    doc = json.loads((out / "bench_decode.json").read_text())
    assert doc["routed_class"] == "Qwen3_5MoeDecoderLayer" and doc["same_tokens"] is True
    r = doc["routes"]
    assert r["modules"] == 4 and r["replaying"] == 4 and r["replays"] >= 4 * 2
    md = (out / "bench_decode.md").read_text()
    assert "| graph routes (Qwen3_5MoeDecoderLayer) |" in md and md.count("| True |") == 1 and "control flow only" in md
    assert "compiled_ms" not in doc  # transformers compiles decoding on a GPU only: no such arm off it


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys):
    bench = load_script("bench_decode")
    base = ["--out", str(tmp_path), "--model", "configs/models/qwen35_a3b.toml"]
    assert bench.main([*base, "--tokens", "1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --tokens must be at least 2, --prompt and --rounds at least 1"
    assert bench.main([*base, "--modules", "(("]) == 2
    assert capsys.readouterr().err.startswith("error: --modules '((': not a regular expression")


def test_a_class_that_does_not_replay_is_reported_with_why():
    bench = load_script("bench_decode")
    doc = {"model": "m.toml", "prompt": 8, "tokens": 4, "gpu": "NVIDIA H200", "torch": "2.11", "transformers": "5.0",
           "trials": {"DecoderLayer": {"modules": 4, "replaying": 0, "replays": 0, "eager_calls": 12,
                                       "declines": {"a tensor attribute changed": 8},
                                       "refused": ["a host sync during capture"]}},
           "error": "no class of ['DecoderLayer'] replays with a static cache"}
    md = bench.report(doc)
    assert ("- DecoderLayer: 0 of 4 replaying; declines {'a tensor attribute changed': 8}; refused a host sync "
            "during capture; eager calls 12") in md
    assert "transformers 5.0" in md and md.rstrip().endswith("replays with a static cache")


def test_a_cast_arm_with_transformers_default_cache(tmp_path, monkeypatch):
    """--cache dynamic --cast FILE: eager generate() with the cast installed against eager, with the cache
    generate() uses by default (no routes: a growing cache declines them; no compiled arm: transformers
    compiles only a static cache's decoding). Off the GPU the cast is not installed, and the report says so."""
    from test_cast_modules import _write

    bench = load_script("bench_decode")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    out = tmp_path / "out"
    cast = _write(tmp_path)
    # the test-width Qwen3.5 above: gemma4_e2b_decode --small spent ~10 s of 12 s on CI building and decoding
    assert bench.main(["--out", str(out), "--model", str(_tiny_qwen(tmp_path)),
                       "--prompt", "8", "--tokens", "3", "--rounds", "1", "--cache", "dynamic",
                       "--cast", str(cast)]) == 0
    doc = json.loads((out / "bench_decode.json").read_text())
    assert doc["arms"] == ["eager", "cast"] and doc["cache"] == "dynamic" and doc["cast_same_tokens"] is True
    assert doc["cast_installed"] is False and "routed_class" not in doc
    md = (out / "bench_decode.md").read_text()
    assert "dynamic KV cache" in md and "| eager + cast (NOT installed; 0 hits per generate()) |" in md
    assert bench.main(["--out", str(out), "--model", "configs/examples/gemma4_e2b_decode.toml",
                       "--cast", str(tmp_path / "none.cast")]) == 2
