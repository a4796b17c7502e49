"""Builtin kernel templates: a parameter space over one op family, rendering device code + launch spec.

A template accepts a card only when every kernel it can render is correct for that card's exact
signature (dtype, shape, strides, alignment, argument values): coverage is never wider than what the
kernel handles. Parameters tune speed only, never semantics.

Every method takes the GPU the kernel is for (`hw`, an `engine.propose.base.Hardware`): the space sizes
grids by its SM count, budgets shared memory by its per-block limit and offers thread-block cluster
kernels only where its architecture has them (`Hardware.clusters`). The request's hardware comes from the
lane's `hello` (`Hardware.from_hello`) or, for a dry run, a named profile
(`engine.propose.hardware_profiles.profile`). The default is the H200 the templates were tuned on, so
tools that render for it need not say so.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware
from engine.propose.intents import INTENTS

H200 = Hardware()  # the GPU a template renders for unless told otherwise


@dataclass(frozen=True)
class Rendered:
    """One template instance: CUDA source and TOML launch spec, with the params that made it.

    `params` are the params the kernel was actually rendered with (a render may narrow a requested
    value that does not apply, e.g. a vector width the chosen strategy cannot use); `intent` is a human
    description of the plan (the TUI shows it)."""

    source: str
    spec: str
    params: dict[str, Any]
    intent: str


class Template:
    """Base class. Subclasses set `name`, `ops`, and implement `accepts`, `space`, `render`."""

    name: str = ""
    ops: frozenset[str] = frozenset()        # ATen overload names this template may handle

    def accepts(self, card: OperatorCard, *, hw: Hardware = H200) -> str | None:
        """None if every instance is correct for this card; else the reason it declines."""
        raise NotImplementedError

    def space(self, card: OperatorCard, *, hw: Hardware = H200) -> Mapping[str, Sequence[Any]]:
        """The parameter space for this card (each value list non-empty, first value a sane default)."""
        raise NotImplementedError

    def render(self, card: OperatorCard, params: Mapping[str, Any], *, hw: Hardware = H200) -> Rendered:
        """Device code + launch spec for these params (params must come from `space`)."""
        raise NotImplementedError

    # Shared behaviour, rarely overridden.
    def default(self, card: OperatorCard, *, hw: Hardware = H200) -> dict[str, Any]:
        """The first value of every parameter."""
        return {k: v[0] for k, v in self.space(card, hw=hw).items()}

    def mutate(self, card: OperatorCard, params: Mapping[str, Any], rng: random.Random,
               intent: str | None = None, *, hw: Hardware = H200) -> dict[str, Any]:
        """A neighbour: change one parameter (one the intent names, when it names one) to another value."""
        space = self.space(card, hw=hw)
        keys = [k for k, v in space.items() if len(v) > 1]
        if not keys:
            return dict(params)
        focus = [k for k in keys if k in intent_params(intent)]
        key = rng.choice(focus or keys)
        values = [v for v in space[key] if v != params.get(key)]
        return {**params, key: rng.choice(values)}

    def instances(self, card: OperatorCard, *, hw: Hardware = H200) -> int:
        """How many parameter combinations the space holds."""
        n = 1
        for v in self.space(card, hw=hw).values():
            n *= len(v)
        return n


# Which template parameters each revision intent is about (keys: engine.propose.intents.INTENTS). A template
# mutates one of these when the request names the intent and it has one of them, else any parameter.
# "specialisation" names none: every builtin kernel already bakes in the card's shapes and strides.
INTENT_PARAMS: dict[str, frozenset[str]] = {
    "memory-access": frozenset({"vec", "cache_hint", "rows_per_block", "stash", "order"}),
    "vectorisation": frozenset({"vec", "unroll"}),
    "decomposition": frozenset({"strategy", "split", "passes", "chunks", "blocks_per_group", "cluster",
                                "group", "rows_per_block"}),
    "occupancy": frozenset({"block", "waves", "rows_per_block", "group"}),
    "fusing-passes": frozenset({"passes", "online", "stash"}),
    "reduction-strategy": frozenset({"strategy", "split", "chunks", "blocks_per_group", "cluster", "group"}),
    "instruction-efficiency": frozenset({"math", "unroll"}),
}
if set(INTENT_PARAMS) - set(INTENTS):  # a misspelt intent would silently never focus a mutation
    raise ValueError(f"INTENT_PARAMS names intents outside INTENTS: {sorted(set(INTENT_PARAMS) - set(INTENTS))}")


def intent_params(intent: str | None) -> frozenset[str]:
    """The parameters `intent` is about (none for no intent or one that names no parameter)."""
    return INTENT_PARAMS.get(intent or "", frozenset())
