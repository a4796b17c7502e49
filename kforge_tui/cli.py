"""Console entry point `kforge-tui`: the engine's CLI, with the TUI handed in lazily."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; Textual is imported only when a command opens the TUI. As the process's entry point (no argv:
    the `kforge-tui` script, `python -m kforge_tui`), the process then ends without waiting for threads a model
    left running (engine.exits.leave_process)."""
    from engine.cli import main as engine_main
    from engine.exits import leave_process

    code = engine_main(argv, open_tui=open_tui)
    return code if argv is not None else leave_process(code)


def open_tui(args) -> int:
    """Import the Textual side only now: headless commands never load it."""
    from kforge_tui.launcher import open_tui as launch

    return launch(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
