"""What end-to-end checks of a cast need from a model's forward: its output tensor. (The forwards themselves,
built from a config, are `engine.config.config_model` and `sd35_vae`: models sit below configs.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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
