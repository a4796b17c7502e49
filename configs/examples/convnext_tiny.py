"""ConvNeXt-Tiny image classifier (torchvision), random weights, as a user's builder for Kernel Forge.

A ConvNet with LayerNorm: each block is a 7x7 depthwise convolution, a LayerNorm over channels
(channels-last), two pointwise Linear layers with GELU between them, and a per-channel layer scale.
torchvision starts the layer scale at 1e-6 for training, which leaves every block's contribution invisible
in the output; trained ConvNeXt-T scales are mostly 0.01 to 1, so `layer_scale` stands in for those.
"""

import torch
from torchvision.models import convnext_tiny


def build(device: torch.device, dtype: torch.dtype, batch: int = 32, image_size: int = 224,
          layer_scale: float = 0.1, seed: int = 0):
    torch.manual_seed(seed)
    model = convnext_tiny(weights=None, layer_scale=layer_scale)
    model = model.to(device=device, dtype=dtype).eval()
    images = torch.randn(batch, 3, image_size, image_size, device=device, dtype=dtype)
    return model, (images,)
