"""Capture a config and keep what it found: cards, samples and the capture row, all or nothing."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.capture.run import CaptureResult, capture_model, discard_samples, resolve_device, sweep_partials
from engine.config import ModelConfig
from engine.store import Store, db_path
from engine.store.sample_folders import LOCK_FILENAME


def capture_and_store(config: ModelConfig, device_arg: str | None, workspace: Path, *, samples: int | None,
                      progress: Callable[[str], None] = lambda msg: None) -> CaptureResult:
    """Capture a config and store cards and samples in the workspace (no running event loop)."""
    with contextlib.ExitStack() as held:  # the sample folder's lock, until its rows are stored or it is removed
        result = _capture(config, device_arg, workspace, samples, progress, held)
        progress(_storing(workspace, result))
        try:
            asyncio.run(_store_in_workspace(workspace, config, result))
        except KeyboardInterrupt:
            if not _stored(workspace, result.capture_id):
                discard_samples(workspace, result)
                raise
            # Ctrl-C or SIGTERM as the COMMIT ended: too late to stop, the capture is whole and is the result
        except BaseException:
            if not _stored(workspace, result.capture_id):
                discard_samples(workspace, result)
            raise
    return result


def _stored(workspace: Path, capture_id: str) -> bool:
    """Whether the capture's row is committed: a store stopped as its COMMIT ran still finishes it, and the
    samples of a stored capture must stay (a later run reuses it)."""
    from engine.store import open_readonly

    try:
        conn = open_readonly(db_path(workspace))
    except Exception:  # noqa: BLE001 - no database (or none readable): nothing was stored
        return False
    try:
        return conn.execute("SELECT 1 FROM captures WHERE id = ?", (capture_id,)).fetchone() is not None
    except Exception:  # noqa: BLE001 - as above
        return False
    finally:
        conn.close()


class CaptureStopped(BaseException):
    """Raised inside a capture thread at the next module forward once its stop flag is set.

    A BaseException, like KeyboardInterrupt: no `except Exception` on the way (a model's own, or the
    capture's "the model raised" wrapping) mistakes it for a failure of the model."""


@contextlib.contextmanager
def _stops_on(stop: threading.Event) -> Iterator[None]:
    """Check `stop` before every module forward of this thread (build, warm-up and captured forward)."""
    import torch

    me = threading.get_ident()

    def check(module: object, args: object) -> None:
        if stop.is_set() and threading.get_ident() == me:
            raise CaptureStopped()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()


async def capture_into(store: Store, config: ModelConfig, device_arg: str | None, workspace: Path, *,
                       samples: int | None, progress: Callable[[str], None] = lambda msg: None,
                       on_stored: Callable[[str], None] = lambda capture_id: None) -> CaptureResult:
    """The same from inside the engine's event loop, into its open store; `on_stored` gets the capture's id
    once its rows are committed, also where a stop that landed as the COMMIT ran is raised after it.

    The capture runs in a worker thread, so the loop stays responsive: cancelling this coroutine (Ctrl-C)
    stops the capture at its next module forward and waits for it; its samples, written to a `.partial-*`
    folder until the capture is complete, are removed and nothing is stored."""
    stop = threading.Event()
    with contextlib.ExitStack() as held:  # the sample folder's lock, until its rows are stored or it is removed

        def work() -> CaptureResult:
            with _stops_on(stop):
                return _capture(config, device_arg, workspace, samples, progress, held)

        thread = asyncio.get_running_loop().run_in_executor(None, work)
        try:
            result = await asyncio.shield(thread)
        except asyncio.CancelledError:
            stop.set()
            try:
                done = await thread  # at the next module forward (or the capture just ended)
            except BaseException:  # noqa: BLE001 - CaptureStopped, or whatever else ended it: nothing is kept
                raise asyncio.CancelledError() from None
            discard_samples(workspace, done)
            raise
        progress(_storing(workspace, result))
        try:
            await save_capture(store, workspace, config, result)
        except BaseException:
            if not _stored(workspace, result.capture_id):
                discard_samples(workspace, result)
            else:  # stored as it was cancelled: whole, and the next run of the config reuses it
                on_stored(result.capture_id)
            raise
    on_stored(result.capture_id)
    return result


def _storing(workspace: Path, result: CaptureResult) -> str:
    """The progress line before storing: hashing gigabytes of samples takes seconds."""
    files = [f for f in (workspace / result.sample_dir).iterdir() if f.is_file() and f.name != LOCK_FILENAME]
    size = sum(f.stat().st_size for f in files)
    return (f"storing {len(result.cards)} cards and {len(result.chains)} chain cards, "
            f"{len(files)} sample files ({size / 1e6:.0f} MB, sha256)")


def _capture(config: ModelConfig, device_arg: str | None, workspace: Path, samples: int | None,
             progress: Callable[[str], None], held: contextlib.ExitStack) -> CaptureResult:
    device = resolve_device(device_arg)
    sweep_partials(workspace)
    return capture_model(config, device, workspace, samples=samples, progress=progress, held=held)


async def _store_in_workspace(workspace: Path, config: ModelConfig, result: CaptureResult) -> None:
    store = await Store.open(db_path(workspace))
    async with store:
        await save_capture(store, workspace, config, result)


async def save_capture(store: Store, workspace: Path, config: ModelConfig, result: CaptureResult) -> None:
    """One transaction: the capture row, its cards and their sample files (with digests)."""
    import torch

    root = workspace / result.sample_dir
    # A channels-last twin shares its original's sample files (engine.capture.twins), a hidden call those of the
    # call that makes it (engine.capture.hidden), a conv-bias fold its plain chain's (engine.capture.folds); a fold's
    # twin, through the fold, the plain chain's.
    files = [(card.card_id, idx, root / f"{result.shares_samples_of(card.card_id)}.{idx}.safetensors")
             for card in [*result.cards, *result.chains] for idx in range(card.samples)]
    # Files the capture hashed as it wrote them keep that digest (if their size is still the one written);
    # the rest are hashed here, a thread per core (hashlib releases the GIL on large buffers).
    def digest(f: Path) -> str:
        known = result.sample_digests.get(f.name)
        return known[0] if known is not None and known[1] == f.stat().st_size else _sha256(f)

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(digest, [f for _, _, f in files]))
    sample_rows = [{"card_id": cid, "idx": idx, "path": str(f.relative_to(workspace)), "sha256": digest,
                    "nbytes": f.stat().st_size} for (cid, idx, f), digest in zip(files, digests)]
    capture: dict[str, Any] = {
        "id": result.capture_id, "model": result.model, "config_path": str(config.path.resolve()),
        "config_sha256": config.sha256, "device": result.device, "dtype": result.dtype,
        "small": result.small, "torch_version": torch.__version__, "wall_s": result.wall_s,
        "total_calls": result.total_calls, "notes": result.notes, "skipped": result.skipped,
        "sample_dir": result.sample_dir,
    }
    await store.save_capture(capture, [c.row() for c in [*result.cards, *result.chains]], sample_rows)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
