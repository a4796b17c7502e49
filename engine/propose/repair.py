"""The rules of the bounded repair loop: after a failed attempt, repair it, ask again, or stop.

The orchestrator runs the loop (engine.run.orchestrator); these rules decide each step:

    step = next_step(attempt)                # 'done' | 'repair' | 'retry' | 'stop'
    request = repair_request(first, attempt, k)

A repair is the failed candidate's child in the search tree; a retry answers the same request again, so it
is a sibling of the unusable answer. At most MAX_ATTEMPTS proposals are made for one request.
"""

from __future__ import annotations

from dataclasses import replace

from engine.propose.base import Attempt, ProposalRequest

# Proposals for one request: the first, then up to two repairs or retries.
MAX_ATTEMPTS = 3
# Failures worth showing to the model with "fix this": verification categories, and unusable answers
# that still carry code whose problem is precise (a spec error, host code).
REPAIRABLE = frozenset({"compile", "launch", "runtime-fault", "timeout", "mismatch", "nan", "mutation",
                        "nondeterminism", "overrun", "bad-spec", "host-code"})
# Unusable answers with nothing to repair: ask the same question again.
RETRY_SAME = frozenset({"no-code", "not-cuda", "no-spec", "truncated"})
# Everything else ends the loop: 'suspicious' and 'cheating' (a cheat is not repaired), 'provider' (the client already
# retried transient errors), 'empty', declines, and unknown categories.


def next_step(attempt: Attempt) -> str:
    """'done' | 'repair' | 'retry' | 'stop' after this attempt."""
    if attempt.category is None:
        return "done"  # verified (or compiled, in a dry run), or declined
    if attempt.category in REPAIRABLE:
        return "repair"
    if attempt.category in RETRY_SAME:
        return "retry"
    return "stop"


def repair_request(first: ProposalRequest, failed: Attempt, attempt: int) -> ProposalRequest:
    """The request for repair number `attempt` of `failed`, built from the loop's first request so that
    parent, lineage, siblings and intent stay those of the node being worked on."""
    return replace(first, failed=failed, attempt=attempt)
