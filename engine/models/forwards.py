"""Reference-model forwards for end-to-end checks of a cast: the models exactly as `kforge-tui capture`
and `run` build them from a config (so a run's exported cast matches their calls), and the SD3.5 VAE
decode of the sd35_medium config on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def config_model(config: str, device: str = "cuda") -> tuple[torch.nn.Module, Callable[[], Any]]:
    """(module, forward) of a config (a shipped name like "resnet50" or a path)."""
    from engine.config import build_target, load_config

    target = build_target(load_config(config), torch.device(device))
    return target.module, target.forward


def sd35_vae(device: str = "cuda") -> tuple[torch.nn.Module, Callable[[], Any]]:
    """The sd35_medium config's VAE decode alone: a 1x16x128x128 bf16 latent to a 1024x1024 image."""
    module, _ = config_model("sd35_medium", device)
    vae = module.vae
    del module.transformer
    cfg = vae.config
    latent = torch.randn(1, cfg.latent_channels, 128, 128, generator=torch.Generator().manual_seed(0)
                         ).to(device, torch.bfloat16)
    return vae, lambda: vae.decode(latent / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0]


def output_tensor(out: Any) -> torch.Tensor:
    """A model's output tensor (the first tensor of a tuple/list output)."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out
