"""BuiltinProposer: picks the template that accepts a card, renders defaults, mutates parents."""

from __future__ import annotations

import hashlib
import importlib
import random

from engine.cards import OperatorCard
from engine.propose.base import Proposal, ProposalRequest
from engine.propose.builtin.template import Template

# Modules that export TEMPLATES: list[Template]. A module that is missing is skipped, so template
# families can land one by one.
_MODULES = ("elementwise", "softmax", "pooling", "norms")


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _runs_on(source: str, arch: str) -> bool:
    """False for a kernel the GPU cannot launch: thread-block clusters need sm_90 or newer."""
    try:
        major = int(arch.removeprefix("sm_").rstrip("af")) // 10
    except ValueError:
        return True  # an arch string we do not know: let the compiler decide
    return major >= 9 or "__cluster_dims__" not in source


def all_templates() -> list[Template]:
    out: list[Template] = []
    for name in _MODULES:
        try:
            mod = importlib.import_module(f"engine.propose.builtin.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"engine.propose.builtin.{name}":
                raise
            continue
        out.extend(mod.TEMPLATES)
    return out


class BuiltinProposer:
    """Offline proposer. Declines every card no template fully handles (it stays on eager)."""

    name = "builtin"

    def __init__(self, templates: list[Template] | None = None):
        self.templates = all_templates() if templates is None else templates
        # Sources already proposed per card in this process: different parameters can render the same
        # kernel (a parameter the strategy ignores), and cousins in the tree are not in the request.
        self._emitted: dict[str, set[str]] = {}

    def template_for(self, card: OperatorCard) -> tuple[Template | None, list[str]]:
        """The first template that accepts the card, and why the others declined."""
        reasons = []
        for t in self.templates:
            if card.op not in t.ops:
                continue
            why = t.accepts(card)
            if why is None:
                return t, reasons
            reasons.append(f"{t.name}: {why}")
        return None, reasons or [f"no builtin template for {card.op}"]

    def supports(self, card: OperatorCard) -> bool:
        return self.template_for(card)[0] is not None

    async def propose(self, request: ProposalRequest) -> Proposal:
        card = request.card
        template, reasons = self.template_for(card)
        if template is None:
            return Proposal(declined=True, reason="; ".join(reasons), provider=self.name)
        seed_text = f"{card.card_id}:{request.seed}:{request.parent.candidate_id if request.parent else ''}"
        rng = random.Random(int(hashlib.sha256(seed_text.encode()).hexdigest()[:16], 16))
        base = request.failed or request.parent
        tried = [a.params for a in (*request.siblings, *request.lineage) if a.params]
        if base is not None:
            tried.append(base.params)
        emitted = self._emitted.setdefault(card.card_id, set())
        rendered = None
        default = template.default(card)
        arch = request.hardware.arch
        if (base is None or not base.params) and {**default, "template": template.name} not in tried:
            r = template.render(card, default)
            if _digest(r.source) not in emitted and _runs_on(r.source, arch):
                rendered = r
        if rendered is None:
            # A revision mutates its parent; a further fresh kernel mutates the default (diverse starts).
            origin = base.params if base is not None and base.params else {**default, "template": template.name}
            start = {k: v for k, v in origin.items() if k != "template"}
            for _ in range(32):  # a neighbour nobody has tried yet, whose kernel is new, if one exists
                cand = template.mutate(card, start, rng, request.intent)
                if {**cand, "template": template.name} in tried:
                    continue
                r = template.render(card, cand)
                if _digest(r.source) not in emitted and _runs_on(r.source, arch):
                    rendered = r
                    break
            if rendered is None:
                return Proposal(declined=True, provider=self.name, model=template.name, category="exhausted",
                                reason="every neighbour of this parent was tried already")
        emitted.add(_digest(rendered.source))
        return Proposal(source=rendered.source, spec=rendered.spec, intent=rendered.intent,
                        params={**rendered.params, "template": template.name}, provider=self.name,
                        model=template.name)
