"""Numbers as the screens print them: short, aligned, and '–' for unknown."""

from __future__ import annotations

import math
import re
from typing import Any

DASH = "–"
STATUS_GLYPH = {"verified": "✓", "compiled": "○", "rejected": "✗", "evaluating": "◐", "proposed": "·"}
STATUS_STYLE = {"verified": "green", "compiled": "cyan", "rejected": "red", "evaluating": "yellow",
                "proposed": "dim"}


def us(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return DASH
    return f"{v:,.1f}" if v >= 100 else f"{v:.2f}"


def speedup(v: float | None) -> str:
    return DASH if v is None else f"{v:.2f}×"


def pct(v: float | None) -> str:
    return DASH if v is None else f"{v:.0f}%"


def share(v: float | None) -> str:
    return DASH if v is None else f"{100 * v:.1f}%"


def calls(v: float | None) -> str:
    return DASH if v is None else (f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}")


def tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def duration(s: float) -> str:
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def num(v: float | None, fmt: str = ".3g") -> str:
    if v is None:
        return DASH
    return format(v, fmt)


_STRIDED = re.compile(r"\[([\d,]+)\]\(s=([\d,]+)\)")


def layouts(signature_text: str) -> str:
    """A signature's raw strides named where they are a layout people know: `bf16[1,128,64,64](s=524288,1,
    8192,128)` reads `bf16[1,128,64,64] channels-last`. Other strides stay as they are."""

    def name(m: re.Match) -> str:
        shape = [int(v) for v in m.group(1).split(",")]
        stride = [int(v) for v in m.group(2).split(",")]
        if len(shape) >= 4 and len(stride) == len(shape) and shape[1] > 1:
            order = [0, *range(2, len(shape)), 1]   # [N, *spatial, C] with C innermost
            acc, ok = 1, True
            for d in reversed(order):
                if shape[d] > 1 and stride[d] != acc:
                    ok = False
                    break
                acc *= shape[d]
            if ok:
                return f"[{m.group(1)}] channels-last"
        return m.group(0)

    return _STRIDED.sub(name, signature_text)


# A card the search may still reach: "no verified node yet"; any other status is final for the run.
SEARCHING = frozenset({"searching", "waiting", "queued"})


def still(card: Any) -> str:
    """The end of "no verified node…": " yet" while the card may still be searched, else why it stopped
    (" (declined)", " (budget)"): a declined card read "no verified node yet", as if more might come."""
    status = getattr(card, "status", None)
    return " yet" if status is None or status in SEARCHING else f" ({status})"
