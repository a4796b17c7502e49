"""One decoding step of a transformers causal LM as a repeatable forward (the builders' `decode = true`).

generate() spends its time in decoding steps: one token against the cache of everything before it. Their ops
have other shapes than a prefill's (an RMSNorm over [1, 1, H] rather than [1, S, H]), so cards captured from a
prefill never match them, and in eager each step pays the host for every op. A builder with `decode = true`
prefills its `seq_len` tokens once into a cache (transformers' default, a DynamicCache) and hands capture a
forward that runs the next step: the greedy next token at position `seq_len`, against that cache.

A step appends to the cache it is given, so every call starts from a copy of the prefilled one. The copy is
made with every dispatch mode set aside and outside Dynamo (`fresh_cache`): capture records only the step's
ops, torch.compile compiles only the step, and a CUDA graph of the forward replays the copy too (the graph
starts from the prefilled state each replay). The copy is a few MB for the shrunk models and is paid by both
arms of any comparison alike.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes


def decode_step(model: torch.nn.Module, input_ids: torch.Tensor, logits_to_keep: int = 0) -> tuple[Callable[[], Any], str]:
    """(forward, note): prefill `input_ids` into a cache once; the forward runs one decoding step of the greedy
    next token after them, from a fresh copy of that cache each call."""
    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    prefilled = _cache_of(out)
    cache_kw = _cache_kwarg(model)
    if prefilled is None:
        raise RuntimeError(f"{type(model).__name__} returned no cache from its prefill: it cannot be stepped")
    next_ids = out.logits[:, -1:].argmax(-1)
    del out

    @torch._dynamo.disable
    def fresh_cache() -> Any:
        with _disable_current_modes():
            return copy.deepcopy(prefilled)

    def forward() -> Any:
        with torch.no_grad():
            return model(input_ids=next_ids, **{cache_kw: fresh_cache()}, use_cache=True,
                         logits_to_keep=logits_to_keep)

    batch, context = input_ids.shape
    note = (f"one decoding step: {batch}x1 token (the greedy next one) at position {context}, against a "
            f"{type(prefilled).__name__} prefilled with {batch}x{context} random token ids, copied afresh "
            "outside capture at each call (engine/models/decode.py)")
    return forward, note


def _cache_of(out: Any) -> Any:
    """The cache a forward returned: `cache` since transformers 5.2x, `past_key_values` before (None: none)."""
    for name in ("cache", "past_key_values"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return None


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The name the model's forward takes its cache by: `cache` where it has that parameter (transformers
    5.2x, where `past_key_values` is a deprecated alias), else `past_key_values`."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"
