"""Checkpoints of an export's finished steps, kept in the workspace (`export-checkpoints/`): the fresh-process
confirmation and each target's whole-model check. A later export with the same inputs reuses them, so an
export cut short (a time limit, Ctrl-C, a crash) goes on where it stopped; `export --fresh` reads none.

A checkpoint's file name is the sha256 of its key, and the file holds the key itself: everything the result
depends on (the run, the exact variants and digests of their code, the config file's bytes, `--small`, the
target, the GPU, torch, the kforge source). A changed input is another key, so a result is never reused for
inputs it was not measured with.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDER = "export-checkpoints"
VERSION = 1  # of the file's layout: a checkpoint of another version is not read


def digest(data: bytes | str) -> str:
    """sha256 of bytes or text (UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """sha256 of a file's bytes; None when it cannot be read."""
    try:
        return digest(Path(path).read_bytes())
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over the engine's own source (every .py, .cu, .cuh, .cpp and .h under engine/): the checks run it,
    so an edit anywhere in it makes every checkpoint stale."""
    import engine

    root = Path(engine.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".cu", ".cuh", ".cpp", ".h") and "__pycache__" not in f.parts and f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples as lists, Paths as text): how a stored key compares."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


@dataclass
class Checkpoints:
    """One export's checkpoints: `base` is what every key holds (run, GPU, torch, kforge source); `fresh`
    (`export --fresh`) reads none but still writes what finishes."""

    folder: Path
    base: dict[str, Any]
    fresh: bool = False
    not_written: str | None = None  # why the first checkpoint that could not be written was not (once)

    def key(self, **parts: Any) -> dict[str, Any]:
        return _plain({**self.base, **parts})

    def path(self, kind: str, key: dict[str, Any]) -> Path:
        name = digest(json.dumps(key, sort_keys=True, separators=(",", ":")))[:32]
        return self.folder / f"{kind.replace(':', '_')}-{name}.json"

    def load(self, kind: str, key: dict[str, Any]) -> dict[str, Any] | None:
        """The checkpoint of `kind` under `key` ({"at": UTC time, "result": …, "path": …}), or None: none
        there, `fresh`, unreadable, or written for another key or layout."""
        if self.fresh:
            return None
        path = self.path(kind, key)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("version") != VERSION or doc.get("kind") != kind \
                or doc.get("key") != key or "result" not in doc:
            return None
        return {**doc, "path": path}

    def save(self, kind: str, key: dict[str, Any], result: Any) -> Path | None:
        """Write the checkpoint atomically (a reader never sees half of one); None when it could not be
        written (`not_written` says why): the export goes on without it."""
        path = self.path(kind, key)
        doc = {"version": VERSION, "kind": kind, "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "key": key, "result": result}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f, indent=1, sort_keys=True, default=str)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            self.not_written = self.not_written or (f"checkpoints not written to {self.folder} "
                                                    f"({type(e).__name__}: {e}); an interrupted export starts over")
            return None
        return path

    def shown(self, path: Path) -> str:
        """The checkpoint's name as progress shows it: relative to the workspace."""
        return f"{FOLDER}/{path.name}"
