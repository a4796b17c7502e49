"""The demo's model: one pre-norm MLP step of a transformer (LayerNorm, Linear, GELU tanh, residual add).

Small on purpose: its four operator cards (native_layer_norm, addmm, gelu, add) are few enough that every
LLM prompt of a short recorded run has a written answer (scripts/serve_answers.py serves them).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.target import CaptureTarget


class MLPBlock(nn.Module):
    """x + gelu_tanh(linear(layer_norm(x))) with random weights."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(self.norm(x)))


def build(*, device: torch.device, dtype: torch.dtype, batch: int = 8, tokens: int = 1024, width: int = 1024,
          seed: int = 0) -> CaptureTarget:
    """The block in eval mode on a random (batch, tokens, width) activation."""
    torch.manual_seed(seed)
    model = MLPBlock(width).eval().to(device=device, dtype=dtype)
    with torch.no_grad():  # LayerNorm's default affine (1, 0) would hide a kernel that ignores it
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(batch, tokens, width, device=device, dtype=dtype)
    return CaptureTarget(module=model, forward=lambda: model(x),
                         notes={"weights": "random (nn.Linear's init; LayerNorm affine drawn from U(0.5, 1.5), U(-0.5, 0.5))"})
