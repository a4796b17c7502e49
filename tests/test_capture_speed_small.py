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


TILED_TOY = '''
import torch
from engine.models.random_init import default_dtype, tiled_random_init


def build(device, dtype):
    with torch.device(device), default_dtype(dtype), tiled_random_init(seed=0):
        model = torch.nn.Sequential(torch.nn.Linear(2048, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    return model.eval(), (torch.randn(4, 2048, dtype=dtype, device=device),)
'''


def test_weights_of_a_tiled_fill_are_sampled_as_one_period(tmp_path):
    """A reference model's weights repeat one random block; their samples hold one period of it (2 MB, not the
    weight), and load back as the weight, bit for bit."""
    from engine.capture.samples import load_sample
    from engine.capture.store import capture_and_store
    from engine.config import load_config

    (tmp_path / "tiled.py").write_text(TILED_TOY)
    cfg = tmp_path / "tiled.toml"
    cfg.write_text('name = "tiled"\nbuilder = "tiled.py:build"\n[dtype]\ncpu = "bfloat16"\ncuda = "bfloat16"\n')
    ws = tmp_path / "ws"
    ws.mkdir()
    messages: list[str] = []
    result = capture_and_store(load_config(cfg), "cpu", ws, samples=1, progress=messages.append)
    files = sorted((ws / result.sample_dir).iterdir())
    big = next(c for c in result.cards if any(a.get("shape") == [2048, 1024]  # the first Linear's weight, as .t()
                                                for a in c.signature["args"]))
    sample = load_sample(ws / result.sample_dir / f"{big.card_id}.0.safetensors")
    weight = next(t for _, t in sample.args if isinstance(t, torch.Tensor) and t.shape == (2048, 1024))
    from test_samples import bits

    toy: dict = {}
    exec(TILED_TOY, toy)  # the same build again: the same weights
    model, _ = toy["build"]("cpu", torch.bfloat16)
    assert torch.equal(bits(weight.t()), bits(model[0].weight))
    assert sum(f.stat().st_size for f in files) < 2048 * 1024 * 2  # less than the one weight, whole
    assert any("MB of samples (" in m and "MB of files so far)" in m for m in messages)


def test_the_cli_leaves_its_objects_out_of_the_collector_at_exit():
    """The interpreter's teardown of torch's and the model libraries' modules ran cyclic collections over
    them (1.3-1.7 s of a `capture --small`); the CLI freezes what is alive when the process exits."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    # Registered before main(), this handler runs after the CLI's own (atexit runs last-in first-out).
    code = ("import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0)); "
            "from engine.cli import main; main(['--version']); main(['--version'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.splitlines()[-1] == "frozen True" and out.count("kforge-tui") == 2


def test_timing_script_times_the_whole_command_too(tmp_path):
    import os

    from conftest import ROOT, load_script

    script = load_script("time_small_captures")
    got = script.time_command(str(CONFIGS / "examples" / "my_model.toml"), {**os.environ, "PYTHONPATH": str(ROOT)},
                              timeout=300)
    assert float(got) > 0  # seconds, as the table prints them
    row = {"model": "m", "total_s": 1.0, "phases": {}, "cards": 2, "sample_bytes": 0, "progress_messages": 3,
           "load": "0.1 → 0.2", "command": got}
    assert script._row(row)[-1] == got and len(script._row(row)) == len(script.PHASES) + 7
    assert script._row({"model": "m", "error": "exit 1", "load": "x", "command": got})[-1] == got
