"""The reference builders' full depth (`full_depth=True`, for whole-model benchmarks): the real layer kinds and
counts, every layer built and none scaled. Built on the meta device: the real models are 5 to 35 billion
parameters, too large for a CPU test (a --small Gemma at full depth alone is ~9 GB of bf16 weights)."""

from __future__ import annotations

import os
from collections import Counter

os.environ["HF_HUB_OFFLINE"] = "1"  # random weights from configs only; never reach the hub

import pytest  # noqa: E402
import torch  # noqa: E402

from engine.config import build_target, load_config, override_params  # noqa: E402

META = torch.device("meta")  # modules and shapes, no memory


def _full_depth(name: str):
    """The shipped config `name` at --small size with full_depth=true, built on the meta device."""
    return build_target(override_params(load_config(name, small=True), {"full_depth": True}), META)


def test_gemma4_full_depth_config_is_the_real_35_layers():
    pytest.importorskip("transformers")
    from engine.models import gemma4

    config = gemma4.text_config(full_depth=True)
    assert config.num_hidden_layers == 35 and config.num_kv_shared_layers == 20
    assert list(config.layer_types) == list(gemma4.REAL_LAYER_TYPES)
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    kinds = Counter((t, i >= first_shared) for i, t in enumerate(config.layer_types))
    assert kinds == gemma4.real_layer_kinds()
    assert kinds == {("sliding_attention", False): 12, ("full_attention", False): 3,
                     ("sliding_attention", True): 16, ("full_attention", True): 4}
    # The per-layer-embedding width follows the layer count: at full depth it is the real one.
    assert config.num_hidden_layers * config.hidden_size_per_layer_input == 8960
    shrunk = gemma4.text_config()
    assert shrunk.num_hidden_layers == 4 and list(shrunk.layer_types) == gemma4.SMALL_LAYER_TYPES


def test_gemma4_built_at_full_depth_has_every_layer_and_no_multiplicity():
    pytest.importorskip("transformers")
    from engine.models import gemma4

    target = _full_depth("gemma4_e2b")
    model = target.module
    assert target.full_depth and dict(target.multiplicity) == {}  # the config's [multiplicity] is the shrunk one's
    assert Counter(gemma4.layer_kind(layer) for layer in model.model.layers) == gemma4.real_layer_kinds()
    assert model.model.embed_tokens_per_layer.weight.shape == (262_144, 35 * 256)
    assert "full-depth model" in target.notes["depth"] and "8960" in target.notes["depth"]
    assert target.notes["layers"].startswith("full depth: all 35 layers") and "shrink" not in target.notes


def test_qwen35_full_depth_is_the_real_40_layers():
    pytest.importorskip("transformers")
    from engine.models import qwen35

    config = qwen35.text_config(full_depth=True)
    assert config.num_hidden_layers == 40 and list(config.layer_types) == qwen35.REAL_LAYER_TYPES
    assert Counter(config.layer_types) == {"linear_attention": 30, "full_attention": 10}
    assert qwen35.text_config().num_hidden_layers == 4

    target = _full_depth("qwen35_a3b")
    layers = target.module.model.layers
    assert len(layers) == 40 and dict(target.multiplicity) == {} and target.full_depth
    assert ["linear_attention" if hasattr(la, "linear_attn") else "full_attention" for la in layers] \
        == qwen35.REAL_LAYER_TYPES
    assert target.notes["layers"].startswith("full depth: all 40 layers")


def test_sd35_full_depth_mmdit_is_the_real_24_blocks():
    pytest.importorskip("diffusers")
    from engine.models import sd35

    config = sd35.mmdit_config(full_depth=True)
    assert config["num_layers"] == 24 and tuple(config["dual_attention_layers"]) == tuple(range(13))
    kinds = sd35.block_kinds(config["num_layers"], config["dual_attention_layers"])
    assert Counter(kinds) == {(True, False): 13, (False, False): 10, (False, True): 1}
    shrunk = sd35.mmdit_config()
    assert shrunk["num_layers"] == 3 and tuple(shrunk["dual_attention_layers"]) == (0,)

    target = _full_depth("sd35_medium")
    blocks = target.module.transformer.transformer_blocks
    assert len(blocks) == 24 and sum(b.use_dual_attention for b in blocks) == 13
    assert blocks[23].context_pre_only and not any(b.context_pre_only for b in blocks[:23])
    assert dict(target.multiplicity) == {} and target.full_depth
    assert "24 blocks" in target.notes["depth"] and "shrinking" not in target.notes
