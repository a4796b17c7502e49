"""The verification of one candidate on one card: every check of DESIGN.md, each failure categorised.

Device-agnostic: the candidate and eager are callables, so the same logic runs on the GPU lane and,
with Python stand-ins for kernels, in CPU tests.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from engine.capture.chains import CHAIN_OP, chain_written_inputs, run_chain
from engine.launch import WorkspacesKept, keeping_workspaces
from engine.ops import eager_call, resolve_op, written_aliases, written_args
from engine.verify.compare import CompareReport, bitwise_equal, compare_outputs, rounding_bias
from engine.verify.guard import Canaries, GuardViolation
from engine.verify.inputs import (
    Bound,
    Regenerator,
    clone_bound,
    cover,
    distinct_indices,
    edge_inputs,
    fresh_inputs,
    hot_logits_inputs,
    index_range_inputs,
    monotone,
    tensors_of,
    unaliased_inputs,
    wide_int_inputs,
)
from engine.verify.ties import adopt_tie_choice
from engine.verify.tolerance import REORDERING_FAMILIES, chain_family, op_family, tolerances_for

# (arguments, prefill) -> outputs; the prefill is 'nan', 'sentinel', or a list of stale answers, one per output
# (engine.launch.launcher.prefill_)
RunCandidate = Callable[[Bound, Any], list[torch.Tensor]]
RunEager = Callable[[Bound], Any]
Contend = Callable[[], AbstractContextManager]  # runs the candidate as on a busy GPU while entered (the lane's)
# Families whose correct kernels may reorder floating-point accumulation (atomics, split reductions):
# for them a second run must agree within tolerance rather than bit for bit.
# Families whose half-precision outputs are checked against a float64 reference (see CardCheck._precision).
PRECISION_FAMILIES = REORDERING_FAMILIES
# A correct kernel that accumulates in float32 in another order errs like eager (ratio about 1); float16
# or bfloat16 arithmetic on sums of hundreds of terms errs ten times more and beyond.
PRECISION_FACTOR = 3.0
# A chain card's reference is the chain in float64 and eager rounds only where its members store (a
# decomposed RMSNorm: once, at the end): a kernel that computes in float32 and rounds where eager rounds
# errs like eager (ratio at most 1.0 in docs/chains.md's sweep), while one that computes in bfloat16
# throughout errs 1.6x and more on rows of 32 to 4096 where eager rounds once; 3x let most such kernels
# pass. Where eager rounds twice (Llama's RMSNorm) they err 1.2-2.1x: caught on some samples only.
CHAIN_PRECISION_FACTOR = 1.5
_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# Families whose kernels compute statistics (means, variances, norms) that a cheaper form can lose under an offset
# of the inputs: they get the 'shifted' edge set (`inputs.SHIFT`), and the 'small' one, where a variance is of the
# order of an eps the kernel must add (`inputs.SMALL_RMS`).
SHIFTED_FAMILIES = frozenset({"reduction", "normalization"})
# Families that also get the 'zeros' set (every floating input 0: eager's answer is the bias, whatever the eps).
# Normalizations only: they add eps in float32 for every input dtype, where a reduction may not (float16
# cosine_similarity clamps by eps^2 in float16, 0, and eager's answer for zero vectors is NaN where an exact one is 0).
ZEROS_FAMILIES = frozenset({"normalization"})
# Families whose integer and floating operands get the 'signs' edge set (`inputs.edge_inputs`): arithmetic whose answer
# on operands of opposite signs is where kernels differ from eager (floor vs truncating division, remainder vs fmod).
# Not ops that take indices: a negative index is refused, and on the GPU eager's refusal is a device-side assert.
SIGNS_FAMILIES = frozenset({"elementwise"})
# Families whose integer operands get the 'wide ints' edge set (`inputs.wide_int_inputs`): arithmetic and sums, whose
# kernels may narrow integer arithmetic (int64 in 32-bit `int`, an int32 sum eager takes in int64).
WIDE_INT_FAMILIES = frozenset({"elementwise", "reduction"})
RACE_REPS = 6  # extra runs at the end of verification on new values, four of them as on a busy GPU (`contend`)


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
    """An op's (or a candidate's) outputs as a list. None is no output: an op whose schema returns `()` (the in-place
    `_foreach_add_`) returns None in eager, and a launched candidate, none; as one output, eager's None outnumbered
    the candidate's outputs and every candidate was rejected."""
    if out is None:
        return []
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


_DIGEST_WORDS = 1 << 20


def held_digest(bound: Bound, key: int) -> tuple[int, ...]:
    """Per tensor of an input set, a keyed checksum of its bytes: 64-bit words times weights drawn from `key`
    (odd, distinct per word of a chunk, scaled per chunk), summed with wrap-around. The weights exist on the device
    only while it is computed and are zeroed after: a kernel that rewrites a set cannot make its change cancel
    out without them."""
    out = []
    for _, t in tensors_of(bound):
        raw = cover(t).contiguous().reshape(-1).view(torch.uint8)
        if raw.numel() % 8 or raw.storage_offset() % 8:   # a tail past the last word, or a view not 8-aligned:
            raw = torch.cat([raw, raw.new_zeros(-raw.numel() % 8)])   # a copy of its own, padded
        words = raw.view(torch.int64)
        if words.numel() == 0:
            out.append(0)
            continue
        gen = torch.Generator(device=words.device).manual_seed(key)
        w = torch.randint(-(2**62), 2**62, (min(_DIGEST_WORDS, words.numel()),), generator=gen, dtype=torch.int64,
                          device=words.device) | 1
        acc = torch.zeros((), dtype=torch.int64, device=words.device)
        for i, start in enumerate(range(0, words.numel(), _DIGEST_WORDS)):
            part = words[start:start + _DIGEST_WORDS]
            acc += (part * w[:part.numel()]).sum() * (2 * i + 1)
        w.zero_()
        out.append(int(acc))
    return tuple(out)


class CardCheck:
    """Verification of candidates for one card: its op, its input sets, eager's reference answers.

    A candidate (`run(arguments, prefill) -> outputs`) must, on every input set: match eager within
    the tolerance table (non-finite values exactly where eager has them), leave its read-only inputs
    and the canary bytes around its input copies untouched, write every output element, repeat its
    result on a second run (and, at the end, several more runs, some beside a concurrent stream), and
    for half-precision reductions err against a float64 reference no more than `precision_factor`
    (`PRECISION_FACTOR`; a chain card's `CHAIN_PRECISION_FACTOR`) times eager's own error. A
    candidate's runner raises `GuardViolation` for a write outside its own buffers (outputs,
    workspaces); that is reported as `overrun`.
    """

    def __init__(self, op_name: str, samples: Sequence[Bound], eager: RunEager, *,
                 written_args: Sequence[str] = (), fresh: int = 2, edges: bool = True,
                 sync: Callable[[], None] = lambda: None, seed: int = 1234, guard: bool = True,
                 race_reps: int = RACE_REPS, contend: Contend | None = None, precision: bool = True,
                 family: str | None = None, reference64: RunEager | None = None,
                 precision_factor: float = PRECISION_FACTOR):
        self.op = op_name
        # A chain card's family is its members' (tolerance.chain_family), not its op's.
        self.family = family if family is not None else op_family(op_name)
        self.eager = eager
        # Eager on float64 copies for the precision check; defaults to `eager` (a chain's members cast
        # to their captured dtypes, so a chain passes a float64 version of itself).
        self.reference64 = reference64 if reference64 is not None else eager
        self.written = set(written_args)
        self.sync = sync
        self.guard = guard
        self.race_reps = race_reps
        self.contend = contend
        self.precision = precision
        self.precision_factor = precision_factor
        sets: list[tuple[str, Bound]] = [(f"sample {i}", s) for i, s in enumerate(samples)]
        # the index tensor drawn sets keep free of repeats where every sample's is (inputs.UNIQUE_WRITES)
        found = [distinct_indices(op_name, s) for s in samples]
        self.distinct: dict[str, int | None] = found[0] if found and all(f == found[0] for f in found) else {}
        if samples:
            sets += [(f"fresh {k}", fresh_inputs(samples[k % len(samples)], seed + k, distinct=self.distinct))
                     for k in range(fresh)]
            if edges:
                kinds = (("negated", "ties") if self.family in ("matmul", "attention")
                         else ("negated", "ties", "large", "wide", "nonfinite"))
                if self.family in SHIFTED_FAMILIES:
                    kinds += ("shifted", "small")
                if self.family in ZEROS_FAMILIES:
                    kinds += ("zeros",)
                if self.family in SIGNS_FAMILIES:
                    kinds += ("signs",)
                sets += [(f"edge {kind}", b) for kind, b in edge_inputs(samples[0], kinds)]
                if self.family in WIDE_INT_FAMILIES and (wide := wide_int_inputs(samples[0])) is not None:
                    sets.append(("edge wide ints", wide))
                if self.family == "attention" and (hot := hot_logits_inputs(samples[0])) is not None:
                    sets.append(("edge hot logits", hot))
                ranged = index_range_inputs(op_name, samples[0], seed + 99)
                if ranged is not None:
                    sets.append(("edge index range", ranged))
                # an op that writes no argument: a cast's guard does not key its aliasing (`unaliased_inputs`)
                unaliased = None if self.written else unaliased_inputs(samples, seed + 77)
                if unaliased is not None:
                    sets.append(("edge unaliased", unaliased))
        self.sets = sets
        self._samples, self._seed = list(samples), seed
        self.keep_ints = False   # integer inputs keep the samples' values (the op refused random ones)
        self.notes: list[str] = []   # input sets redrawn or dropped by `validate`
        self._validated = False
        self._ref64: dict[str, list[Any] | None] = {}
        self._stale: list[Any] | None = None   # eager's answer to the set checked last (`_check_set`)
        self._race_regen: tuple[bool, Regenerator] | None = None   # (keep_ints, the race runs' regenerator)
        # (key, a digest per stored set): made at the first check, before any candidate ran (`held_intact`)
        self._held: tuple[int, list[tuple[int, ...]]] | None = None
        self.held_damaged = False   # a candidate wrote into a stored set: the sets must be made again (the worker)

    def require_held_intact(self, label: str | None = None) -> None:
        """Raise GuardViolation where a stored input set (`label`'s, or any) no longer holds what it held at the
        first check. The sets live beside the candidate's copies, outside every canary, for every candidate of the
        card: a kernel that found them (a scan of its allocation's segment for a copy of its own input) could make
        the edge sets harmless (the non-finite set finite) for its own later sets, for eager, and for every later
        candidate (red team, 2026-12-06g). Checked before the first set, before eager runs on each set, after the
        last, and after timing (the lane's worker); a damaged check is `held_damaged`, to be made again."""
        if self._held is None:
            return
        key, digests = self._held
        for (name, inputs), digest in zip(self.sets, digests):
            if label is not None and name != label:
                continue
            if held_digest(inputs, key) != digest:
                self.held_damaged = True
                raise GuardViolation(f"wrote into the card's stored input set '{name}' (the sets every candidate "
                                     "and eager are checked on)")

    def held_tensors(self) -> list[Any]:
        """The device tensors this check keeps between candidates: its input sets (the samples among them) and eager's
        answer to the set checked last (what a lane's card budget counts)."""
        return [t for _, bound in self.sets for _, t in tensors_of(bound)] + list(self._stale or [])

    def allowing_ties(self, inputs: Bound, got: list[Any], expected: list[Any]) -> list[Any]:
        """Eager's answer with its index output replaced by the candidate's where the op leaves the choice among tied
        values open and the candidate's is another valid one (`ties.adopt_tie_choice`); what to compare `got` with."""
        return adopt_tie_choice(self.op, inputs, got, expected)

    def _vs(self, inputs: Bound, got: list[Any], expected: list[Any], held: list[Any]) -> list[Any]:
        """`allowing_ties`, every tensor it made put in `held` (scrubbed with the set's other outputs)."""
        want = self.allowing_ties(inputs, got, expected)
        held += [w for w, e in zip(want, expected) if w is not e]
        return want

    def tolerances(self, outputs: Any) -> list[Any]:
        """The table's tolerance per output of this card (its family, by each output's dtype)."""
        return tolerances_for(self.op, outputs, family=self.family)

    def _expected(self, inputs: Bound) -> tuple[list[Any], Bound]:
        mine = clone_bound(inputs)
        out = as_list(self.eager(mine))
        self.sync()
        return out, mine

    def candidate_copy(self, inputs: Bound) -> tuple[Bound, Canaries | None]:
        """The candidate's own copy of an input set, between canaries when guarding."""
        if not self.guard:
            return clone_bound(inputs), None
        canaries = Canaries(_device_of(inputs))
        return clone_bound(inputs, alloc=canaries.buffer), canaries

    def validate(self) -> None:
        """Eager once on every fresh and edge set (once per card). Random values can break what an op asks of its
        integer inputs: `embedding_bag`'s offsets must start at 0 and rise (those are drawn sorted,
        `inputs.monotone`), indices may have to be unique, lengths may have to add up. A fresh set eager refuses
        is drawn again with the samples' integer tensors kept, and timed calls then keep them too
        (`keep_ints`); an edge set eager refuses is dropped (`edge nonfinite` is judged where it runs). Each
        change is in `notes`. Without this the card's every candidate failed as an engine error."""
        if self._validated:
            return
        self._validated = True
        kept: list[tuple[str, Bound]] = []
        for label, b in self.sets:
            why = self._refused(b)
            if why is None or label.startswith(("sample", "edge nonfinite")):
                kept.append((label, b))
                continue
            if label.startswith("fresh"):
                k = int(label.split()[1])
                again = fresh_inputs(self._samples[k % len(self._samples)], self._seed + k, keep_ints=True)
                if self._refused(again) is None:
                    kept.append((label, again))
                    self.keep_ints = True
                    self.notes.append(f"{label}: eager refused random integer inputs ({why}); drawn again with "
                                      "the samples' integer tensors, as timed calls are")
                    continue
            self.notes.append(f"{label}: eager refuses it ({why}); not checked")
        self.sets = kept

    def _refused(self, inputs: Bound) -> str | None:
        """Why eager raises on these inputs (its first line), or None."""
        try:
            _scrub(as_list(self.eager(clone_bound(inputs))))
            self.sync()
        except Exception as e:  # noqa: BLE001 - any refusal of the values; a sticky CUDA error shows later
            return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return None

    def check(self, run: RunCandidate) -> Verdict:
        """Run every input set through the candidate (twice) and eager; stop at the first failure."""
        self.validate()
        if self._held is None:
            key = secrets.randbits(62)   # on the host only: no kernel can read it, nor the weights made from it
            self._held = (key, [held_digest(inputs, key) for _, inputs in self.sets])
        try:
            return self._check_sets(run)
        finally:
            _scrub(self._stale)   # no answer of this check outlives it (the next candidate's runs come next)
            self._stale = None

    def _check_sets(self, run: RunCandidate) -> Verdict:
        n = 0
        try:
            self.require_held_intact()
            for n, (label, inputs) in enumerate(self.sets, 1):
                v = self._check_one(run, label, inputs)
                if v is not None:
                    return Verdict(False, v.category, v.message, label, v.details, n)
            if self.sets and self.race_reps:
                v = self._race(run)
                if v is not None:
                    return Verdict(False, v.category, v.message, v.input_set, v.details, n)
            self.require_held_intact()
        except GuardViolation as e:
            label = self.sets[n - 1][0] if n else None
            return Verdict(False, "overrun", f"{label}: {e}", label, {}, n)
        return Verdict(True, sets_checked=len(self.sets))

    def _check_one(self, run: RunCandidate, label: str, inputs: Bound) -> Verdict | None:
        held: list[Any] = []   # every output of this set, the candidate's and eager's
        try:
            return self._check_set(run, label, inputs, held)
        finally:
            _scrub(held)

    def _check_set(self, run: RunCandidate, label: str, inputs: Bound, held: list[Any]) -> Verdict | None:
        """One input set (`_check_one`): every output made here is put in `held`, to be scrubbed after. The
        candidate's runs all come before eager's: no answer to this set exists in device memory while the
        candidate runs (the caching allocator does not clear blocks, and eager's output sat beside the
        candidate's second and third runs, for a kernel that learnt where to look)."""
        first_in, canaries = self.candidate_copy(inputs)
        before = [(p, t.clone()) for p, t in tensors_of(first_in)]
        got = self._candidate_run(run, first_in, canaries, "nan", held)
        # Second run on fresh buffers with a different prefill: unwritten elements show as a difference;
        # otherwise the result must repeat (bit for bit unless the op may reorder sums).
        second_in, canaries = self.candidate_copy(inputs)
        second = self._candidate_run(run, second_in, canaries, "sentinel", held)
        # A third (sample and fresh sets) whose outputs hold, before the call, eager's answer to the set checked
        # before: what a model's output buffers hold (the caching allocator hands back blocks with earlier
        # results in them, not the lane's NaN or sentinel). A kernel that computes only when its buffer looks
        # poisoned, and otherwise trusts it, returns that answer here, as it would return stale results in
        # the model. It must match eager on this set like the first run (`cheating` otherwise).
        stale, third = self._stale, None
        if stale is not None and label.startswith(("sample", "fresh")):
            third_in, canaries = self.candidate_copy(inputs)
            held += stale
            third = self._candidate_run(run, third_in, canaries, stale, held)
        self.require_held_intact(label)   # eager's inputs are the set as made, whatever the candidate wrote
        try:
            expected, eager_in = self._expected(inputs)
            held += expected
        except Exception:
            if label.startswith("edge nonfinite"):
                return None  # eager refuses non-finite inputs for this op (e.g. a range check): nothing to match
            raise
        tols = self.tolerances(expected)
        if label.startswith("edge nonfinite") and self.family in REORDERING_FAMILIES:
            tols = [replace(t, nonfinite_kind=False) for t in tols]
        reports = compare_outputs(got, self._vs(inputs, got, expected, held), tols)
        bad = [r for r in reports if not r.ok]
        if bad:
            r = bad[0]
            return Verdict(False, _category(r), f"{label}: {r.message}",
                           details={"reports": [_report_json(x) for x in bad]})
        # Inputs must come back unchanged, except arguments the op's schema mutates: those must
        # end as eager left them.
        eager_after = dict(tensors_of(eager_in))
        shared = written_aliases(first_in, self.written)
        for (path, old), (_, now) in zip(before, tensors_of(first_in)):
            name = path.split("[")[0]
            if name in self.written or path in shared:
                r = compare_outputs([now], [eager_after[path]], self.tolerances([now]))[0]
                if not r.ok:
                    return Verdict(False, "mismatch", f"{label}: mutated argument {path}: {r.message}",
                                   details={"reports": [_report_json(r)]})
            elif not bitwise_equal(old, now):
                changed = int((old != now).sum()) if old.dtype != torch.bool else -1
                return Verdict(False, "mutation", f"{label}: input {path} was modified by the candidate "
                               f"({changed} elements changed); inputs must stay as they were")
        precise = self._precision(label, inputs, got, expected)
        if precise is not None:
            return precise
        # Half-precision outputs must not lean one way (`compare.rounding_bias`): on the samples and fresh sets only,
        # where eager's answer is well conditioned (on a degenerate edge set, rows a bfloat16 shift made constant,
        # eager's own float32 statistics err by an ulp of the output, every element alike).
        for i, (a, e) in enumerate(zip(got, expected) if label.startswith(("sample", "fresh")) else ()):
            why = rounding_bias(a, e) if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) else None
            if why is not None:
                return Verdict(False, "mismatch", f"{label}: out{i}: within the tolerance per element, but {why}")
        v = self._repeats(label, got, second, unwritten_check=True)
        if v is not None:
            return v
        self._stale = [e.clone() if isinstance(e, torch.Tensor) else e for e in expected]
        if third is not None:
            bad_r = [r for r in compare_outputs(third, self._vs(inputs, third, expected, held), tols) if not r.ok]
            if bad_r:
                return Verdict(False, "cheating", f"{label}: with its output buffers holding another input set's "
                               f"answer before the call (as a model's buffers hold earlier results): "
                               f"{bad_r[0].message}; it passed with NaN and sentinel there, so it trusts what the "
                               "buffer held instead of computing every output",
                               details={"reports": [_report_json(x) for x in bad_r]})
        elif stale is not None:
            _scrub(stale)
        return None

    def _candidate_run(self, run: RunCandidate, inputs: Bound, canaries: Canaries | None, prefill: Any,
                       held: list[Any]) -> list[Any]:
        """One run of the candidate on its own copy of a set; its outputs go in `held`."""
        got = as_list(run(inputs, prefill))
        held += got
        self.sync()
        if canaries is not None and (bad := canaries.violations()):
            raise GuardViolation("wrote outside an input: " + "; ".join(bad))
        return got

    def _repeats(self, label: str, got: list[Any], again: list[Any], *, unwritten_check: bool,
                 how: str = "two runs on the same inputs") -> Verdict | None:
        for i, (a, b) in enumerate(zip(got, again)):
            if not isinstance(a, torch.Tensor) or bitwise_equal(a, b):
                continue
            unwritten = _unwritten(a, b) if unwritten_check else 0
            if unwritten:
                return Verdict(False, "nan", f"{label}: out{i}: {unwritten} elements are never written "
                               "(they keep whatever the buffer held)")
            if self.family in REORDERING_FAMILIES:
                r = compare_outputs([b], [a], self.tolerances([a]))[0]
                if r.ok:
                    continue
                msg = r.message
            else:
                msg = f"{int((a != b).sum())} elements differ between {how}"
            return Verdict(False, "nondeterminism", f"{label}: out{i}: {msg}")
        return None

    def _race(self, run: RunCandidate) -> Verdict | None:
        """More runs, each on values never seen before (drawn on the device like timed calls' values), four of six
        beside a stream that holds part of the GPU (other block interleavings); the candidate runs before eager, so
        no answer to its values exists anywhere while it runs. Each must match eager. With the sets verification
        had already run, a kernel that memoises on a fingerprint of its inputs returned its quiet first answer
        here and never met the busy stream (and eager's answer to them was in device memory to copy)."""
        pick = [(label, b) for label, b in self.sets if label.startswith(("sample", "fresh"))][:2] or self.sets[:1]
        # made once per card (its statistics: a float64 pass over each input, 10-20 ms on a 1 GB card); its
        # generator goes on from one candidate's runs to the next's, so no two draw the same values
        if self._race_regen is None or self._race_regen[0] != self.keep_ints:
            self._race_regen = (self.keep_ints, Regenerator(self._samples[0] if self._samples else pick[0][1],
                                                            self._seed + 1000, keep_ints=self.keep_ints,
                                                            distinct=self.distinct))
        regen = self._race_regen[1]
        for rep in range(self.race_reps):
            label, base = pick[rep % len(pick)]
            values = clone_bound(base)
            held: list[Any] = []
            try:
                regen.refill_(values)
                v = self._race_run(run, rep, label, values, held)
            finally:
                _scrub(held)
            if v is not None:
                return v
        return None

    def _race_run(self, run: RunCandidate, rep: int, label: str, values: Bound, held: list[Any]) -> Verdict | None:
        mine, canaries = self.candidate_copy(values)
        busy = self.contend is not None and (rep // 2) % 2 == 0
        with (self.contend() if busy else nullcontext()):
            got = as_list(run(mine, "nan" if rep % 2 else "sentinel"))
        held += got
        self.sync()
        if canaries is not None and (bad := canaries.violations()):
            raise GuardViolation("wrote outside an input: " + "; ".join(bad))
        where = f"repeated run {rep + 1} (new values drawn like {label}){' as on a busy GPU' if busy else ''}"
        try:
            exp, _ = self._expected(values)
        except Exception:   # noqa: BLE001 - eager refuses these values (random integers): nothing to match
            return None
        held += exp
        bad_r = [r for r in compare_outputs(got, self._vs(values, got, exp, held), self.tolerances(exp)) if not r.ok]
        if bad_r:
            return Verdict(False, "nondeterminism" if bad_r[0].category != "nan" else "nan",
                           f"{where}: {bad_r[0].message} (it passed every input set of the same kind before: "
                           "a race?)", input_set=where, details={"reports": [_report_json(x) for x in bad_r]})
        return None

    def precision_applies(self, expected: list[Any]) -> bool:
        """Whether outputs like `expected` get the precision check: half-precision outputs of an accumulating family."""
        return self.precision and self.family in PRECISION_FAMILIES and any(
            isinstance(e, torch.Tensor) and e.dtype in _UNIT_ROUNDOFF and e.numel() for e in expected)

    def _precision(self, label: str, inputs: Bound, got: list[Any], expected: list[Any]) -> Verdict | None:
        """Half-precision outputs of accumulating ops: error against float64 at most precision_factor × eager's."""
        if not label.startswith(("sample", "fresh")) or not self.precision_applies(expected):
            return None
        if label not in self._ref64:
            self._ref64[label] = self.reference64_of(inputs)
        return self.precision_against(label, self._ref64[label], got, expected)

    def precision_against(self, label: str, ref: list[Any] | None, got: list[Any], expected: list[Any]
                          ) -> Verdict | None:
        """The precision check of `got` given eager's answer `expected` and its float64 answer `ref` (`reference64_of`)."""
        halves = [i for i, e in enumerate(expected)
                  if isinstance(e, torch.Tensor) and e.dtype in _UNIT_ROUNDOFF and e.numel()]
        if not halves or ref is None or len(ref) != len(expected):
            return None
        copies: list[Any] = []   # the reference on the device and every float64 copy of an answer, scrubbed after
        try:
            for i in halves:
                r, e, a = ref[i], expected[i], got[i]
                if not isinstance(r, torch.Tensor) or r.dtype != torch.float64 or r.shape != e.shape:
                    continue
                host, r = r, r.to(e.device)
                if r is not host:   # a copy (on the CPU `to` returns the cached tensor itself)
                    copies.append(r)
                ed, ad = e.double(), a.double()
                copies += [ed, ad]
                fin = torch.isfinite(r) & torch.isfinite(ed) & torch.isfinite(ad)
                if not bool(fin.any()):
                    continue
                rf = r[fin]
                copies.append(rf)
                scale = _rms(rf)
                u = _UNIT_ROUNDOFF[e.dtype]
                # Two views of the error: absolute (RMS) and per element relative to the value (in units of
                # the format's roundoff; values below 1e-3 of the RMS count at that size). Rounding once from
                # an exact value errs by at most 0.5 in the second; float16 arithmetic by several.
                per = rf.abs().clamp_min(1e-3 * scale if scale > 0 else 1e-30) * u
                e_err, a_err = (ed - r)[fin], (ad - r)[fin]
                copies += [per, e_err, a_err]
                e_abs, a_abs = _rms(e_err), _rms(a_err)
                e_ulp, a_ulp = _rms(e_err / per), _rms(a_err / per)
                floor_abs, floor_ulp = 0.5 * u * scale, 0.5
                ratio = max(a_abs / max(e_abs, floor_abs), a_ulp / max(e_ulp, floor_ulp),
                            _worst_block_ratio(rf, e_err, a_err, per, u))
                if ratio > self.precision_factor:
                    return Verdict(False, "mismatch", f"{label}: out{i}: its error against a float64 reference is "
                                   f"{ratio:.1f}x eager's (rms {a_abs:.3g} vs {e_abs:.3g}; {a_ulp:.2f} vs {e_ulp:.2f} "
                                   f"roundoffs per element; at most {self.precision_factor:g}x allowed): it computes in lower "
                                   f"precision than eager, e.g. accumulates in {str(e.dtype).removeprefix('torch.')} "
                                   "where eager accumulates in float32",
                                   details={"precision": {"candidate_rms_err": a_abs, "eager_rms_err": e_abs,
                                                          "candidate_roundoffs": a_ulp, "eager_roundoffs": e_ulp,
                                                          "reference_rms": scale, "ratio": ratio,
                                                          "factor": self.precision_factor}})
        finally:
            _scrub(copies)
        return None

    def reference64_of(self, inputs: Bound, *, host: bool = True) -> list[Any] | None:
        """Eager on float64 copies of the floating inputs, or None where the op does not run in float64. Kept
        on the host (and its device copy scrubbed), as it is kept from one candidate's check to the next: an
        answer left in device memory could be copied instead of computed. `host=False` leaves it on the device,
        for a caller that uses it at once and scrubs it (a timed call's audit)."""
        try:   # out of memory for the float64 copies too: no reference (the check is skipped)
            mine = [(n, _to64(v)) for n, v in clone_bound(inputs)]
            out = as_list(self.reference64(mine))
            self.sync()
        except Exception:
            return None
        if not host:
            return out
        host = [o.cpu() if isinstance(o, torch.Tensor) else o for o in out]
        _scrub([o for o, h in zip(out, host) if o is not h])   # the device copies only
        return host

    def recheck_in_place(self, run: RunCandidate, buffers: Bound, seed: int = 99) -> Verdict:
        """After timing: calls on the SAME buffers as a model makes them, the candidate's workspaces kept as its
        last call left them and its outputs holding its own last answer (every other call of the lane finds
        its workspaces poisoned), new values written into the buffers in between:

        1. every value new: a candidate that caches results by address (or skips work when it has seen a
           pointer) returns the first call's answer for the second call's values;
        2. a few floating values changed (RECHECK_CHANGED per tensor, at positions drawn on the host, half of
           them above their row's largest value and half below its smallest, so that the answer moves, a max
           or min too): one that memoises on a fingerprint of some elements, in a workspace it does not zero,
           finds its fingerprint unchanged and returns the answer to values the buffers no longer hold.
           Poisoned workspaces never let such a memo hit in the lane, where it gains nothing; in a model
           called on the same inputs forward after forward (the export's whole-model check) it would.

        Eager runs after the candidate, on a copy of the inputs taken before it: no answer to the values
        exists in device memory while it runs. Sorted rows (`monotone`: searchsorted's sequence) are left as
        they are in step 2; integer inputs kept as sampled stay so (`keep_ints`), and other integer and boolean
        ones have a few values rotated among themselves (`_swap_a_few`: valid indices, the same multiset).
        """
        held = {t.untyped_storage().data_ptr() for _, t in tensors_of(buffers)}

        def let_go(ts: list[Any]) -> None:   # scrubbed, but never the buffers an in-place op returns
            _scrub([t for t in ts if not (isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in held)])

        def own(out: list[Any]) -> list[Any]:
            return [o.clone() if isinstance(o, torch.Tensor) else o for o in out]

        first = as_list(run(buffers, WorkspacesKept("nan")))
        self.sync()
        last = own(first)
        let_go(first)
        places = torch.Generator().manual_seed(secrets.randbits(62))
        try:
            for step, what in enumerate(("with new values in the same buffers",
                                         "with a few values changed in the same buffers, its workspaces as its "
                                         "last call left them")):
                fresh = fresh_inputs(buffers, seed + step, keep_ints=self.keep_ints, distinct=self.distinct)
                changed = False
                for (path, dst), (_, src) in zip(tensors_of(buffers), tensors_of(fresh)):
                    if step == 0:   # (integers kept as sampled are `fresh`'s too: copied unchanged)
                        dst.copy_(src) if not _overlapping(dst) else _cover_copy(dst, src)
                        changed = True
                    elif monotone(dst):
                        continue
                    elif dst.is_floating_point() or dst.is_complex():
                        changed |= _change_a_few(dst, src, places)
                    elif not self.keep_ints and path not in self.distinct:
                        changed |= _swap_a_few(dst, places)
                del fresh
                if not changed:
                    continue
                self.sync()
                values = clone_bound(buffers)   # eager's inputs, as the candidate finds them
                got = as_list(run(buffers, keeping_workspaces(last)))
                self.sync()
                expected, _ = self._expected(values)
                want = self.allowing_ties(values, got, expected)
                reports = compare_outputs(got, want, self.tolerances(expected))
                let_go(last)
                last = own(got)
                let_go([*got, *expected, *want])
                _scrub([t for _, t in tensors_of(values)])
                bad = [r for r in reports if not r.ok]
                if bad:
                    why = "a cache keyed by address?" if step == 0 else "a memo kept in a workspace?"
                    return Verdict(False, _category(bad[0]), f"after timing, {what}: {bad[0].message} "
                                   f"(stale results: {why})", "re-check",
                                   {"reports": [_report_json(r) for r in bad]})
        finally:
            let_go(last)
        return Verdict(True, sets_checked=1)


def card_check(op_name: str, signature: dict[str, Any], samples: Sequence[Bound], **kw: Any) -> CardCheck:
    """The CardCheck of any card. An ATen card's eager is its public op (arguments the schema writes must
    end as eager leaves them); a chain card's is `run_chain` over `in0..inN`, held to its loosest member's
    tolerances, with the chain run in float64 throughout as the precision check's reference, within
    `CHAIN_PRECISION_FACTOR` of eager's error; the inputs its members write in place (`chain_written_inputs`)
    must end as eager leaves them, as an op's written arguments must."""
    if op_name == CHAIN_OP:
        kw.setdefault("precision_factor", CHAIN_PRECISION_FACTOR)
        return CardCheck(op_name, samples, chain_eager(signature), family=chain_family(signature),
                         reference64=chain_eager(chain_in_float64(signature)),
                         written_args=chain_written_inputs(signature), **kw)
    op = resolve_op(op_name)
    return CardCheck(op_name, samples, eager_call(op, signature),
                     written_args=written_args(op, samples[0] if samples else None), **kw)


def chain_eager(signature: dict[str, Any]) -> RunEager:
    """Eager for a chain card as a CardCheck calls it: on the bound `in0..inN` (by name)."""
    names = [a["name"] for a in signature["args"]]

    def run(bound: Bound) -> list[torch.Tensor]:
        by_name = dict(bound)
        return run_chain(signature, [by_name[n] for n in names])
    return run


def chain_in_float64(signature: dict[str, Any]) -> dict[str, Any]:
    """The chain with every floating dtype its members cast to made float64: on float64 inputs it computes
    the chain's exact answer (`x.float() … .to(x.dtype)` would otherwise round back to the captured dtypes)."""
    def widen(v: Any) -> Any:
        if isinstance(v, dict) and set(v) == {"dtype"}:
            dt = getattr(torch, str(v["dtype"]), None)
            return {"dtype": "float64"} if isinstance(dt, torch.dtype) and dt.is_floating_point else v
        if isinstance(v, list):
            return [widen(x) for x in v]
        return v

    nodes = [{**n, "args": [{**a, "value": widen(a["value"])} if "value" in a else a for a in n["args"]]}
             for n in signature["chain"]["nodes"]]
    return {**signature, "chain": {**signature["chain"], "nodes": nodes}}


def _scrub(outs: Any) -> None:
    """Overwrite every tensor of `outs` with 0xFF bytes (NaN, -1) before it is let go: the caching allocator does
    not clear a block it takes back, so an answer left in one (eager's, another candidate's) could be copied by
    a later candidate's first run instead of computed, and its own computation would go unchecked."""
    for t in outs or ():
        if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
            try:
                cover(t).view(torch.uint8).fill_(0xFF)
            except RuntimeError:   # a layout cover cannot reinterpret: left as it is
                pass


def _unwritten(a: torch.Tensor, b: torch.Tensor) -> int:
    if a.is_floating_point():
        return int((torch.isnan(a) & ~torch.isnan(b)).sum())
    return int(((a == -1) & (b == 7)).sum()) if a.dtype != torch.bool else 0


# Elements per floating tensor the re-check's last call changes: few enough that a fingerprint of some elements
# almost never covers one (8 of a million: about 2e-5 each), while the answer moves where they feed it.
RECHECK_CHANGED = 4


def _change_a_few(dst: torch.Tensor, src: torch.Tensor, gen: torch.Generator) -> bool:
    """Change RECHECK_CHANGED elements of `dst` at positions drawn with `gen` (over the storage an overlapping
    tensor covers): a real one's alternately above its row's largest value and below its smallest (within a
    quarter of its dtype's range), a complex or 0-dim one's to `src`'s; whether any was changed."""
    d, s = (cover(dst), cover(src)) if _overlapping(dst) else (dst, src)
    if d.numel() == 0:
        return False
    if d.dim() == 0:
        d.copy_(s)
        return True
    idx = tuple(torch.randint(0, n, (RECHECK_CHANGED,), generator=gen).to(d.device) for n in d.shape)
    if d.is_complex():
        d[idx] = s[idx]
        return True
    # half above the row's largest value, half below its smallest: a max, a min, an argmax moves too
    rows = (d[idx[:-1]] if d.dim() > 1 else d.unsqueeze(0).expand(RECHECK_CHANGED, -1)).double()
    rows = torch.nan_to_num(rows, nan=0.0, posinf=0.0, neginf=0.0)
    top, low = rows.amax(-1), rows.amin(-1)
    cap = float(torch.finfo(d.dtype).max) / 4
    up = (top + top.abs() * 0.25 + 1).clamp(max=cap)
    down = (low - low.abs() * 0.25 - 1).clamp(min=-cap)
    d[idx] = torch.where(torch.arange(RECHECK_CHANGED, device=d.device) % 2 == 0, up, down).to(d.dtype)
    return True


def _swap_a_few(dst: torch.Tensor, gen: torch.Generator) -> bool:
    """Rotate the values of RECHECK_CHANGED elements of an integer or boolean `dst` among themselves, at positions
    drawn with `gen`: indices stay valid (each value is one the tensor held), a gather reads other rows there, and
    an integer-only card gets its last call too; whether any value moved."""
    d = cover(dst) if _overlapping(dst) else dst
    if d.numel() < 2:
        return False
    flat = d.reshape(-1)
    first = int(torch.randint(0, flat.numel(), (1,), generator=gen))
    others = (flat != flat[first]).nonzero().flatten().cpu()
    if others.numel() == 0:   # one value throughout: a boolean flips one, an integer stays (no other is known valid)
        if d.dtype != torch.bool:
            return False
        idx = torch.unravel_index(torch.tensor([first], device=d.device), d.shape)
        d[idx] = ~d[idx]
        return True
    # the first position and others holding another value: the rotation moves at least the first's (red team
    # 2026-12-07: four positions drawn blindly in a 0/1 tensor held one value an eighth of the time)
    pick = others[torch.randint(0, others.numel(), (RECHECK_CHANGED - 1,), generator=gen)]
    flat_idx = torch.cat([torch.tensor([first]), pick]).to(d.device)
    idx = torch.unravel_index(flat_idx, d.shape)
    values = d[idx].clone()
    d[idx] = values.roll(1)
    return True


def _overlapping(t: torch.Tensor) -> bool:
    return any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape))


def _cover_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    from engine.verify.inputs import cover

    cover(dst).copy_(cover(src))


# The precision ratio is also taken per block of the output (row-major, PRECISION_BLOCK elements at least, at most
# PRECISION_BLOCKS of them): over the whole output an RMS dilutes a kernel that accumulates in half precision on part
# of it (a quarter of a softmax's rows in float16 read 2.5x eager's error where every such row reads 4.7x). Blocks of
# thousands of elements keep a correct kernel's ratio as steady as the whole's.
PRECISION_BLOCK = 4096
PRECISION_BLOCKS = 64


def _worst_block_ratio(ref: torch.Tensor, e_err: torch.Tensor, a_err: torch.Tensor, per: torch.Tensor, u: float) -> float:
    """The largest precision ratio (`CardCheck.precision_against`'s) over blocks of the flattened finite elements;
    0 where the output is too small for two blocks. A few reductions over tensors the check already holds."""
    g = min(PRECISION_BLOCKS, ref.numel() // PRECISION_BLOCK)
    if g < 2:
        return 0.0
    n = ref.numel() // g * g

    def rms(x: torch.Tensor) -> torch.Tensor:
        return x[:n].view(g, -1).square().mean(dim=1).sqrt()

    scale = rms(ref)
    e_abs, a_abs = rms(e_err), rms(a_err)
    e_ulp, a_ulp = rms(e_err / per), rms(a_err / per)
    ratio = torch.maximum(a_abs / torch.maximum(e_abs, 0.5 * u * scale).clamp_min(1e-300),
                          a_ulp / e_ulp.clamp_min(0.5))
    return float(ratio.max())


def _rms(x: torch.Tensor) -> float:
    return math.sqrt(float(x.double().square().mean())) if x.numel() else 0.0


def _to64(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.to(torch.float64)
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return [_to64(x) for x in v]
    return v


def _device_of(bound: Bound) -> torch.device:
    for _, t in tensors_of(bound):
        return t.device
    return torch.device("cpu")
