"""scripts/bench_decode.py on the CPU with the stand-in for torch.cuda.graph: the control flow (a class whose
routes replay with a static cache, the same tokens, the report), not a measurement."""

from __future__ import annotations

import json

from conftest import load_script
from test_cast_graph_routes import StandIn


def test_decoding_with_a_static_cache_replays_the_decoder_layers_and_keeps_the_tokens(tmp_path, monkeypatch):
    bench = load_script("bench_decode")
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "BACKEND", StandIn())
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--model", "configs/models/qwen35_a3b.toml", "--small", "--prompt", "8",
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
    assert bench.main(["--out", str(out), "--model", "configs/examples/gemma4_e2b_decode.toml", "--small",
                       "--prompt", "8", "--tokens", "3", "--rounds", "1", "--cache", "dynamic",
                       "--cast", str(cast)]) == 0
    doc = json.loads((out / "bench_decode.json").read_text())
    assert doc["arms"] == ["eager", "cast"] and doc["cache"] == "dynamic" and doc["cast_same_tokens"] is True
    assert doc["cast_installed"] is False and "routed_class" not in doc
    md = (out / "bench_decode.md").read_text()
    assert "dynamic KV cache" in md and "| eager + cast (NOT installed; 0 hits per generate()) |" in md
    assert bench.main(["--out", str(out), "--model", "configs/examples/gemma4_e2b_decode.toml",
                       "--cast", str(tmp_path / "none.cast")]) == 2
