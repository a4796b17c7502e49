"""Control rows: the only thing the TUI writes. The engine polls them (engine/run/orchestrator.py)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from engine.store.store import CONTROL_COMMANDS


class ReadOnlyWorkspace(RuntimeError):
    """This TUI session cannot write control rows (the demo, or a read-only workspace)."""


class ControlWriter:
    """Appends one row to `controls` per command, in its own short transaction."""

    def __init__(self, db_file: Path | None) -> None:
        self.db_file = db_file  # None: read-only session (demo)

    @property
    def enabled(self) -> bool:
        return self.db_file is not None

    def send(self, run_id: str, command: str, card_id: str | None = None,
             args: dict[str, Any] | None = None) -> int:
        """Queue `command` for the run's engine; returns the row's seq."""
        if command not in CONTROL_COMMANDS:
            raise ValueError(f"unknown control command {command!r}")
        if self.db_file is None:
            raise ReadOnlyWorkspace("this session is read-only (demo): controls are not sent")
        conn = sqlite3.connect(self.db_file, timeout=5, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            cur = conn.execute(
                "INSERT INTO controls (run_id, ts, command, card_id, args) VALUES (?, ?, ?, ?, ?)",
                (run_id, time.time(), command, card_id,
                 None if args is None else json.dumps(args, sort_keys=True, separators=(",", ":"))))
            return int(cur.lastrowid)
        except sqlite3.OperationalError as e:
            raise ReadOnlyWorkspace(f"cannot write a control row to {self.db_file}: {e}") from None
        finally:
            conn.close()
