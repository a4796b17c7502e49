"""Grouped horizontal bar charts as standalone SVG (no plotting library): speedups a reader would rather see
than read, e.g. each model's arms against eager in `scripts/reproduce.py`'s report.

A bar is a value with an optional 95 % interval (drawn as a whisker); a value with no interval is drawn
without one, never with a made-up one. A reference line (1.0: as fast as the baseline) runs across every
group. The same label keeps its colour in every group, and the legend lists the labels in first-seen order.
Labels that differ only by `pair_suffix` ("torch.compile" and "torch.compile + cast") share a hue, light
without the suffix and dark with it, so each "without / with" pair reads as one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

# (light, dark) per family of labels, in the order families are first seen: blue, orange, green, purple, grey.
PALETTE = (("#9ecae1", "#08519c"), ("#fdae6b", "#d94801"), ("#a1d99b", "#238b45"), ("#bcbddc", "#54278f"),
           ("#d9d9d9", "#525252"))

BAR_H, GAP, GROUP_GAP, RIGHT, TOP, LEGEND_ROW = 14, 3, 14, 70, 40, 18
PLOT_W = 460


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    ci: tuple[float, float] | None = None


def _ticks(top: float) -> list[float]:
    """Round tick values from 0 to `top`: 4 to 8 of them or so, steps of 1, 2 or 5 times a power of ten."""
    raw = top / 6
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [round(i * step, 10) for i in range(int(top / step) + 1)]


def colours(labels: Sequence[str], pair_suffix: str = " + cast") -> dict[str, str]:
    """Each label's fill: a hue per family (the label without `pair_suffix`), dark for the label with the
    suffix, light for the one without; a family with one label only gets the dark shade."""
    families: list[str] = []
    for lab in labels:
        fam = lab.removesuffix(pair_suffix)
        if fam not in families:
            families.append(fam)
    out = {}
    for lab in labels:
        fam = lab.removesuffix(pair_suffix)
        light, dark = PALETTE[families.index(fam) % len(PALETTE)]
        alone = sum(1 for other in labels if other.removesuffix(pair_suffix) == fam) == 1
        out[lab] = dark if lab.endswith(pair_suffix) or alone else light
    return out


def bars_svg(groups: Sequence[tuple[str, Sequence[Bar]]], *, title: str, axis: str, reference: float = 1.0,
             reference_label: str = "1.0", pair_suffix: str = " + cast") -> str:
    """The chart of `groups` ((group name, its bars)) as an SVG document (a string). Groups without bars are
    left out; with none at all, ValueError."""
    groups = [(name, list(bars)) for name, bars in groups if bars]
    if not groups:
        raise ValueError("nothing to draw: no group has a bar")
    labels: list[str] = []
    for _, bars in groups:
        labels += [b.label for b in bars if b.label not in labels]
    colour = colours(labels, pair_suffix)
    left = 16 + 7 * max(len(name) for name, _ in groups)  # bold 11 px text: about 7 px a character
    top = max([reference] + [max(b.value, b.ci[1] if b.ci else 0.0) for _, bars in groups for b in bars]) * 1.08
    ticks = _ticks(top)
    x = lambda v: left + PLOT_W * max(0.0, v) / top  # noqa: E731
    legend_h = LEGEND_ROW * math.ceil(len(labels) / 3)
    y0 = TOP + legend_h
    body_h = sum(len(bars) * (BAR_H + GAP) + GROUP_GAP for _, bars in groups)
    height = y0 + body_h + 36
    width = left + PLOT_W + RIGHT
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">{escape(title)}</text>']
    for i, lab in enumerate(labels):
        lx, ly = 10 + (i % 3) * (width - 20) / 3, TOP - 14 + (i // 3) * LEGEND_ROW
        out.append(f'<rect x="{lx:.1f}" y="{ly}" width="10" height="10" fill="{colour[lab]}"/>'
                   f'<text x="{lx + 14:.1f}" y="{ly + 9}">{escape(lab)}</text>')
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{y0 - 4}" x2="{x(t):.1f}" y2="{y0 + body_h}" stroke="#e5e5e5"/>'
                   f'<text x="{x(t):.1f}" y="{y0 + body_h + 14}" text-anchor="middle" fill="#555">{t:g}</text>')
    y = y0
    for name, bars in groups:
        mid = y + len(bars) * (BAR_H + GAP) / 2
        out.append(f'<text x="{left - 8}" y="{mid + 4:.1f}" text-anchor="end" font-weight="bold">{escape(name)}</text>')
        for b in bars:
            w = x(b.value) - left
            out.append(f'<rect class="bar" data-label="{escape(b.label)}" data-value="{b.value:.4g}" x="{left}" '
                       f'y="{y}" width="{w:.1f}" height="{BAR_H}" fill="{colour[b.label]}"/>')
            end = x(b.value)
            if b.ci is not None:
                lo, hi = x(b.ci[0]), x(b.ci[1])
                cy = y + BAR_H / 2
                out.append(f'<path class="ci" d="M{lo:.1f},{cy - 4:.1f}v8M{lo:.1f},{cy:.1f}H{hi:.1f}'
                           f'M{hi:.1f},{cy - 4:.1f}v8" stroke="#222" fill="none"/>')
                end = max(end, hi)
            out.append(f'<text x="{end + 4:.1f}" y="{y + BAR_H - 3}">{b.value:.2f}×</text>')
            y += BAR_H + GAP
        y += GROUP_GAP
    out.append(f'<line class="reference" x1="{x(reference):.1f}" y1="{y0 - 6}" x2="{x(reference):.1f}" '
               f'y2="{y0 + body_h}" stroke="#222" stroke-dasharray="4 3"/>'
               f'<text x="{x(reference) + 3:.1f}" y="{y0 - 8}" fill="#222">{escape(reference_label)}</text>')
    out.append(f'<text x="{left + PLOT_W / 2}" y="{height - 6}" text-anchor="middle" fill="#333">{escape(axis)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
