"""Helpers for the TUI tests: read what a user would see, as plain text, from Textual's SVG export."""

from __future__ import annotations

import html
import re

_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                   r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>')
CELL_W = 12.2  # Textual's SVG export: one terminal cell is 12.2 px wide


def svg_text(svg: str) -> str:
    """The terminal cells of an exported screenshot, one line per terminal row (trailing blanks cut)."""
    rows: dict[int, dict[int, str]] = {}
    for x, line, content in _TEXT.findall(svg):
        col = round(float(x) / CELL_W)
        row = rows.setdefault(int(line), {})
        for i, ch in enumerate(html.unescape(content).replace("\xa0", " ")):
            row[col + i] = ch
    out = []
    for n in range(max(rows, default=-1) + 1):
        cells = rows.get(n, {})
        out.append("".join(cells.get(i, " ") for i in range(max(cells, default=-1) + 1)).rstrip())
    return "\n".join(out)


def screen_text(app) -> str:
    """What the terminal shows right now."""
    return svg_text(app.export_screenshot())
