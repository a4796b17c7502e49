"""A card's eager compiled by torch.compile (Inductor), as a timing reference: Inductor's code for that op
(or that chain) alone, on the card's own inputs.

The eager function is traced to an ATen graph first (`make_fx`), so Dynamo only sees generated code that
calls ATen ops on tensor arguments: an op card and a chain card (`run_chain`, plain Python over its
members) compile the same way, with no graph break inside the card. Non-tensor arguments are constants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# The strongest Inductor setting that leaves whole-graph CUDA graphs out (one op would be timed as a
# graph replay, which eager is not): what scripts/bench_compile_ops.py has always compared against.
MODE = "max-autotune-no-cudagraphs"

Bound = Sequence[tuple[str, Any]]


def tensor_leaves(bound: Bound) -> list[torch.Tensor]:
    """The tensors of a bound argument list in order, those inside lists included."""
    out: list[torch.Tensor] = []
    for _, v in bound:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [t for t in v if isinstance(t, torch.Tensor)]
    return out


def with_tensors(bound: Bound, tensors: Sequence[torch.Tensor]) -> list[tuple[str, Any]]:
    """`bound` with its tensors (in `tensor_leaves` order) replaced by `tensors`."""
    it = iter(tensors)
    out: list[tuple[str, Any]] = []
    for name, v in bound:
        if isinstance(v, torch.Tensor):
            v = next(it)
        elif isinstance(v, (list, tuple)):
            v = type(v)(next(it) if isinstance(t, torch.Tensor) else t for t in v)
        out.append((name, v))
    return out


def compile_eager(eager: Callable[[Bound], Any], bound: Bound, mode: str = MODE) -> Callable[[Bound], Any]:
    """torch.compile of `eager` for inputs shaped like `bound`: a function of a bound argument list with the
    same structure (same shapes, strides, dtypes and constants). Compiles lazily, on the first call."""
    from torch.fx.experimental.proxy_tensor import make_fx

    template = list(bound)

    def flat(*tensors: torch.Tensor) -> Any:
        return eager(with_tensors(template, tensors))

    with torch.no_grad():
        # Traced on copies: an in-place op runs once here, and must not change the caller's inputs.
        graph = make_fx(flat)(*[t.clone() for t in tensor_leaves(template)])
    compiled = torch.compile(graph, mode=mode, dynamic=False)

    def run(b: Bound) -> Any:
        with torch.no_grad():
            return compiled(*tensor_leaves(b))

    return run
