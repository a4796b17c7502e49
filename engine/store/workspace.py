"""Where Kernel Forge keeps its state: `--workspace DIR`, else `$KFORGE_HOME`, else `./.kforge/`."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "KFORGE_HOME"
DEFAULT_DIRNAME = ".kforge"
DB_FILENAME = "kforge.db"
SAMPLES_DIRNAME = "samples"

_FIX = f"pass --workspace DIR or set {ENV_VAR} to a writable directory"


class WorkspaceError(ValueError):
    """The workspace path cannot be used (a file is in the way, or it is not writable)."""


def resolve_workspace(cli_value: str | None) -> Path:
    """Pick the workspace directory (flag > env > cwd) as an absolute path with no `..` in it (symlinks followed):
    the commands that messages name to go on carry it (`--workspace cfg/../ws` named `/abs/cfg/../ws`); creates
    nothing."""
    if cli_value:
        raw = cli_value
    elif os.environ.get(ENV_VAR):
        # An empty KFORGE_HOME counts as unset, so `KFORGE_HOME= kforge ...` falls back to cwd.
        raw = os.environ[ENV_VAR]
    else:
        return Path.cwd() / DEFAULT_DIRNAME
    return Path(raw).expanduser().resolve()


def ensure_workspace(path: str | os.PathLike[str]) -> Path:
    """Create the workspace and its `samples/` directory; raise WorkspaceError if unusable."""
    root = Path(path)
    for directory in (root, root / SAMPLES_DIRNAME):
        if directory.exists() and not directory.is_dir():
            raise WorkspaceError(f"workspace path {directory} exists and is not a directory; {_FIX}")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise WorkspaceError(f"cannot create workspace {directory}: {reason}; {_FIX}") from exc
        # mkdir succeeds on an existing read-only directory; SQLite would fail much later and less clearly.
        if not os.access(directory, os.W_OK | os.X_OK):
            raise WorkspaceError(f"workspace {directory} is not writable; {_FIX}")
    return root


def db_path(workspace: str | os.PathLike[str]) -> Path:
    """The SQLite file inside a workspace."""
    return Path(workspace) / DB_FILENAME


def samples_dir(workspace: str | os.PathLike[str]) -> Path:
    """The directory holding captured input samples; sample rows store paths relative to the workspace."""
    return Path(workspace) / SAMPLES_DIRNAME
