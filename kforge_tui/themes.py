"""Themes from `themes/*.toml` (Textual theme fields), shipped in the wheel as `kforge_tui.themes`."""

from __future__ import annotations

import sys
from pathlib import Path

from textual.theme import Theme

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_THEME = "kforge-dark"
_FIELDS = ("primary", "secondary", "warning", "error", "success", "accent", "foreground", "background",
           "surface", "panel", "boost", "dark", "variables")


def themes_dir() -> Path:
    """The source checkout's themes/ when running from one, else the installed package data."""
    here = Path(__file__).resolve().parent.parent / "themes"
    if here.is_dir():
        return here
    from importlib.resources import files

    return Path(str(files("kforge_tui.themes")))


def load_themes(directory: Path | None = None) -> list[Theme]:
    """Every `*.toml` theme in `directory` (default: `themes_dir()`), sorted by name."""
    out = []
    for path in sorted((directory or themes_dir()).glob("*.toml")):
        data = tomllib.loads(path.read_text())
        name = data.get("name") or path.stem
        out.append(Theme(name=name, **{k: v for k, v in data.items() if k in _FIELDS}))
    return out
