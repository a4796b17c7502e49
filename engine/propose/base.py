"""The proposer interface: what a proposer is told about a card, and what it hands back.

Plain frozen data crosses this boundary so that providers, the builtin templates, the repair loop and
the search can be developed and tested apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.cards import OperatorCard


@dataclass(frozen=True)
class Hardware:
    """The GPU the candidate will run on (from the lane's `hello`)."""

    name: str = "NVIDIA H200"
    arch: str = "sm_90"
    sms: int = 132
    l2_bytes: int = 60 * 1024 * 1024
    bandwidth_bps: float = 4.25e12            # measured copy bandwidth (bytes read + written per second)
    max_shared_per_block: int = 232448


@dataclass(frozen=True)
class Attempt:
    """A candidate already tried on this card: for lineage and sibling summaries, and repairs."""

    candidate_id: str
    source: str
    spec: str
    intent: str = ""
    status: str = ""                          # 'verified' | 'rejected' | …
    category: str | None = None               # rejection category
    message: str = ""                         # verification report or runtime error, human-readable
    diagnostics: str = ""                     # compile diagnostics summary (engine.compile.summarize)
    best_us: float | None = None
    speedup: float | None = None
    params: dict[str, Any] | None = None      # builtin template parameters, when it came from a template


@dataclass(frozen=True)
class ProposalRequest:
    """One request: a fresh kernel (no parent), a revision of `parent`, or a repair of `failed`."""

    card: OperatorCard
    hardware: Hardware
    parent: Attempt | None = None
    lineage: tuple[Attempt, ...] = ()         # ancestors of parent, oldest first
    siblings: tuple[Attempt, ...] = ()        # what other children of the parent already tried
    intent: str | None = None                 # the focus asked for ('vectorisation', 'occupancy', …)
    failed: Attempt | None = None             # set for a repair: the attempt to fix, with its feedback
    attempt: int = 0                          # repair attempt number (0 = first try)
    seed: int = 0


@dataclass(frozen=True)
class Usage:
    """Accounting of one provider call (zeros for the builtin proposer)."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True)
class Proposal:
    """A candidate (device code + launch spec), or a decline with its reason."""

    source: str = ""
    spec: str = ""
    intent: str = ""
    params: dict[str, Any] | None = None
    provider: str = ""
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    prompt: str = ""                          # what was sent (for the TUI and replay); never keys
    response: str = ""                        # what came back, verbatim
    declined: bool = False
    reason: str = ""                          # why declined, or why the answer was unusable
    category: str | None = None               # 'empty' | 'no-code' | 'no-spec' | 'not-cuda' | 'provider' …

    @property
    def ok(self) -> bool:
        return not self.declined and self.category is None and bool(self.source) and bool(self.spec)


class Proposer(Protocol):
    """Anything that turns a ProposalRequest into a Proposal."""

    name: str

    def supports(self, card: OperatorCard) -> bool:
        """False when this proposer declines the card outright (the card stays on eager)."""

    async def propose(self, request: ProposalRequest) -> Proposal:
        """One candidate for the request (or a decline/unusable answer, never an exception for bad output)."""
