"""A user's own model for Kernel Forge: a function that returns (model, example_inputs).

Point a config's `builder` at it ("my_model.py:build", relative to the config file, or an importable
"package.module:build"). Keyword arguments come from the config's [params] table; `device` and
`dtype` are passed when the function accepts them.
"""

import torch
from torch import nn


class TinyMLPBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))


class TinyModel(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.blocks = nn.ModuleList(TinyMLPBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return torch.softmax(self.head(x), dim=-1)


def build(device: torch.device, dtype: torch.dtype, batch: int = 8, tokens: int = 64, width: int = 256,
          depth: int = 2):
    torch.manual_seed(0)
    model = TinyModel(width, depth).to(device=device, dtype=dtype).eval()
    x = torch.randn(batch, tokens, width, device=device, dtype=dtype)
    return model, (x,)
