"""Control rows: the only thing the TUI writes. The engine polls them (engine/run/orchestrator.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from engine.outcomes import CONTROL_COMMANDS
from engine.store import read


class ReadOnlyWorkspace(RuntimeError):
    """This TUI session cannot write control rows (the demo, or a read-only workspace)."""


class ControlWriter:
    """Appends one row to `controls` per command, in its own short transaction."""

    def __init__(self, db_file: Path | None, why_read_only: str = "demo") -> None:
        self.db_file = db_file  # None: read-only session (the demo, a read-only workspace)
        self.why_read_only = why_read_only

    @property
    def enabled(self) -> bool:
        return self.db_file is not None

    def send(self, run_id: str, command: str, card_id: str | None = None,
             args: dict[str, Any] | None = None) -> int:
        """Queue `command` for the run's engine; returns the row's seq."""
        if command not in CONTROL_COMMANDS:
            raise ValueError(f"unknown control command {command!r}")
        if self.db_file is None:
            raise ReadOnlyWorkspace(f"this session is read-only ({self.why_read_only}): controls are not sent")
        try:
            return read.add_control(self.db_file, run_id, command, card_id, args)
        except sqlite3.OperationalError as e:
            raise ReadOnlyWorkspace(f"cannot write a control row to {self.db_file}: {e}") from None
