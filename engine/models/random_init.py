"""Random weights at copy speed for large reference models (no hub, no per-module RNG init)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

_FILL_BLOCK = 999_983  # prime, so tiled rows of power-of-two width never repeat in phase


@contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def _fill_random_(params: list[torch.Tensor], std: float, seed: int) -> None:
    """Fill params with a tiled N(0, std) block (a random rotation per param): memcpy speed, not RNG speed."""
    gen = torch.Generator().manual_seed(seed)
    block = torch.randn(_FILL_BLOCK, generator=gen) * std
    cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
    for p in params:
        key = (p.device, p.dtype)
        if key not in cache:
            cache[key] = block.to(device=p.device, dtype=p.dtype)
        shift = int(torch.randint(_FILL_BLOCK, (1,), generator=gen))
        src = torch.roll(cache[key], shift)
        flat = p.view(-1)
        whole = flat.numel() // _FILL_BLOCK
        if whole:
            flat[: whole * _FILL_BLOCK].view(whole, _FILL_BLOCK).copy_(src.expand(whole, -1))
        rest = flat.numel() - whole * _FILL_BLOCK
        if rest:
            flat[whole * _FILL_BLOCK :].copy_(src[:rest])


def random_model(model_cls, config, *, device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """Instantiate `model_cls(config)` directly on `device` in `dtype` with cheap random weights.

    Parameters are allocated uninitialised (transformers' `no_init_weights`), every matrix / embedding /
    expert / conv weight (ndim >= 2) is filled from a tiled random block of std `initializer_range`, and
    the model's own `_init_weights` then sets the rest (norm scales, rotary buffers, gates, ...) as a
    fresh model would have them, and ties weights.
    """
    from transformers.initialization import no_init_weights

    with torch.device(device), _default_dtype(dtype), no_init_weights():
        model = model_cls(config)
    model.tie_weights()
    big = [p for p in model.parameters() if p.ndim >= 2]
    _fill_random_(big, std=config.initializer_range, seed=seed)
    for p in big:
        p._is_hf_initialized = True
    model.init_weights()  # only touches what is not flagged above
    model.requires_grad_(False)
    return model.eval()
