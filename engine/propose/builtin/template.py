"""Builtin kernel templates: a parameter space over one op family, rendering device code + launch spec.

A template accepts a card only when every kernel it can render is correct for that card's exact
signature (dtype, shape, strides, alignment, argument values): coverage is never wider than what the
kernel handles. Parameters tune speed only, never semantics.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.cards import OperatorCard


@dataclass(frozen=True)
class Rendered:
    """One template instance: CUDA source and TOML launch spec, with the params that made it."""

    source: str
    spec: str
    params: dict[str, Any]
    intent: str


class Template:
    """Base class. Subclasses set `name`, `ops`, and implement `accepts`, `space`, `render`."""

    name: str = ""
    ops: frozenset[str] = frozenset()        # ATen overload names this template may handle

    def accepts(self, card: OperatorCard) -> str | None:
        """None if every instance is correct for this card; else the reason it declines."""
        raise NotImplementedError

    def space(self, card: OperatorCard) -> Mapping[str, Sequence[Any]]:
        """The parameter space for this card (each value list non-empty, first value a sane default)."""
        raise NotImplementedError

    def render(self, card: OperatorCard, params: Mapping[str, Any]) -> Rendered:
        """Device code + launch spec for these params (params must come from `space`)."""
        raise NotImplementedError

    # Shared behaviour, rarely overridden.
    def default(self, card: OperatorCard) -> dict[str, Any]:
        return {k: v[0] for k, v in self.space(card).items()}

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None) -> dict[str, Any]:
        """A neighbour: change one parameter (one the intent names, when it names one) to another value."""
        space = self.space(card)
        keys = [k for k, v in space.items() if len(v) > 1]
        if not keys:
            return dict(params)
        focus = [k for k in keys if intent and intent in INTENT_PARAMS and k in INTENT_PARAMS[intent]]
        key = rng.choice(focus or keys)
        values = [v for v in space[key] if v != params.get(key)]
        return {**params, key: rng.choice(values)}

    def instances(self, card: OperatorCard) -> int:
        n = 1
        for v in self.space(card).values():
            n *= len(v)
        return n


# Which parameters an intent is about (the search asks siblings for different intents).
INTENT_PARAMS: dict[str, frozenset[str]] = {
    "vectorisation": frozenset({"vec", "unroll"}),
    "occupancy": frozenset({"block", "waves", "rows_per_block"}),
    "memory access": frozenset({"vec", "cache_hint", "rows_per_block"}),
    "decomposition": frozenset({"split", "passes", "chunks"}),
    "fusing passes": frozenset({"passes", "online"}),
}
