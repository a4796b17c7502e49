"""Progress lines for long work, on stderr (stdout is reserved for a command's result)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def stderr_progress() -> Callable[[str], None]:
    """Progress lines on stderr when it is a terminal.

    Redirected stderr gets only errors and warnings, so a failure is exactly one line there.
    """
    if not sys.stderr.isatty():
        return lambda msg: None

    def show(msg: str) -> None:
        print(f"kforge: {msg}", file=sys.stderr, flush=True)
    return show
