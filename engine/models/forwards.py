"""Reference-model forwards for end-to-end checks of a cast: the models exactly as `kforge-tui capture`
and `run` build them from a config (so a run's exported cast matches their calls), and the SD3.5 VAE
decode of the sd35_medium config on its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
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
    """A model's output tensor: the first tensor of a tuple/list output, or of a mapping such as a
    transformers `ModelOutput` (CausalLM: the logits; fields that are None are not in it)."""
    while not isinstance(out, torch.Tensor):
        if isinstance(out, (tuple, list)) and out:
            out = out[0]
        elif isinstance(out, Mapping):
            out = next((v for v in out.values() if v is not None), None)
        elif hasattr(out, "sample"):  # diffusers DecoderOutput
            out = out.sample
        else:
            raise TypeError(f"no output tensor in a {type(out).__name__}")
    return out
