"""Helpers for GPU tests: make a real card (captured on the GPU, samples on disk) and run candidates
through a real lane. Used by the GPU-marked tests; importing it needs no GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def make_card(tmp_path: Path, fn: Callable[[], Any], samples: int = 2):
    """Run `fn` `samples` times under capture (it must make exactly one card) and return its CardRef."""
    from engine.capture.single import capture_card

    return capture_card(tmp_path, fn, samples)


def brief_of(ref) -> Any:
    """The CardBrief a proposer sees for a CardRef."""
    from engine.capture.signature import signature_text
    from engine.propose.base import CardBrief

    return CardBrief(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs,
                     bytes=ref.bytes)


def evaluate_many(jobs: Sequence[tuple[Any, str, str]], *, cache_dir: Path, timing: dict | None = None,
                  timeout_s: float | None = None) -> list[Any]:
    """Evaluate (CardRef, source, spec) jobs in one real lane; returns engine.lane.evaluate.Evaluation list."""
    from engine.compile import Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import evaluate

    compiler = Compiler(cache_dir, "nvrtc", arch="sm_{}{}".format(*torch.cuda.get_device_capability()))

    async def run() -> list[Any]:
        lane = GpuLane(worker_argv(torch.cuda.current_device()), timeout_s=120)
        await lane.start()
        try:
            return [await evaluate(lane, compiler, card, src, spec, timing=timing or {"max_seconds": 1.0},
                                   timeout_s=timeout_s) for card, src, spec in jobs]
        finally:
            await lane.close()

    return asyncio.run(run())


def template_walk(template: Any, card: Any, mutations: int, seed: int = 0,
                  extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """A template's default, then up to `mutations` distinct seeded neighbours (a walk, as the search
    takes), then the default with each of `extra` applied."""
    import random

    rng = random.Random(seed)
    params = template.default(card)
    out = [params]
    for _ in range(mutations * 8):
        if len(out) > mutations:
            break
        params = template.mutate(card, params, rng)
        if params not in out:
            out.append(params)
    for e in extra:
        p = {**template.default(card), **e}
        if p not in out:
            out.append(p)
    return out
