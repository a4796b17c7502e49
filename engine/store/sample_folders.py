"""Whether a capture is writing a sample folder: the process writing one holds an OS lock on a file in it.

A capture writes its samples to `samples/.partial-<id>`, renames the folder to `samples/<id>` once it is
complete, and then stores the capture's rows. From the folder's creation until its rows are stored (or the
folder is removed) the capture's process holds an exclusive `flock` on `<folder>/.capture.lock`; the kernel
drops it when that process ends, however it ends (SIGKILL included). So "its lock is held" is a fact, where
"changed in the last 15 minutes" was a guess: a killed capture's folder looked alive for 15 minutes, and a live
one that spent longer than that in one forward without writing a file looked dead.

A folder without a lock file was written by a version before these locks, or was created an instant ago
and its lock is not taken yet; where flock is unavailable (no `fcntl`, a file system that refuses it) the
writer leaves no lock file either. Such a folder counts as being written while something in it changed in
the last UNLOCKED_RECENT_S seconds, as every folder did before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.store.workspace import samples_dir

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock files, every folder is judged by its age
    fcntl = None  # type: ignore[assignment]

LOCK_FILENAME = ".capture.lock"
PARTIAL_PREFIX = ".partial-"
UNLOCKED_RECENT_S = 900.0


class SampleFolderLock:
    """A capture's hold on the sample folder it writes (the module docstring says why); `release` ends it."""

    def __init__(self, folder: Path, fd: int | None) -> None:
        self.folder = folder
        self._fd = fd

    @classmethod
    def create(cls, folder: Path) -> SampleFolderLock:
        """Make `folder` (it must not exist yet) and take its lock."""
        folder.mkdir(parents=True)
        if fcntl is None:
            return cls(folder, None)
        path = folder / LOCK_FILENAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            # No flock here: a lock file nobody holds would read as a dead writer, so there is none.
            os.close(fd)
            path.unlink(missing_ok=True)
            return cls(folder, None)
        except BaseException:
            os.close(fd)
            raise
        return cls(folder, fd)

    def rename(self, to: Path) -> None:
        """Move the folder; the lock goes with it (it is on the file, not on its name)."""
        self.folder.rename(to)
        self.folder = to

    def release(self) -> None:
        """The samples are stored or removed: the lock file goes, then the lock. Idempotent."""
        if self._fd is None:
            return
        try:
            (self.folder / LOCK_FILENAME).unlink(missing_ok=True)
        except OSError:  # the folder is gone or not ours to change: the lock still goes
            pass
        os.close(self._fd)
        self._fd = None


def _lock_held(path: Path) -> bool | None:
    """Whether some process holds the lock on `path`; None when there is no lock to ask about."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (or `path`'s folder is a file), or not ours to read
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # the file system refuses flock
        return None
    finally:
        os.close(fd)  # also drops the shared lock just taken: the writer never locks again
    return False


def _newest_change(path: Path) -> float:
    """The newest mtime of `path` and, for a folder, of what it holds (sample folders are flat)."""
    try:
        newest = path.lstat().st_mtime
    except OSError:
        return 0.0
    try:
        with os.scandir(path) as entries:
            for e in entries:
                try:
                    newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:  # a file, or gone
        pass
    return newest


def capture_writing(path: Path, *, now: float | None = None) -> str | None:
    """Why a capture may be writing or storing this entry of samples/ now, in words; None when none is.

    With a lock file: whether its lock is held. Without (a folder from before these locks, one created this
    instant, a file): whether it changed in the last UNLOCKED_RECENT_S seconds."""
    held = _lock_held(path / LOCK_FILENAME)
    if held is not None:
        return "a capture's process holds its lock: it is writing or storing these samples" if held else None
    age = (time.time() if now is None else now) - _newest_change(path)
    if age >= UNLOCKED_RECENT_S:
        return None
    ago = f"{age / 60:.0f} min" if age >= 60 else "under a minute"
    return f"changed {ago} ago, no lock file: a capture may be writing it"


def samples_being_written(workspace: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """The sample folders a capture is writing or storing now, with why (capture_writing): those with a lock
    file, and `.partial-*` ones without. A stored capture's folder has no lock file and is not one."""
    root = samples_dir(workspace)
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    out = []
    for p in entries:
        if p.name.startswith(PARTIAL_PREFIX) or (p / LOCK_FILENAME).is_file():
            why = capture_writing(p)
            if why is not None:
                out.append((p, why))
    return out
