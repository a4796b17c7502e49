"""The verification of one candidate on one card: every check of DESIGN.md, each failure categorised.

Device-agnostic: the candidate and eager are callables, so the same logic runs on the GPU lane and,
with Python stand-ins for kernels, in CPU tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.verify.compare import CompareReport, bitwise_equal, compare_outputs
from engine.verify.inputs import Bound, clone_bound, edge_inputs, fresh_inputs, tensors_of
from engine.verify.tolerance import op_family, tolerances_for

RunCandidate = Callable[[Bound, str], list[torch.Tensor]]  # (arguments, prefill) -> outputs
RunEager = Callable[[Bound], Any]
# Families whose correct kernels may reorder floating-point accumulation (atomics, split reductions):
# for them a second run must agree within tolerance rather than bit for bit.
REORDERING_FAMILIES = frozenset({"reduction", "normalization", "matmul", "attention"})


@dataclass(frozen=True)
class Verdict:
    """The outcome: ok, or the first failure's category and a readable report."""

    ok: bool
    category: str | None = None
    message: str = ""
    input_set: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    sets_checked: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "category": self.category, "message": self.message,
                "input_set": self.input_set, "details": self.details, "sets_checked": self.sets_checked}


def as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _report_json(r: CompareReport) -> dict[str, Any]:
    return {"name": r.name, "category": r.category, "max_abs_err": r.max_abs_err,
            "max_rel_err": r.max_rel_err, "mismatches": r.mismatches, "numel": r.numel,
            "first_bad_index": r.first_bad_index, "got": _plain(r.first_bad_actual),
            "expected": _plain(r.first_bad_expected), "message": r.message}


def _plain(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return str(v)
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def _category(r: CompareReport) -> str:
    return "nan" if r.category == "nan" else "mismatch"


class CardCheck:
    """Verification of candidates for one card: its op, its input sets, eager's reference answers."""

    def __init__(self, op_name: str, samples: Sequence[Bound], eager: RunEager, *,
                 written_args: Sequence[str] = (), fresh: int = 2, edges: bool = True,
                 sync: Callable[[], None] = lambda: None, seed: int = 1234):
        self.op = op_name
        self.family = op_family(op_name)
        self.eager = eager
        self.written = set(written_args)
        self.sync = sync
        sets: list[tuple[str, Bound]] = [(f"sample {i}", s) for i, s in enumerate(samples)]
        if samples:
            sets += [(f"fresh {k}", fresh_inputs(samples[k % len(samples)], seed + k)) for k in range(fresh)]
            if edges:
                kinds = ("negated", "ties") if self.family in ("matmul", "attention") else ("negated", "ties", "large")
                sets += [(f"edge {kind}", b) for kind, b in edge_inputs(samples[0], kinds)]
        self.sets = sets

    def _expected(self, inputs: Bound) -> tuple[list[Any], Bound]:
        mine = clone_bound(inputs)
        out = as_list(self.eager(mine))
        self.sync()
        return out, mine

    def check(self, run: RunCandidate) -> Verdict:
        """Run every input set through the candidate (twice) and eager; stop at the first failure."""
        for n, (label, inputs) in enumerate(self.sets, 1):
            v = self._check_one(run, label, inputs)
            if v is not None:
                return Verdict(False, v.category, v.message, label, v.details, n)
        return Verdict(True, sets_checked=len(self.sets))

    def _check_one(self, run: RunCandidate, label: str, inputs: Bound) -> Verdict | None:
        first_in = clone_bound(inputs)
        before = [(p, t.clone()) for p, t in tensors_of(first_in)]
        got = as_list(run(first_in, "nan"))
        self.sync()
        expected, eager_in = self._expected(inputs)  # between the two candidate runs
        tols = tolerances_for(self.op, expected)
        reports = compare_outputs(got, expected, tols)
        bad = [r for r in reports if not r.ok]
        if bad:
            r = bad[0]
            return Verdict(False, _category(r), f"{label}: {r.message}",
                           details={"reports": [_report_json(x) for x in bad]})
        # Inputs must come back unchanged, except arguments the op's schema mutates: those must
        # end as eager left them.
        eager_after = dict(tensors_of(eager_in))
        for (path, old), (_, now) in zip(before, tensors_of(first_in)):
            name = path.split("[")[0]
            if name in self.written:
                r = compare_outputs([now], [eager_after[path]], tolerances_for(self.op, [now]))[0]
                if not r.ok:
                    return Verdict(False, "mismatch", f"{label}: mutated argument {path}: {r.message}",
                                   details={"reports": [_report_json(r)]})
            elif not bitwise_equal(old, now):
                changed = int((old != now).sum()) if old.dtype != torch.bool else -1
                return Verdict(False, "mutation", f"{label}: input {path} was modified by the candidate "
                               f"({changed} elements changed); inputs must stay as they were")
        # Second run on fresh buffers with a different prefill: unwritten elements show as a
        # difference; otherwise the result must repeat (bit for bit unless the op may reorder sums).
        second = as_list(run(clone_bound(inputs), "sentinel"))
        self.sync()
        for i, (a, b) in enumerate(zip(got, second)):
            if not isinstance(a, torch.Tensor) or bitwise_equal(a, b):
                continue
            unwritten = _unwritten(a, b)
            if unwritten:
                return Verdict(False, "nan", f"{label}: out{i}: {unwritten} elements are never written "
                               "(they keep whatever the buffer held)")
            if self.family in REORDERING_FAMILIES:
                r = compare_outputs([b], [a], tolerances_for(self.op, [a]))[0]
                if r.ok:
                    continue
                msg = r.message
            else:
                msg = f"{int((a != b).sum())} elements differ between two runs on the same inputs"
            return Verdict(False, "nondeterminism", f"{label}: out{i}: {msg}")
        return None

    def recheck_in_place(self, run: RunCandidate, buffers: Bound, seed: int = 99) -> Verdict:
        """After timing: new values written into the SAME buffers the candidate was timed on.

        A candidate that caches results by pointer (or skips work when it has seen an address)
        returns stale answers here.
        """
        fresh = fresh_inputs(buffers, seed)
        for (_, dst), (_, src) in zip(tensors_of(buffers), tensors_of(fresh)):
            dst.copy_(src) if not _overlapping(dst) else _cover_copy(dst, src)
        self.sync()
        expected, _ = self._expected(buffers)
        got = as_list(run(buffers, "nan"))
        self.sync()
        reports = compare_outputs(got, expected, tolerances_for(self.op, expected))
        bad = [r for r in reports if not r.ok]
        if bad:
            return Verdict(False, _category(bad[0]), "after timing, with new values in the same buffers: "
                           f"{bad[0].message} (stale results: a cache keyed by address?)",
                           "re-check", {"reports": [_report_json(r) for r in bad]})
        return Verdict(True, sets_checked=1)


def _unwritten(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.is_floating_point():
        return int((torch.isnan(a) & ~torch.isnan(b)).sum())
    return int(((a == -1) & (b == 7)).sum()) if a.dtype != torch.bool else 0


def _overlapping(t: torch.Tensor) -> bool:
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def _cover_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    from engine.verify.inputs import cover

    cover(dst).copy_(cover(src))
