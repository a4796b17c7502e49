"""Capture one operator call as a card with real samples on disk (benchmarks and GPU tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.capture.recorder import CaptureMode
from engine.capture.samples import save_sample
from engine.lane.evaluate import CardRef


def capture_card(folder: Path, fn: Callable[[], Any], samples: int = 2) -> CardRef:
    """Run `fn` `samples` times under capture; it must issue exactly one card. Samples go to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    files: list[str] = []

    def sink(tally, idx, snap, meta):
        path = folder / f"{tally.id}.{idx}.safetensors"
        files.append(str(path))
        return save_sample(path, snap, meta)

    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=samples,
                       sample_budget_bytes=1 << 31, sink=sink, use_cuda_events=torch.cuda.is_available())
    with torch.no_grad(), mode:
        for _ in range(samples):
            fn()
    cards = list(mode.cards.values())
    if len(cards) != 1:
        raise ValueError(f"expected one card, got {[c.op for c in cards]}")
    t = cards[0]
    return CardRef(t.id, t.op, t.signature, t.outputs, t.bytes, files)
