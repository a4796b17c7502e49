"""Files shipped with Kernel Forge: the top-level configs/ and themes/ folders.

In a source checkout (or an editable install) they are read where they stand; in an installed
wheel they are package data (`engine.shipped_configs`, `kforge_tui.themes`, see pyproject.toml).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

_PACKAGES = {"configs": "engine.shipped_configs", "themes": "kforge_tui.themes"}


def shipped_dir(kind: str) -> Path:
    """The folder of shipped `configs` or `themes`."""
    checkout = Path(__file__).resolve().parent.parent / kind
    if checkout.is_dir():
        return checkout
    return Path(str(files(_PACKAGES[kind])))
