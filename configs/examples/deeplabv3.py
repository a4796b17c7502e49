"""DeepLabV3 semantic segmentation with a ResNet-50 backbone (torchvision), random weights, as a user's
builder for Kernel Forge.

`weights_backbone=None` matters: torchvision's default fetches ImageNet weights for the backbone.
The output is a dict; its "out" entry (per-pixel class scores at the input resolution) is what the
whole-model check compares. Segmentation rather than detection: every shape here is fixed by the input,
where a detector's box filtering and non-maximum suppression keep a data-dependent number of boxes.
"""

import torch
from torchvision.models.segmentation import deeplabv3_resnet50


def build(device: torch.device, dtype: torch.dtype, batch: int = 4, image_size: int = 512,
          num_classes: int = 21, seed: int = 0):
    torch.manual_seed(seed)
    model = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=False)
    model = model.to(device=device, dtype=dtype).eval()
    images = torch.randn(batch, 3, image_size, image_size, device=device, dtype=dtype)
    return model, (images,)
