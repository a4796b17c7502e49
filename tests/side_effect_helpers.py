"""A helper module of tests/side_effect_models.py: a counter kept in this module's namespace, read and advanced through
a function a forward calls as `side_effect_helpers.tick()` (an attribute of a module, not a name of its own)."""

from __future__ import annotations

TICKS = 0
FAST = False


def tick() -> int:
    global TICKS
    TICKS += 1
    return TICKS


COUNTS: dict = {}


def count(key) -> None:
    COUNTS[str(key)] = COUNTS.get(str(key), 0) + 1  # a computed key: seen only by comparing COUNTS around the call


SCALE = 1.0


def scale() -> float:
    return SCALE
