"""Cards for template and cast tests, captured on the CPU and described as the same call on CUDA, or
read from the H200 capture shipped in docs/results/capture-h200."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.capture.recorder import CaptureMode
from engine.capture.signature import signature_text
from engine.cards import OperatorCard

CAPTURES = Path(__file__).resolve().parent.parent / "docs" / "results" / "capture-h200"


def cudaify(d: Any) -> Any:
    """A CPU-captured descriptor as the same tensor would be described on the GPU."""
    if isinstance(d, dict):
        return {k: ("cuda" if k == "device" else cudaify(v)) for k, v in d.items()}
    if isinstance(d, list):
        return [cudaify(x) for x in d]
    return d


def brief(op: str, signature: dict, outputs: list[dict], card_id: str = "test") -> OperatorCard:
    sig = cudaify(signature)
    return OperatorCard(card_id, op, sig, signature_text(sig), cudaify(outputs))


def captured(fn: Callable[[], Any], keep: Callable[[str], bool]) -> Any:
    """The one captured card (recorder object) of `fn` whose op `keep` accepts; CPU, no samples."""
    mode = CaptureMode(path_of=lambda: "m", weight_of=lambda p: 1, samples=0, sample_budget_bytes=0, sink=None,
                       use_cuda_events=False)
    with torch.no_grad(), mode:
        fn()
    cards = [c for c in mode.cards.values() if keep(c.op)]
    assert len(cards) == 1, [c.op for c in mode.cards.values()]
    return cards[0]


def h200_cards(keep: Callable[[str], bool]) -> list[OperatorCard]:
    """Every card of the shipped H200 captures whose op `keep` accepts."""
    out = []
    for f in sorted(CAPTURES.glob("*.json")):
        for c in json.loads(f.read_text())["cards"]:
            if keep(c["op"]):
                sig = {"op": c["op"], "args": c["args"], "aliases": c["aliases"]}
                out.append(OperatorCard(c["id"], c["op"], sig, c["signature"], c["outputs"]))
    return out
