"""Capture of the other reference models with --small: their characteristic ops become cards."""

from collections import Counter

import pytest
from conftest import CONFIGS, capture_json


def _capture(name, tmp_path, capsys):
    return capture_json(CONFIGS / "models" / f"{name}.toml", tmp_path, capsys, "--samples", "1")


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
