"""The one vocabulary of outcomes: candidate statuses, failure categories, run and card stop reasons.

Bottom layer (imports nothing from engine): the store checks values against these, the TUI filters and
explains by them, the reports count by them. A new category or reason is added here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# ---- candidates ----------------------------------------------------------------------------------------

# A candidate's life: proposed -> evaluating -> verified | rejected; 'compiled' is a dry run's end
# (compiled, never run on a GPU).
CANDIDATE_STATUSES = ("proposed", "evaluating", "verified", "rejected", "compiled")
IN_FLIGHT = frozenset({"proposed", "evaluating"})
FINISHED = frozenset({"verified", "rejected", "compiled"})

# Why a candidate that ran was rejected (DESIGN.md: every rejection has one of these).
REJECTION_CATEGORIES: dict[str, str] = {
    "compile": "NVRTC did not compile it",
    "launch": "the launcher refused its launch spec (kernel signature or device limits)",
    "runtime-fault": "it raised a CUDA error while running (illegal address, misaligned access, trap)",
    "timeout": "it did not finish in time (endless loop, spin wait, divergent __syncthreads)",
    "mismatch": "its results differ from eager PyTorch beyond the tolerance",
    "nan": "it left NaN where eager has numbers (unwritten outputs or bad arithmetic)",
    "mutation": "it changed an input tensor that the op only reads",
    "nondeterminism": "two runs on the same inputs gave different results (a race, state between calls)",
    "suspicious": "it timed faster than its bytes, FLOPs or a kernel launch physically allow, or slowed eager down",
    "overrun": "it wrote outside its buffers (the canary bytes around an output, workspace or input changed)",
    "cheating": "it behaves differently when timed, or returns what its output buffer held instead of computing it",
}
# Rejections whose verification report holds per-output numbers (max error, first bad index, values).
NUMERIC_REJECTIONS = frozenset({"mismatch", "nan", "mutation", "nondeterminism", "cheating"})

# Why a proposal never became runnable code (an unusable answer, or the provider failed); stored as a
# rejected candidate with this category.
PROPOSAL_FAILURES: dict[str, str] = {
    "empty": "the answer was blank",
    "no-code": "the answer had no __global__ kernel",
    "not-cuda": "the answer was Python or Triton, not CUDA",
    "no-spec": "the answer had a kernel but no launch spec",
    "bad-spec": "its launch spec does not parse or names a kernel the source lacks",
    "host-code": "it contains host code (main, <<<>>>, cudaMalloc, streams, torch headers)",
    "truncated": "the answer stopped inside the kernel source",
    "provider": "the provider call failed (after its retries)",
}

# The engine's own fault, not the candidate's (a lane protocol error, an evaluator bug).
ENGINE_FAILURES: dict[str, str] = {
    "internal": "the engine failed while evaluating it (a bug; see the error)",
    "protocol": "the lane could not take the request (card not loaded, no samples)",
    "lane-lost": "the lane (a Ray actor or its node) was lost twice while evaluating it",
    "memory": "the GPU ran out of memory while checking it (the card's input sets, not its code)",
}

# Every category a rejected candidate can carry, with its one-line meaning.
FAILURE_CATEGORIES: dict[str, str] = {**REJECTION_CATEGORIES, **PROPOSAL_FAILURES, **ENGINE_FAILURES}
UNKNOWN_CATEGORY = "unknown"  # shown for a rejected candidate stored without a category


def describe_failure(category: str | None) -> str:
    """One line a person can read for a rejection category (unknown ones say so)."""
    if not category or category == UNKNOWN_CATEGORY:
        return "rejected without a category"
    return FAILURE_CATEGORIES.get(category, f"category {category!r} (not one this version knows)")


# ---- runs ----------------------------------------------------------------------------------------------

RUN_STATUSES = ("created", "running", "paused", "stopped", "done", "failed")
LIVE_RUN_STATUSES = frozenset({"created", "running", "paused"})

# Why a run stopped (runs.stopped_by); all are clean ends, so `run` exits 0 after any of them.
RUN_STOP_REASONS: dict[str, str] = {
    "iterations": "every card finished (its iterations spent, or nothing left to try)",
    "wall_time": "the --wall-time budget ran out",
    "tokens": "the token budget ran out",
    "cost": "the cost budget ran out",
    "user": "stopped from the TUI",
    # Before any answer, PROVIDER_GIVE_UP proposals in a row failed in the provider call (a wrong base URL or
    # model, a server down): the rest of the budget would fail alike. `run` exits 1 and names the first error.
    "provider": "the provider never answered (the first proposals all failed in its call); --resume once it is up, or start "
                "again with the right base URL or model",
    # The one reason `run` does not exit 0 after: 130, as after any Ctrl-C; the run can be resumed.
    "interrupted": "stopped by Ctrl-C (SIGINT) in the terminal; --resume continues it",
}

# Commands a viewer can queue for a running search (controls.command).
CONTROL_COMMANDS = ("pause", "resume", "stop", "prioritize")

# How a recorded export (exports.status) ended: the cast written; refused or broken with no cast written;
# stopped by Ctrl-C before the cast was written.
EXPORT_STATUSES = ("written", "failed", "interrupted")

# ---- cards ---------------------------------------------------------------------------------------------

# Why a card gets no more iterations (the `reason` of its card_done / card_skipped event).
CARD_DONE_REASONS: dict[str, str] = {
    "budget": "its iterations are spent or in flight",
    "iterations": "its iterations are spent",
    "exhausted": "every revision the proposer can make was tried",
    "roofline": "its best is within reach of the roofline",
    "plateau": "no improvement for many iterations",
    "declined": "the proposer has nothing for this op",
    "noise": "too small to matter: below the noise floor or the minimum share of the model's time",
    "no-samples": "no captured inputs to verify against",
    "not-selected": "left out by run --ops (the run searches only the cards it matches)",
}
# Reasons a card is never searched at all (decided before any work).
CARD_SKIP_REASONS = frozenset({"noise", "declined", "no-samples", "not-selected"})

# ---- speed ---------------------------------------------------------------------------------------------


def _bound(ci: Sequence[float | None] | None, i: int) -> float | None:
    """Bound `i` (0 low, 1 high) of a speedup CI when it is a finite number, else None (unknown)."""
    if ci is None or len(ci) != 2:
        return None
    v = ci[i]
    return float(v) if v is not None and math.isfinite(v) else None


def faster_with_confidence(ci: Sequence[float | None] | None) -> bool:
    """The 95 % CI of a speedup (eager / candidate) lies wholly above 1: the one test for 'faster'."""
    low = _bound(ci, 0)
    return low is not None and low > 1.0


def slower_with_confidence(ci: Sequence[float | None] | None) -> bool:
    """The 95 % CI of a speedup lies wholly below 1 (an unknown CI is not 'slower with confidence')."""
    high = _bound(ci, 1)
    return high is not None and high < 1.0
