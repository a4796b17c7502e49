"""Which card gets the next iteration: expected end-to-end gain, not round-robin (pure functions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.cards import CardRef, OperatorCard, chain_cover
from engine.outcomes import CARD_SKIP_REASONS


@dataclass(frozen=True)
class SchedulePolicy:
    noise_floor_us: float = 2.0        # cards whose eager time is below this are not worth a kernel
    min_share: float = 0.001           # nor cards below 0.1 % of the model's time
    near_roofline: float = 1.15        # stop a card once its best is within 15 % of its roofline
    patience: int = 15                 # stop a card after this many iterations without improvement
    improvement: float = 0.01          # what counts as an improvement (1 %)


@dataclass
class CardState:
    """A card in a run: what it is, how it is going."""

    card: OperatorCard
    samples: list[str]                 # absolute paths of its sample files
    iterations: int = 0                # evaluations finished (verified or failed) and proposals declined
    in_flight: int = 0
    best_us: float | None = None
    since_improvement: int = 0
    done_reason: str | None = None     # 'budget', 'roofline', 'plateau', 'declined', 'noise', 'no-samples'
    priority_boost: float = 1.0        # set from a 'prioritize' control row
    failures: dict[str, int] = field(default_factory=dict)
    note: str | None = None            # why, in words, where done_reason alone does not say (a cpu-only op)
    covered: float = 0.0               # of an op card's share, what chain cards in play hold (count_chains_once)

    @property
    def ref(self) -> CardRef:
        return self.card.ref(self.samples)

    @property
    def card_id(self) -> str:
        return self.card.card_id

    @property
    def eager_us(self) -> float | None:
        return self.card.eager_us

    @property
    def roofline_us(self) -> float | None:
        return self.card.roofline_us

    @property
    def share(self) -> float:
        return self.card.share

    @property
    def own_share(self) -> float:
        """The share that only this card can win: an op card's calls inside chains in play count for the chain."""
        return max(0.0, self.card.share - self.covered)

    def record(self, best_us: float | None, policy: SchedulePolicy) -> None:
        """Account one finished iteration (best_us None: it failed)."""
        self.iterations += 1
        if best_us is not None and (self.best_us is None or best_us < self.best_us * (1 - policy.improvement)):
            self.best_us = best_us
            self.since_improvement = 0
        else:
            if best_us is not None and (self.best_us is None or best_us < self.best_us):
                self.best_us = best_us
            self.since_improvement += 1


def skip_reason(card: CardState, policy: SchedulePolicy) -> str | None:
    """Why a card gets no iterations at all (before any work)."""
    if not card.samples:
        return "no-samples"
    if card.eager_us is not None and card.eager_us < policy.noise_floor_us:
        return "noise"
    if card.share < policy.min_share:
        return "noise"
    return None


def stop_reason(card: CardState, policy: SchedulePolicy, iterations_per_card: int) -> str | None:
    """Why a card stops getting iterations now."""
    if card.done_reason:
        return card.done_reason
    if card.iterations + card.in_flight >= iterations_per_card:
        return "budget"
    if card.best_us is not None and card.roofline_us and card.best_us <= policy.near_roofline * card.roofline_us:
        return "roofline"
    if card.since_improvement >= policy.patience:
        return "plateau"
    return None


def in_play(chain: CardState) -> bool:
    """A chain card that may still serve its calls: searching, or finished with a kernel faster than eager."""
    if chain.done_reason is None:
        return True
    if chain.done_reason in CARD_SKIP_REASONS or chain.best_us is None:
        return False
    return chain.eager_us is None or chain.best_us < chain.eager_us


def count_chains_once(cards: list[CardState]) -> None:
    """Count each call once: an op card's calls that a module chain card in play holds are that chain's
    share, not the op card's (its `covered`); a chain declined, skipped or finished without a win gives them
    back. A pattern chain card (its calls inside a module's forward, not the whole of it) holds nothing here:
    it runs only inside torch.compile's graphs, while the shares are of eager's time, where only its member's
    op card can serve those calls (the SD3.5 VAE's GroupNorm → SiLU chains kept every GroupNorm op card of
    their shapes at no share, and none was searched)."""
    states = {c.card_id: c for c in cards}
    for c in cards:
        c.covered = 0.0
    for op_id, held in chain_cover(c.card for c in cards).items():
        states[op_id].covered = min(states[op_id].card.share,
                                    sum(s for chain_id, s in held.items()
                                        if serves_eager(states[chain_id]) and in_play(states[chain_id])))


def compile_only(card: CardState) -> bool:
    """A card whose kernel serves only inside torch.compile's graphs: a pattern chain card, or a channels-last
    twin (engine.capture.twins: the layout compiled code hands an op, which eager never shows; its eager time
    includes the copy to contiguous PyTorch's kernel needs, which is not the alternative there)."""
    if card.card.signature.get("twin_of"):
        return True
    return card.card.chain is not None and not serves_eager(card)


def serves_eager(chain: CardState) -> bool:
    """A chain card whose kernel can serve its calls in eager: a module card (a pattern card cannot)."""
    return (chain.card.chain or {}).get("kind") == "module"


def expected_gain(card: CardState) -> float:
    """The part of the model's time this card may still win, discounted by the iterations already spent.

    The card's own share (`count_chains_once`: calls a chain card holds count for the chain only) is of the
    model's time at eager's speed; what is left to win is the distance from its current best to its roofline,
    as a fraction of eager's time: share × (current − roofline) / eager. Without a roofline, assume half of
    the current time could still go. A card already 15× faster than eager has little left to give, whatever
    its share was, and gives way to cards nobody has tried (before, the headroom was taken relative to the
    current time but weighed by eager's share, so a 20 % card with a 15× kernel still outranked every fresh
    2 % card and kept the search to itself). A pattern card runs only inside torch.compile's graphs, where
    the alternative is torch.compile's code for its chain: its current time is at most that (`compile_us`,
    where the run measured it), so a GroupNorm → SiLU chain that Inductor already fuses to 308 µs from eager's
    3,787 has a tenth of the gain left that its eager time suggests. A channels-last twin likewise
    (`compile_only`): its eager time holds PyTorch's copy to contiguous (7.1 ms against Inductor's few hundred
    µs for the VAE's largest GroupNorm), and its alternative under compile is Inductor's code for the op.
    """
    current = min(t for t in (card.best_us, card.eager_us, math.inf) if t)  # a slower kernel: eager still serves
    inductor = card.card.compile_us if compile_only(card) else None
    if inductor:  # a pattern card runs only in compiled graphs, where torch.compile's own code for it serves
        current = min(current, inductor)
    if current < math.inf and card.roofline_us:
        left = max(0.0, 1.0 - card.roofline_us / current)
    else:
        left = 0.5
    if (card.best_us or inductor) and card.eager_us:
        left *= current / card.eager_us
    # Diminishing returns: a card tried many times without progress gives way to fresh ones.
    fatigue = 1.0 / math.sqrt(1.0 + card.since_improvement)
    return card.own_share * left * fatigue * card.priority_boost


def next_card(cards: list[CardState], policy: SchedulePolicy, iterations_per_card: int) -> CardState | None:
    """The open card with the highest expected gain (ties: more own share, then id). Call
    `count_chains_once` over all the run's cards first."""
    open_cards = [c for c in cards if stop_reason(c, policy, iterations_per_card) is None]
    if not open_cards:
        return None
    return max(open_cards, key=lambda c: (expected_gain(c), c.own_share, c.ref.card_id))


# Under --wall-time, the share of it all cards' torch.compile references may take (at least REFERENCE_MIN_S). The
# SD3.5 VAE's 360 s run spent 182 s on them for 27 cards and searched 99 s, 12 cards never reached (H100,
# 2026-12-06): the search is what the run is for.
REFERENCE_WALL_SHARE = 0.25
REFERENCE_MIN_S = 30.0


def reference_budget(wall_s: float | None, most_s: float) -> float:
    """Seconds all cards' torch.compile references may take: `most_s`, and under a wall time a quarter of it."""
    if wall_s is None:
        return most_s
    return min(most_s, max(REFERENCE_MIN_S, REFERENCE_WALL_SHARE * wall_s))


def reference_order(cards: list[CardState]) -> list[CardState]:
    """The order in which cards get their references: those whose kernel serves only under torch.compile first
    (the planner weighs them by Inductor's time for them, `expected_gain`; without it, a channels-last twin's
    eager time holds PyTorch's copy to contiguous and the twin outranks everything), then by share."""
    return sorted(cards, key=lambda c: (not compile_only(c), -c.share, c.card.card_id))
