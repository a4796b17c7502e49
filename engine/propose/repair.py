"""The bounded repair loop: propose, check, and on a fixable failure ask for a repair with the feedback.

    proposal, attempt, history = await propose_with_repair(proposer, request, check=check, on_attempt=store_it)

`check` compiles and evaluates a usable proposal (the engine: compile + GPU lane; tests: a stub) and
returns its Attempt. Answers that are not usable are never checked; the loop turns them into an Attempt
with status 'unusable' (or 'declined') itself.

Lineage: attempt k (k >= 1) repairs attempt k-1 when attempt k-1 failed with a REPAIRABLE category;
after an answer that was only RETRIED it answers the same request as attempt k-1 (see
`repair_parents`). The engine stores each attempt from `on_attempt` with that parent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from engine.propose.base import Attempt, Proposal, ProposalRequest, Proposer

# Failures worth showing to the model with "fix this": verification categories, and unusable answers
# that still carry code whose problem is precise (a spec error, host code).
REPAIRABLE = frozenset({"compile", "launch", "runtime-fault", "timeout", "mismatch", "nan", "mutation",
                        "nondeterminism", "bad-spec", "host-code"})
# Unusable answers with nothing to repair: ask the same question again.
RETRY_SAME = frozenset({"no-code", "not-cuda", "no-spec", "truncated"})
# Everything else ends the loop: 'suspicious' (a cheat is not repaired), 'provider' (the client already
# retried transient errors), 'empty', declines, and unknown categories.

Check = Callable[[Proposal], Awaitable[Attempt]]
OnAttempt = Callable[[Proposal, Attempt, int], Awaitable[None]]


def unusable_attempt(proposal: Proposal) -> Attempt:
    """The Attempt of a proposal that was never checked (declined, or an unusable answer)."""
    status = "declined" if proposal.declined else "unusable"
    category = None if proposal.declined else (proposal.category or "no-code")
    return Attempt(candidate_id="", source=proposal.source, spec=proposal.spec, intent=proposal.intent,
                   status=status, category=category, message=proposal.reason)


def next_step(attempt: Attempt) -> str:
    """'done' | 'repair' | 'retry' | 'stop' after this attempt."""
    if attempt.category is None:
        return "done"  # verified (or compiled, in a dry run), or declined
    if attempt.category in REPAIRABLE:
        return "repair"
    if attempt.category in RETRY_SAME:
        return "retry"
    return "stop"


def repair_parents(attempts: Sequence[Attempt]) -> list[int | None]:
    """For each attempt of one loop: the index of the attempt it repairs, or None (the original request)."""
    parents: list[int | None] = []
    for k in range(len(attempts)):
        if k == 0:
            parents.append(None)
        elif attempts[k - 1].category in REPAIRABLE:
            parents.append(k - 1)
        else:
            parents.append(parents[k - 1])
    return parents


async def propose_with_repair(
    proposer: Proposer,
    request: ProposalRequest,
    *,
    check: Check,
    max_attempts: int = 3,
    on_attempt: OnAttempt | None = None,
) -> tuple[Proposal, Attempt, list[tuple[Proposal, Attempt]]]:
    """Up to `max_attempts` proposals for `request`; returns the last (proposal, attempt) and all of them.

    Every attempt, usable or not, is reported to `on_attempt(proposal, attempt, k)` (k = 0 for the first)
    before the next one is requested. A repair request is `request` with `failed=attempt, attempt=k`.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    history: list[tuple[Proposal, Attempt]] = []
    current = request
    for k in range(max_attempts):
        proposal = await proposer.propose(current)
        attempt = await check(proposal) if proposal.ok else unusable_attempt(proposal)
        history.append((proposal, attempt))
        if on_attempt is not None:
            await on_attempt(proposal, attempt, k)
        step = next_step(attempt)
        if step == "repair":
            # Built from the original request, so parent, lineage and siblings stay those of the node.
            current = replace(request, failed=attempt, attempt=k + 1)
        elif step != "retry":
            break
    return history[-1][0], history[-1][1], history
