"""The vocabulary of revision intents: what a revision of a kernel focuses on.

One list for everyone: the orchestrator picks one intent per request, the LLM prompts describe it, the
builtin templates map it to the parameters it is about, and the store keeps it on the candidate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

# The focus of a revision. Siblings get different ones so that a node's children explore different
# directions instead of the same rewrite several times.
INTENTS: list[str] = [
    "memory-access", "vectorisation", "decomposition", "occupancy", "fusing-passes",
    "reduction-strategy", "instruction-efficiency", "specialisation",
]
INTENT_DESCRIPTIONS: dict[str, str] = {
    "memory-access": "Make global memory traffic ideal: coalesced accesses along the contiguous dimension, "
                     "every byte read once, no redundant re-reads of inputs, reads and writes in full sectors.",
    "vectorisation": "Use 128-bit loads and stores (float4, uint4, __half2/__nv_bfloat162 pairs) where the "
                     "alignment and sizes allow, with a correct scalar tail.",
    "decomposition": "Change how the work is split: elements per thread, a block or a warp per row/plane, "
                     "grid-stride loops versus one element per thread, 2-D/3-D grids that match the shape.",
    "occupancy": "Tune the launch for this GPU: block size, blocks per SM, registers (__launch_bounds__), "
                 "shared memory per block, enough waves to fill every SM without a long tail.",
    "fusing-passes": "Do the work in fewer passes over memory: one kernel instead of several, single-pass "
                     "statistics (e.g. Welford), keep intermediate values in registers or shared memory.",
    "reduction-strategy": "Change how reductions are done: warp shuffles, block-level reduction in shared "
                          "memory, splitting a long reduction across blocks with a second pass over a "
                          "workspace — deterministically.",
    "instruction-efficiency": "Cut arithmetic and index overhead: 32-bit index math where it fits, precomputed "
                              "reciprocals, fast intrinsics only where the tolerance allows, unrolled loops.",
    "specialisation": "Exploit that this card is one exact call: bake its shapes, strides and constants into "
                      "the code (constexpr, templates instantiated behind extern \"C\" entry points) so loops "
                      "unroll and bounds checks vanish.",
}


def choose_intent(siblings: Sequence[str | None], ancestors: Sequence[str | None], seed: int = 0) -> str:
    """The focus of one revision: the intent the parent's other children used least, preferring one the
    last two ancestors (parent last) did not use; `seed` rotates ties, so runs differ yet reproduce."""
    used = Counter(i for i in siblings if i)
    recent = {i for i in list(ancestors)[-2:] if i}
    offset = seed % len(INTENTS)

    def rank(item: tuple[int, str]) -> tuple[int, bool, int]:
        k, name = item
        return used[name], name in recent, (k - offset) % len(INTENTS)

    return min(enumerate(INTENTS), key=rank)[1]
