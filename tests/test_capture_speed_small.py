"""Small CPU captures stay fast without changing what a card describes: real widths, real layer scales,
the real position table where it is read, and progress lines while the forward is captured."""

import pytest
import tomllib
import torch
from conftest import CONFIGS

from engine.capture.recorder import CaptureMode, ModulePaths
from engine.models import sd35
from engine.models.random_init import tiled_random_init


def test_sd35_small_overrides_only_resolution_sequence_batch():
    raw = tomllib.loads((CONFIGS / "models" / "sd35_medium.toml").read_text())
    assert set(raw["small"]) <= {"image_size", "text_tokens", "cfg_batch", "vae_latent_size"}
    assert raw["small"]["image_size"] % (sd35.VAE_SCALE * sd35.MMDIT_CONFIG["patch_size"]) == 0


@pytest.mark.parametrize("used", [1, 2, 4, 7])
def test_centre_position_table_matches_diffusers_where_read(used):
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    grid, dim = 24, 64
    full = get_2d_sincos_pos_embed(dim, grid, base_size=8, interpolation_scale=1.0, output_type="pt").float()
    ours = sd35.center_sincos_table(dim, grid, used, 8, 1.0)
    assert ours.shape == full.shape and ours.dtype == torch.float32
    top = (grid - used) // 2
    crop = slice(top, top + used)
    assert torch.equal(ours.reshape(grid, grid, dim)[crop, crop], full.reshape(grid, grid, dim)[crop, crop])


def test_tiled_init_keeps_each_layers_scale_and_deterministic_inits():
    torch.manual_seed(0)
    ref = torch.nn.Linear(512, 1024)
    with tiled_random_init(seed=0):
        lin = torch.nn.Linear(512, 1024)
        conv = torch.nn.Conv2d(64, 128, 3)
        norm = torch.nn.LayerNorm(1024)
    assert lin.weight.shape == (1024, 512) and conv.weight.shape == (128, 64, 3, 3)
    assert lin.weight.std().item() == pytest.approx(ref.weight.std().item(), rel=0.05)
    assert lin.bias.std().item() == pytest.approx(ref.bias.std().item(), rel=0.1)
    assert conv.weight.std().item() == pytest.approx((1 / (3 * 64 * 9)) ** 0.5, rel=0.05)
    assert torch.equal(norm.weight, torch.ones(1024)) and torch.equal(norm.bias, torch.zeros(1024))
    # torch.nn.init is itself again afterwards
    w = torch.empty(256, 256)
    torch.nn.init.kaiming_uniform_(w)
    assert w.abs().max() > 0


def test_capture_reports_progress_per_block():
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
                                  for _ in range(3)])
    messages: list[str] = []
    paths = ModulePaths(model, {})
    mode = CaptureMode(path_of=paths.current, weight_of=paths.weight, samples=0, sample_budget_bytes=0,
                       sink=None, use_cuda_events=False, progress=messages.append, progress_every_s=0.0)
    with paths, torch.no_grad(), mode:
        model(torch.randn(4, 32))
    assert mode.ops >= 6
    assert messages and all(m.startswith("capturing: ") and " ops, " in m for m in messages)
    assert {m.rsplit("in ", 1)[1].split(".")[0] for m in messages} >= {"0", "1", "2"}


def test_capture_says_so_before_it_stores_and_hashes_the_samples(tmp_path):
    from test_capture_chains import _config

    from engine.capture.store import capture_and_store
    from engine.config import load_config

    messages: list[str] = []
    ws = tmp_path / "ws"
    ws.mkdir()
    result = capture_and_store(load_config(_config(tmp_path)), "cpu", ws, samples=1, progress=messages.append)
    files = len(list((ws / result.sample_dir).iterdir()))
    assert messages[-1].startswith(f"storing {len(result.cards)} cards and {len(result.chains)} chain cards, "
                                   f"{files} sample files")
