"""What end-to-end checks of a cast need from a model's forward: its output tensor. (The forwards themselves,
built from a config, are `engine.config.config_model` and `sd35_vae`: models sit below configs.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch


def output_tensor(out: Any) -> torch.Tensor:
    """A model's output tensor: the first tensor found depth first in a tuple/list output, or in a mapping
    such as a transformers `ModelOutput` (CausalLM: the logits; fields that are None are not in it), a
    diffusers output's `sample`, or a dataclass's fields in order. Entries that hold no tensor (None, a number, a string) are passed over."""
    found = _first_tensor(out, 0)
    if found is None:
        raise TypeError(f"no output tensor in a {type(out).__name__}")
    return found


def output_tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model's output, depth first in the order `output_tensor` searches (its first is that
    one): the rest of a tuple, a mapping's other fields (a cache, hidden states), a dataclass's other fields."""
    found: list[torch.Tensor] = []
    _all_tensors(out, 0, found)
    return found


def _all_tensors(out: Any, depth: int, found: list[torch.Tensor]) -> None:
    if isinstance(out, torch.Tensor):
        found.append(out)
        return
    if depth > 32:
        return
    if isinstance(out, (tuple, list)):
        items: Any = out
    elif isinstance(out, Mapping):
        items = out.values()
    elif hasattr(out, "sample"):
        items = [out.sample]
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [getattr(out, f.name, None) for f in dataclasses.fields(out)]
    elif type(out).__module__.startswith("transformers.cache_utils") and hasattr(out, "__dict__"):
        items = list(vars(out).values())   # a KV cache and its layers: the keys and values the next step reads
    else:
        return
    for v in items:
        _all_tensors(v, depth + 1, found)


def _first_tensor(out: Any, depth: int) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if depth > 32:
        return None
    if isinstance(out, (tuple, list)):
        items: Any = out
    elif isinstance(out, Mapping):
        items = out.values()
    elif hasattr(out, "sample"):  # diffusers DecoderOutput
        items = [out.sample]
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):  # a user's own output record
        items = [getattr(out, f.name, None) for f in dataclasses.fields(out)]
    else:
        return None
    return next((t for t in (_first_tensor(v, depth + 1) for v in items) if t is not None), None)
