"""SD3.5 Medium builder: shrunk MMDiT keeps one block of each kind, the forward decodes an image (CPU, --small)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytest.importorskip("diffusers")

from engine.models import sd35  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "models" / "sd35_medium.toml"


@pytest.fixture(scope="module")
def config():
    return tomllib.loads(CONFIG.read_text())


@pytest.fixture(scope="module")
def small_params(config):
    return {**config["params"], **config["small"]}


@pytest.fixture(scope="module")
def target(small_params):
    return sd35.build(device=torch.device("cpu"), dtype=torch.bfloat16, **small_params)


def test_config_loads(config, small_params):
    from engine.config import load_config, resolve_builder

    cfg = load_config(CONFIG, small=True)
    assert resolve_builder(cfg) is sd35.build
    assert dict(cfg.params) == small_params
    assert cfg.dtype_for("cuda") == torch.bfloat16
    assert dict(cfg.multiplicity) == config["multiplicity"]


def test_small_shrinks_no_width(config):
    # Only resolution / sequence / batch knobs may be overridden by --small.
    assert set(config["small"]) <= {"image_size", "text_tokens", "cfg_batch", "vae_latent_size"}


def test_three_block_kinds(target):
    blocks = target.module.transformer.transformer_blocks
    assert len(blocks) == 3
    b0, b1, b2 = blocks
    assert b0.use_dual_attention and b0.attn2 is not None and not b0.context_pre_only
    assert not b1.use_dual_attention and b1.attn2 is None and not b1.context_pre_only
    assert b1.ff_context is not None
    assert not b2.use_dual_attention and b2.context_pre_only and b2.ff_context is None
    # real widths: 24 heads x 64
    assert b1.attn.to_q.weight.shape == (1536, 1536)
    assert target.module.transformer.context_embedder.weight.shape == (1536, 4096)


def test_multiplicity_matches_config(config, target):
    assert dict(target.multiplicity) == config["multiplicity"]
    assert sum(config["multiplicity"].values()) == sd35.MMDIT_CONFIG["num_layers"] == 24
    kinds = sd35.block_kinds(24, sd35.MMDIT_CONFIG["dual_attention_layers"])
    assert kinds.count((True, False)) == 13 and kinds.count((False, False)) == 10
    assert kinds.count((False, True)) == 1
    names = {n for n, _ in target.module.named_modules()}
    assert set(target.multiplicity) <= names


def test_weights_dtype_and_eval(target):
    m = target.module
    assert not m.training
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert m.vae.encoder is None
    assert "attention" in target.notes and "shrinking" in target.notes


def test_forward_shapes(small_params, target):
    with torch.no_grad():
        noise_pred, image = target.forward()
    latent = small_params["image_size"] // 8
    assert noise_pred.shape == (small_params["cfg_batch"], 16, latent, latent)
    side = 8 * small_params["vae_latent_size"]
    assert image.shape == (1, 3, side, side)
    assert image.dtype == torch.bfloat16
    assert torch.isfinite(image).all() and torch.isfinite(noise_pred).all()


def test_bad_image_size():
    with pytest.raises(ValueError):
        sd35.build(device=torch.device("cpu"), dtype=torch.float32, image_size=250)
