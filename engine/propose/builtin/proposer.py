"""BuiltinProposer: picks the template that accepts a card, renders defaults, mutates parents."""

from __future__ import annotations

import hashlib
import importlib
import random
from collections.abc import Mapping
from typing import Any

from engine.cards import OperatorCard
from engine.propose.base import Hardware, Proposal, ProposalRequest
from engine.propose.builtin.cuda_common import has_clusters
from engine.propose.builtin.template import H200, Rendered, Template

# Modules that export TEMPLATES: list[Template]. A module that is missing is skipped, so template
# families can land one by one.
_MODULES = ("elementwise", "softmax", "pooling", "group_norm", "group_norm_cl", "row_norms", "batch_norm", "chains",
            "resample")
# Keys the proposer adds to a template's params (the template's name, the plan's description): not
# parameters of the template, so they never take part in comparing two candidates' params.
_BOOKKEEPING = ("template", "plan")
_TRIES = 32  # mutations tried for an untried neighbour whose kernel is new (as many again without the intent)


def _kernel_digest(r: Rendered) -> str:
    """A kernel is its source and its launch spec: an elementwise template renders one source with several
    block sizes and wave counts, each a different kernel on the GPU (and a different candidate in the store)."""
    return hashlib.sha256(r.source.encode() + b"\0" + r.spec.encode()).hexdigest()


def _knobs(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A template's own parameters out of stored candidate params."""
    return {k: v for k, v in (params or {}).items() if k not in _BOOKKEEPING}


def _runs_on(source: str, hw: Hardware) -> bool:
    """False for a kernel the GPU cannot launch (a thread-block cluster kernel for a GPU without them).
    The spaces already leave cluster strategies out there; this keeps it true of every proposal."""
    return has_clusters(hw) or "__cluster_dims__" not in source


def all_templates() -> list[Template]:
    """Every template of every family module, in `_MODULES` order."""
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

    def template_for(self, card: OperatorCard, *, hw: Hardware = H200) -> tuple[Template | None, list[str]]:
        """The first template that accepts the card, and why the others declined."""
        reasons = []
        for t in self.templates:
            if card.op not in t.ops:
                continue
            why = t.accepts(card, hw=hw)
            if why is None:
                return t, reasons
            reasons.append(f"{t.name}: {why}")
        return None, reasons or [f"no builtin template for {card.op}"]

    def supports(self, card: OperatorCard) -> bool:
        return self.template_for(card)[0] is not None

    async def propose(self, request: ProposalRequest) -> Proposal:
        """The default kernel for a fresh request, else an untried neighbour of the parent (or of the
        default), mutated along `request.intent` first; rendered for `request.hardware`."""
        card, hw = request.card, request.hardware
        template, reasons = self.template_for(card, hw=hw)
        if template is None:
            return Proposal(declined=True, reason="; ".join(reasons), provider=self.name)
        seed_text = f"{card.card_id}:{request.seed}:{request.parent.candidate_id if request.parent else ''}"
        rng = random.Random(int(hashlib.sha256(seed_text.encode()).hexdigest()[:16], 16))
        base = request.failed or request.parent
        tried = [_knobs(a.params) for a in (*request.siblings, *request.lineage) if a.params]
        if base is not None and base.params:
            tried.append(_knobs(base.params))
        emitted = self._emitted.setdefault(card.card_id, set())

        def fresh(params: dict[str, Any]) -> Rendered | None:
            if params in tried:
                return None
            r = template.render(card, params, hw=hw)
            new = _kernel_digest(r) not in emitted and _runs_on(r.source, hw) and r.params not in tried
            return r if new else None

        rendered = None
        default = template.default(card, hw=hw)
        if base is None or not base.params:
            rendered = fresh(default)
        if rendered is None:
            # A revision mutates its parent; a further fresh kernel mutates the default (diverse starts).
            # The request's intent picks the parameters to change; once every such neighbour is taken,
            # any parameter may change (the search asked for a new kernel, the intent is its focus).
            start = _knobs(base.params) if base is not None and base.params else default
            for intent in (request.intent, None) if request.intent else (None,):
                for _ in range(_TRIES):
                    rendered = fresh(template.mutate(card, start, rng, intent, hw=hw))
                    if rendered is not None:
                        break
                if rendered is not None:
                    break
            if rendered is None:
                return Proposal(declined=True, provider=self.name, model=template.name, category="exhausted",
                                reason="every neighbour of this parent was tried already")
        emitted.add(_kernel_digest(rendered))
        params = {**rendered.params, "template": template.name}
        if request.intent is None:
            intent = rendered.intent
        else:  # the intent the search asked for; the plan's description stays visible in the params
            intent, params["plan"] = request.intent, rendered.intent
        return Proposal(source=rendered.source, spec=rendered.spec, intent=intent, params=params,
                        provider=self.name, model=template.name)
