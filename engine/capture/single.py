"""Capture one operator call as a card with real samples on disk (benchmarks and GPU tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.capture.recorder import CaptureMode
from engine.capture.samples import save_sample
from engine.cards import CardRef


def capture_samples(run: Callable[[], Any], folder: Path, samples: int, *,
                    keep: Callable[[str], bool] = lambda op: True, budget_bytes: int = 1 << 31,
                    path_of: Callable[[], str] = lambda: "m") -> tuple[list[Any], dict[str, list[str]]]:
    """Run `run` under capture, writing up to `samples` samples per card (of the ops `keep` accepts) to
    `folder`; returns the captured cards and each card's sample files."""
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}

    def sink(tally, idx, snap, meta):
        if not keep(tally.op):  # only cards that will be used need their samples on disk
            return 0
        path = folder / f"{tally.id}.{idx}.safetensors"
        files.setdefault(tally.id, []).append(str(path))
        return save_sample(path, snap, meta)

    mode = CaptureMode(path_of=path_of, weight_of=lambda p: 1, samples=samples, sample_budget_bytes=budget_bytes,
                       sink=sink, use_cuda_events=torch.cuda.is_available())
    with torch.no_grad(), mode:
        run()
    return list(mode.cards.values()), files


def capture_card(folder: Path, fn: Callable[[], Any], samples: int = 2) -> CardRef:
    """Run `fn` `samples` times under capture; it must issue exactly one card. Samples go to `folder`."""

    def run() -> None:
        for _ in range(samples):
            fn()

    cards, files = capture_samples(run, folder, samples)
    if len(cards) != 1:
        raise ValueError(f"expected one card, got {[c.op for c in cards]}")
    t = cards[0]
    return CardRef(t.id, t.op, t.signature, t.outputs, t.bytes, files.get(t.id, []))
