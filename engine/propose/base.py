"""The proposer interface: what a proposer is told about a card, and what it hands back.

Plain frozen data crosses this boundary so that providers, the builtin templates, the repair loop and
the search can be developed and tested apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.cards import OperatorCard


def capability_of(arch: str) -> tuple[int, int] | None:
    """(major, minor) of an arch string ('sm_90' -> (9, 0), 'sm_121a' -> (12, 1)); None if unreadable."""
    digits = arch.removeprefix("sm_").removeprefix("compute_").rstrip("af")
    if len(digits) < 2 or not digits.isdigit():
        return None
    return int(digits[:-1]), int(digits[-1])


def arch_has_clusters(arch: str) -> bool:
    """Whether thread-block cluster kernels may be offered to this arch.

    Clusters need sm_90 or newer. The datacenter parts from there on (sm_9x, sm_10x) get them; the sm_12x
    family (RTX Blackwell, the DGX Spark's GB10, which has no distributed shared memory) does not: the
    cluster kernels were written for and measured on the H200 only, and they ask for clusters of up to 16
    blocks through the non-portable opt-in, which nobody has verified there. An arch we cannot read gets
    no clusters either (a slower kernel, never one that cannot launch).
    """
    cc = capability_of(arch)
    return cc is not None and (9, 0) <= cc < (11, 0)


@dataclass(frozen=True)
class Hardware:
    """The GPU the candidate will run on: from the lane's `hello` (`from_hello`), or for a dry run a
    named profile (`engine.propose.hardware_profiles.profile`). The defaults are the H200's."""

    name: str = "NVIDIA H200"
    arch: str = "sm_90"
    sms: int = 132
    l2_bytes: int = 60 * 1024 * 1024
    bandwidth_bps: float = 4.25e12            # measured copy bandwidth (bytes read + written per second)
    max_shared_per_block: int = 232448        # the opt-in maximum of dynamic + static shared memory
    shared_per_sm: int = 233472
    max_threads_per_sm: int = 2048
    clusters: bool | None = None              # thread-block clusters offered; None: from the arch
    integrated: bool = False                  # shares memory with the CPU (GB10, Jetson)
    measured: bool = True                     # bandwidth measured by a lane; False: a published peak

    def __post_init__(self) -> None:
        if self.clusters is None:
            object.__setattr__(self, "clusters", arch_has_clusters(self.arch))
        elif self.clusters and not arch_has_clusters(self.arch):
            # A device may report cluster launch (sm_12x does) where no template's cluster kernel is proven.
            object.__setattr__(self, "clusters", False)

    @property
    def capability(self) -> tuple[int, int] | None:
        """Compute capability (major, minor), from `arch`."""
        return capability_of(self.arch)

    @classmethod
    def from_hello(cls, hello: dict[str, Any]) -> Hardware:
        """The GPU a lane's `hello` reports (a lane from before a field existed: that field's default)."""
        d = cls()
        return cls(
            name=hello["name"], arch=hello["arch"], sms=int(hello["sms"]), l2_bytes=int(hello["l2_bytes"]),
            bandwidth_bps=float(hello["copy_bw"]), max_shared_per_block=int(hello["max_shared_per_block"]),
            shared_per_sm=int(hello.get("shared_per_sm", d.shared_per_sm)),
            max_threads_per_sm=int(hello.get("max_threads_per_sm", d.max_threads_per_sm)),
            clusters=bool(hello["cluster_launch"]) if "cluster_launch" in hello else None,
            integrated=bool(hello.get("integrated", False)),
        )


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
