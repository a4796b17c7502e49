"""Capture a config and keep what it found: cards, samples and the capture row, all or nothing."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.capture.run import CaptureResult, capture_model, discard_samples, resolve_device, sweep_partials
from engine.config import ModelConfig
from engine.store import Store, db_path


def capture_and_store(config: ModelConfig, device_arg: str | None, workspace: Path, *, samples: int | None,
                      progress: Callable[[str], None] = lambda msg: None) -> CaptureResult:
    """Capture a config and store cards and samples in the workspace (no running event loop)."""
    result = _capture(config, device_arg, workspace, samples, progress)
    try:
        asyncio.run(_store_in_workspace(workspace, config, result))
    except BaseException:
        discard_samples(workspace, result)
        raise
    return result


async def capture_into(store: Store, config: ModelConfig, device_arg: str | None, workspace: Path, *,
                       samples: int | None, progress: Callable[[str], None] = lambda msg: None) -> CaptureResult:
    """The same from inside the engine's event loop, into its open store."""
    result = _capture(config, device_arg, workspace, samples, progress)
    try:
        await save_capture(store, workspace, config, result)
    except BaseException:
        discard_samples(workspace, result)
        raise
    return result


def _capture(config: ModelConfig, device_arg: str | None, workspace: Path, samples: int | None,
             progress: Callable[[str], None]) -> CaptureResult:
    device = resolve_device(device_arg)
    sweep_partials(workspace)
    return capture_model(config, device, workspace, samples=samples, progress=progress)


async def _store_in_workspace(workspace: Path, config: ModelConfig, result: CaptureResult) -> None:
    store = await Store.open(db_path(workspace))
    async with store:
        await save_capture(store, workspace, config, result)


async def save_capture(store: Store, workspace: Path, config: ModelConfig, result: CaptureResult) -> None:
    """One transaction: the capture row, its cards and their sample files (with digests)."""
    import torch

    sample_rows = []
    root = workspace / result.sample_dir
    for card in result.cards:
        for idx in range(card.samples):
            f = root / f"{card.card_id}.{idx}.safetensors"
            sample_rows.append({"card_id": card.card_id, "idx": idx, "path": str(f.relative_to(workspace)),
                                "sha256": _sha256(f), "nbytes": f.stat().st_size})
    capture: dict[str, Any] = {
        "id": result.capture_id, "model": result.model, "config_path": str(config.path.resolve()),
        "config_sha256": config.sha256, "device": result.device, "dtype": result.dtype,
        "small": result.small, "torch_version": torch.__version__, "wall_s": result.wall_s,
        "total_calls": result.total_calls, "notes": result.notes, "skipped": result.skipped,
        "sample_dir": result.sample_dir,
    }
    await store.save_capture(capture, [c.row() for c in result.cards], sample_rows)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
