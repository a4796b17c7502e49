"""ViT-B/16 image classifier (torchvision), random weights, as a user's builder for Kernel Forge.

Nothing is downloaded: torchvision builds the architecture and initialises it. Its classifier head starts
at zero (so fine-tuning starts from a blank head), which would make every output exactly 0 and leave the
whole-model check nothing to compare; here the head gets small random weights instead.
"""

import torch
from torch import nn
from torchvision.models import vit_b_16


def build(device: torch.device, dtype: torch.dtype, batch: int = 32, image_size: int = 224, seed: int = 0):
    torch.manual_seed(seed)
    # image_size sets the number of patches (and the position embedding's length), not any width.
    model = vit_b_16(weights=None, image_size=image_size)
    nn.init.normal_(model.heads.head.weight, std=0.02)
    model = model.to(device=device, dtype=dtype).eval()
    images = torch.randn(batch, 3, image_size, image_size, device=device, dtype=dtype)
    return model, (images,)
