"""A capture's sample folder is locked by the process writing it (engine.store.sample_folders): the next
capture's sweep, `prune` and the TUI leave it alone while that process lives, and take it for a leftover once
the process is gone, SIGKILL included. They guessed from a 15-minute mtime window before, and the sweep
removed every `.partial-*` folder, also the one a capture in another process was writing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CONFIGS, ROOT

from engine.capture.run import sweep_partials
from engine.store import Store, db_path, ensure_workspace, samples_being_written
from kforge_tui.launcher import capture_in_progress

MY_MODEL = CONFIGS / "examples" / "my_model.toml"
HOUR_AGO = time.time() - 3600

# Another process writing a sample folder as a capture does: it takes the folder's lock, writes, and sleeps.
HOLDER = """
import sys, time
from pathlib import Path
from engine.store import SampleFolderLock
lock = SampleFolderLock.create(Path(sys.argv[1]))
(lock.folder / "a.0.safetensors").write_bytes(b"x" * 4096)
print("locked", flush=True)
time.sleep(120)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def _workspace(tmp_path: Path) -> Path:
    ws = ensure_workspace(tmp_path / "ws")

    async def create() -> None:
        async with await Store.open(db_path(ws)):
            pass

    asyncio.run(create())
    return ws


def _age(folder: Path, t: float) -> None:
    for p in [*folder.iterdir(), folder]:
        os.utime(p, (t, t))


def _prune_entry(ws: Path, folder: Path):
    from engine.run.prune import decide, survey

    s = survey(ws)
    return s, next(e for e in decide(s) if e.path == folder.relative_to(ws).as_posix())


def test_a_folder_another_process_writes_is_kept_until_that_process_is_killed(tmp_path):
    from engine.run.prune import remove

    ws = _workspace(tmp_path)
    folder = ws / "samples" / ".partial-my_model-20261205-120000-ab12"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=ROOT, env=_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        _age(folder, HOUR_AGO)  # nothing written for an hour: the lock, not the age, says it is in use
        sweep_partials(ws)      # what the next capture does first
        assert (folder / "a.0.safetensors").is_file()
        assert capture_in_progress(ws).startswith(f"samples being written to {folder.name}")
        s, entry = _prune_entry(ws, folder)
        assert not entry.removable(()) and "holds its lock" in entry.holds[0].why
        [done] = remove(s, [entry])
        assert done.error is not None and "kept" in done.error and folder.is_dir()
    finally:
        holder.kill()   # SIGKILL: no cleanup runs; the kernel drops the lock
        holder.wait()
    _age(folder, time.time())  # written a moment ago, yet nobody writes it any more
    assert capture_in_progress(ws) is None
    s, entry = _prune_entry(ws, folder)
    assert entry.removable(()) and entry.leftover.what() == "a capture that never finished"
    sweep_partials(ws)
    assert not folder.exists()


def test_a_folder_without_a_lock_file_is_judged_by_its_age(tmp_path):
    # Written by a version before the locks (or created an instant ago, its lock not yet taken).
    ws = _workspace(tmp_path)
    old, young = ws / "samples" / ".partial-m-old", ws / "samples" / ".partial-m-young"
    for f in (old, young):
        f.mkdir()
        (f / "a.0.safetensors").write_bytes(b"x")
    _age(old, HOUR_AGO)
    assert [(p.name, "may be writing it" in why) for p, why in samples_being_written(ws)] == [(young.name, True)]
    sweep_partials(ws)
    assert not old.exists() and young.is_dir()


def test_without_flock_the_writer_leaves_no_lock_file(tmp_path, monkeypatch):
    # A file system that refuses flock: a lock file nobody holds would read as a dead writer.
    import engine.store.sample_folders as sf

    class NoFlock:
        LOCK_EX = LOCK_SH = LOCK_NB = 0

        @staticmethod
        def flock(fd, op):
            raise OSError(95, "Operation not supported")

    monkeypatch.setattr(sf, "fcntl", NoFlock)
    lock = sf.SampleFolderLock.create(tmp_path / "samples" / ".partial-m-1")
    assert list(lock.folder.iterdir()) == []
    assert sf.capture_writing(lock.folder) is not None  # young, no lock file: perhaps being written
    lock.release()


def test_a_capture_holds_its_folder_until_it_is_stored(tmp_path):
    from engine.capture.store import capture_and_store
    from engine.config import load_config
    from engine.store.sample_folders import LOCK_FILENAME

    ws = ensure_workspace(tmp_path / "ws")
    seen: list[tuple[str, list[str]]] = []
    result = capture_and_store(load_config(MY_MODEL, small=True), "cpu", ws, samples=1,
                               progress=lambda m: seen.append((m, [p.name for p, _ in samples_being_written(ws)])))
    writing = [names for m, names in seen if m.startswith("capturing")]
    storing = [names for m, names in seen if m.startswith("storing")]
    assert writing and writing[0] == [f".partial-{result.capture_id}"], seen
    assert storing == [[result.capture_id]], seen   # renamed, not yet stored: still held
    assert samples_being_written(ws) == []
    assert not (ws / result.sample_dir / LOCK_FILENAME).exists()


def test_a_concurrent_capture_keeps_its_samples_when_another_sweeps(tmp_path):
    # The defect: the next capture's sweep removed the `.partial-*` folder a capture in another process was
    # writing; that capture then failed, or stored rows naming files that were gone.
    from engine.store import open_readonly

    ws = tmp_path / "ws"
    err = tmp_path / "capture.err"
    proc = subprocess.Popen([sys.executable, "-m", "kforge_tui", "capture", str(MY_MODEL), "--device", "cpu",
                             "--workspace", str(ws)], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=err.open("w"))
    try:
        end = time.monotonic() + 120
        while not (ws / "samples").is_dir() or not any((ws / "samples").glob(".partial-*")):
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"no capture writing samples (exit {proc.poll()}): {err.read_text()[-2000:]}")
            time.sleep(0.02)
        sweep_partials(ws)
        assert any((ws / "samples").glob(".partial-*"))
        assert proc.wait(timeout=120) == 0, err.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    conn = open_readonly(db_path(ws))
    try:
        paths = [row[0] for row in conn.execute("SELECT path FROM samples")]
    finally:
        conn.close()
    assert paths and [p for p in paths if not (ws / p).is_file()] == []
