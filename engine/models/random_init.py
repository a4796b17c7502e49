"""Random weights at copy speed for large reference models (no hub, no per-module RNG init)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

_FILL_BLOCK = 999_983  # prime, so tiled rows of power-of-two width never repeat in phase


@contextmanager
def default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def _fill_random_(params: list[torch.Tensor], std: float, seed: int) -> None:
    """Fill params with a tiled N(0, std) block (a random rotation per param): memcpy speed, not RNG speed."""
    _TiledFill(seed, std).fill_all(params)


class _TiledFill:
    """One N(0, std) block of `_FILL_BLOCK` values, copied (rotated at random) into tensors."""

    def __init__(self, seed: int, std: float = 1.0):
        # The block is drawn on the CPU (its generator's device), also inside `with torch.device("cuda")`,
        # where a builder allocates its model: a CPU generator cannot draw a CUDA tensor.
        self.gen = torch.Generator().manual_seed(seed)
        self.block = torch.randn(_FILL_BLOCK, generator=self.gen, device="cpu") * std
        self.cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    @torch.no_grad()
    def fill_all(self, params: list[torch.Tensor]) -> None:
        for p in params:
            self.fill(p)

    @torch.no_grad()
    def fill(self, p: torch.Tensor) -> None:
        key = (p.device, p.dtype)
        if key not in self.cache:
            self.cache[key] = self.block.to(device=p.device, dtype=p.dtype)
        shift = int(torch.randint(_FILL_BLOCK, (1,), generator=self.gen, device="cpu"))
        src = torch.roll(self.cache[key], shift)
        flat = p.view(-1)
        whole = flat.numel() // _FILL_BLOCK
        if whole:
            flat[: whole * _FILL_BLOCK].view(whole, _FILL_BLOCK).copy_(src.expand(whole, -1))
        rest = flat.numel() - whole * _FILL_BLOCK
        if rest:
            flat[whole * _FILL_BLOCK :].copy_(src[:rest])
        if whole >= 2:
            setattr(p, _PERIOD_ATTR, _FILL_BLOCK * p.element_size())


_PERIOD_ATTR = "_kforge_fill_period"


def fill_period(t: torch.Tensor) -> int | None:
    """The period in bytes with which a tensor filled here repeats from its first byte, or None.

    A tiled fill repeats one block; anything that writes the tensor afterwards (a scale, a model's own init)
    may keep or break the repetition, so whoever relies on it checks the bytes (engine.capture.samples)."""
    period = getattr(t, _PERIOD_ATTR, None)
    return period if isinstance(period, int) and t.storage_offset() == 0 else None


def random_model(model_cls, config, *, device: torch.device, dtype: torch.dtype, seed: int,
                 before_fill: Callable[[torch.nn.Module], None] | None = None) -> torch.nn.Module:
    """Instantiate `model_cls(config)` directly on `device` in `dtype` with cheap random weights.

    Parameters are allocated uninitialised (transformers' `no_init_weights`), every matrix / embedding /
    expert / conv weight (ndim >= 2) is filled from a tiled random block of std `initializer_range`, and
    the model's own `_init_weights` then sets the rest (norm scales, rotary buffers, gates, ...) as a
    fresh model would have them, and ties weights. `before_fill(model)` runs before any weight is written
    (a builder that makes modules share a parameter there never touches the memory of the ones it drops).
    """
    from transformers.initialization import no_init_weights

    with torch.device(device), default_dtype(dtype), no_init_weights():
        model = model_cls(config)
    model.tie_weights()
    if before_fill is not None:
        before_fill(model)
    big = [p for p in model.parameters() if p.ndim >= 2]
    _fill_random_(big, std=config.initializer_range, seed=seed)
    for p in big:
        p._is_hf_initialized = True
    model.init_weights()  # only touches what is not flagged above
    model.requires_grad_(False)
    return model.eval()


def _init_std(name: str, t: torch.Tensor, args: tuple, kwargs: dict) -> tuple[float, float]:
    """(mean, std) that `torch.nn.init.<name>(t, *args, **kwargs)` would give `t`."""
    init = torch.nn.init
    a = {**dict(zip(_INIT_ARGS[name], args)), **kwargs}
    if name in ("kaiming_uniform_", "kaiming_normal_"):
        fan = init._calculate_correct_fan(t, a.get("mode", "fan_in"))
        gain = init.calculate_gain(a.get("nonlinearity", "leaky_relu"), a.get("a", 0))
        return 0.0, gain / max(fan, 1) ** 0.5
    if name in ("xavier_uniform_", "xavier_normal_"):
        fan_in, fan_out = init._calculate_fan_in_and_fan_out(t)
        return 0.0, a.get("gain", 1.0) * (2.0 / max(fan_in + fan_out, 1)) ** 0.5
    if name == "uniform_":
        lo, hi = a.get("a", 0.0), a.get("b", 1.0)
        return (lo + hi) / 2, (hi - lo) / 12 ** 0.5
    return a.get("mean", 0.0), a.get("std", 1.0)  # normal_, trunc_normal_


_INIT_ARGS = {
    "kaiming_uniform_": ("a", "mode", "nonlinearity"), "kaiming_normal_": ("a", "mode", "nonlinearity"),
    "xavier_uniform_": ("gain",), "xavier_normal_": ("gain",), "uniform_": ("a", "b"),
    "normal_": ("mean", "std"), "trunc_normal_": ("mean", "std"),
}


@contextmanager
def tiled_random_init(seed: int):
    """While building a `torch.nn` model, defer its random `torch.nn.init` calls; on exit fill each
    tensor from a tiled N(0, 1) block scaled to the mean and std that init would have given it.

    Per-element RNG (kaiming/xavier/uniform on every layer, in float32) dominates the build of a large
    model on a CPU; the tiled fill runs at copy speed and keeps each layer's scale, so activations stay
    as large as in a freshly initialised model. Deterministic inits (ones, zeros, constants) still run.
    """
    init = torch.nn.init
    pending: list[tuple[torch.Tensor, float, float]] = []
    originals = {name: getattr(init, name) for name in _INIT_ARGS}

    def deferred(name: str):
        def record(tensor: torch.Tensor, *args, **kwargs):
            pending.append((tensor, *_init_std(name, tensor, args, kwargs)))
            return tensor
        return record

    for name in originals:
        setattr(init, name, deferred(name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(init, name, fn)
    _fill_scaled_(pending, seed)


@torch.no_grad()
def _fill_scaled_(items: list[tuple[torch.Tensor, float, float]], seed: int) -> None:
    last = {id(t): (t, mean, std) for t, mean, std in items}  # re-initialised: the last call wins
    fill = _TiledFill(seed)
    for t, mean, std in last.values():
        fill.fill(t)
        t.mul_(std)
        if mean:
            t.add_(mean)
