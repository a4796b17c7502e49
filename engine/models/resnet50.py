"""torchvision ResNet-50 with random weights (Bottleneck [3, 4, 6, 3], fc 2048→1000)."""

from __future__ import annotations

import torch

from engine.models.random_init import tiled_random_init
from engine.models.target import CaptureTarget


def build(*, device: torch.device, dtype: torch.dtype, batch: int = 32, image_size: int = 224,
          channels_last: bool = False, seed: int = 0) -> CaptureTarget:
    """ResNet-50 in eval mode (batch-norm in inference) on a random image batch."""
    from torchvision.models import resnet50

    torch.manual_seed(seed)
    with tiled_random_init(seed):  # kaiming-scaled tiled fill instead of per-element RNG
        model = resnet50(weights=None)
    model = model.eval().to(device=device, dtype=dtype)
    x = torch.randn(batch, 3, image_size, image_size, device=device, dtype=dtype)
    notes = {"layout": "channels_last" if channels_last else "contiguous (NCHW)",
             "weights": "random: torchvision's kaiming/uniform inits as a tiled N(0, 1) block at each init's std"}
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return CaptureTarget(module=model, forward=lambda: model(x), notes=notes)
