"""What the TUI remembers between sessions (today: the theme last chosen with `T`), in
`$XDG_STATE_HOME/kforge/tui-state.json` (default `~/.local/state/kforge/`). A damaged or unreadable file
is ignored: remembering is a convenience, never a reason not to start."""

from __future__ import annotations

import json
import os
from pathlib import Path


def state_path(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "kforge" / "tui-state.json"


def read_state(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def remember(path: Path, **values: object) -> None:
    """Merge `values` into the state file (atomically: a crash leaves the old file or the new one)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**read_state(path), **values}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: nothing remembered, nothing broken
