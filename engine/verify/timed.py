"""Timed calls a candidate cannot tell from checked ones, and an audit of what they returned.

A kernel that knows when it is timed can cheat there and behave during verification: skip the work
when its output buffer already holds an answer, memoise on a fingerprint of its inputs, or notice a
burst of calls on the same pointers. So every timed call here is made the way verification calls are:

- its inputs are one of `slots` input sets, each in buffers of its own (between canaries), rotated
  call by call, and regenerated with new random values before every call (the statistics of the
  captured sample: the distributions verification's fresh sets come from), so nothing repeats;
- its outputs are fresh buffers poisoned as in verification (NaN or a finite sentinel, at random), or
  holding eager's last answer to its own values (stale, as a model's buffers hold earlier results): a
  kernel that trusts a buffer that does not look poisoned returns a wrong answer, which an audit sees;
- eager runs on buffers of its own, filled with values of its own (drawn alike, never the candidate's), so
  neither side can disturb the other's inputs, and no answer to the candidate's inputs exists anywhere in
  device memory while the candidate runs: a kernel that looks for eager's output of its values (at an
  address it learnt) finds none, and must compute;
- a random sample of calls (chosen on the host after the fact, so nothing on the device can know) is
  audited: after the candidate's call, eager runs untimed on the candidate's values as they were generated
  (drawn again from the generator's state once the call is done: no copy exists during it), and the
  candidate's outputs must match it (else `cheating`; where the card has a precision check, a spread-out
  sample of audits runs that too); its read-only inputs must
  be as generated, on both sides (else `mutation`, or `overrun` when eager's buffers changed), and the
  canaries around every buffer must be intact (else `overrun`).

`time_eager_alone` times eager by itself with the same rotation: the control that a candidate did not
make eager slower beside it; `time_alone` times any other function of the card's inputs that way (the
torch.compile reference).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.bench.stats import TimingStats, summarize
from engine.bench.timing import ABResult, Arm, L2Flusher, TimingConfig, ab_time, time_calls
from engine.ops import written_aliases
from engine.verify.compare import _as_bits, compare_outputs
from engine.verify.inputs import Bound, Regenerator, clone_bound, cover, tensors_of
from engine.verify.pipeline import CardCheck, _scrub, as_list

# What timed calls' fresh outputs hold before the call, drawn per call: verification's poisons, or (stale) eager's
# last answer, to its own values: what a model's buffers hold. A kernel that trusts a buffer that is not poisoned
# returns that answer, and an audit sees it.
PREFILLS = ("nan", "sentinel", "stale")
# Audited calls also held to verification's precision check, where the card has one: a kernel that computed in
# float16 only once timed stayed within the tolerance table, which was all an audit held it to. It costs a float64
# eager, so the j-th audit gets it with probability min(1, PRECISION_AUDITS / j): about PRECISION_AUDITS * (1 +
# ln(audits / PRECISION_AUDITS)) of them in all, spread over the whole timing (a kernel that cheats in a late half
# of its calls meets about PRECISION_AUDITS * ln 2 of them; the first audits alone it could wait out).
PRECISION_AUDITS = 4


@dataclass
class TimedCandidate:
    """How to time a candidate: `prepare(inputs, prefill)` allocates (and poisons) its outputs untimed
    and returns the timed launch; `after()` queues the check of its output canaries; `overran()` reads
    whether any queued check found damage (one sync)."""

    prepare: Callable[[Bound, Any], Callable[[], Any]]
    after: Callable[[], None] | None = None
    overran: Callable[[], bool] | None = None


@dataclass
class TimedRun:
    ab: ABResult
    category: str | None  # the first problem found: 'overrun', 'cheating' or 'mutation'; None if none
    message: str
    audited: int
    slot: Bound  # one of the candidate's input slots (for the re-check in place)

    def to_json(self) -> dict[str, Any]:
        return {"audited": self.audited, "problem": self.category, "message": self.message}


def _slot_bases(check: CardCheck, slots: int) -> list[Bound]:
    check.validate()   # input sets eager refuses are redrawn or dropped first
    bases = [b for label, b in check.sets if label.startswith(("sample", "fresh"))] or [b for _, b in check.sets]
    return [bases[k % len(bases)] for k in range(max(1, slots))]


def _snapshot(outs: list[Any]) -> list[Any]:
    return [o.clone() if isinstance(o, torch.Tensor) else o for o in outs]


def _lives_in(outs: list[Any], bound: Bound) -> bool:
    """Whether a tensor of `outs` shares storage with a tensor of `bound` (an argument returned, or a view of one)."""
    storages = {t.untyped_storage().data_ptr() for _, t in tensors_of(bound)}
    return any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in storages for o in outs)


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Device boolean: any byte differs (NaN payloads included); no sync."""
    return torch.ne(_as_bits(cover(a)), _as_bits(cover(b))).any()


@dataclass
class _Round:
    k: int = 0
    prefill: str = "nan"
    audit: bool = False
    pristine: Bound | None = None
    eager_pristine: Bound | None = None
    launch: Callable[[], Any] | None = None
    eager_out: list[Any] | None = None
    cand_out: list[Any] | None = None
    index: int = 0
    stale: list[Any] | None = None   # eager's last outputs (its own values): a stale prefill
    cand_state: torch.Tensor | None = None    # the generator's state before the candidate's values were drawn
    eager_state: torch.Tensor | None = None   # and before eager's


@dataclass
class _Audit:
    index: int
    k: int
    eager_out: list[Any]
    cand_out: list[Any]
    flags: list[tuple[str, str, torch.Tensor]] = field(default_factory=list)  # (category, message, device bool)
    imprecise: str | None = None   # what the precision check found (where this audit ran one)
    # arguments the op writes and does not return (a training batch norm's running statistics, `_foreach_add_`'s
    # list, an input overlapping a written one): (path, the candidate's, eager's), each a copy
    written: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)


def audited_ab(check: CardCheck, candidate: TimedCandidate, flush: L2Flusher,
               cfg: TimingConfig = TimingConfig(), *, seed: int | None = None) -> TimedRun:
    """Time eager against the candidate (A/B, as `ab_time`) with the protection of the module docstring."""
    seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1)
    rng = random.Random(seed)
    bases = _slot_bases(check, cfg.slots)
    cand_slots, slot_canaries = zip(*(check.candidate_copy(b) for b in bases))
    eager_slots = [clone_bound(b) for b in bases]
    # The values as generated, for an audit, in buffers made once: a round that will be audited does nothing on
    # the device, and allocates nothing, before the candidate's call that another round does not. Cloning only
    # for audited rounds moved the candidate's output to another address in exactly those rounds, and a kernel
    # that cheated while its output address repeated was never audited cheating (an H200 red-team run, 1.48x on
    # an add card). They are drawn again from the generator's state (kept on the host) only after the call: a
    # copy made before it could be found and rewritten, with the candidate's own inputs, to values whose answer
    # is cheap, and the audit compared the candidate with eager on those. Integers kept as the samples held them
    # (`keep_ints`) come from host copies.
    cand_pristine = [clone_bound(b) for b in cand_slots]
    eager_pristine = [clone_bound(b) for b in eager_slots]
    regen = Regenerator(bases[0], seed, keep_ints=check.keep_ints, distinct=getattr(check, "distinct", None))
    # whole storage extents (`cover`): a kept integer broadcast to its shape (stride 0) cannot be copied into
    kept_host = [[cover(t).to("cpu", copy=True) for t in regen.kept(b)] for b in bases]
    # kept integers the op writes in place: put back before every call on both sides, else each call's write
    # would add to the last and the audit's values (the originals) would not be the candidate's
    rewritten = [i for i, (path, _) in enumerate(regen.kept_named(bases[0])) if path.split("[")[0] in check.written]
    # read-only inputs that overlap a written one (`mul_(x, x)`'s `other`): the op's write changes them on both sides
    shared = written_aliases(bases[0], check.written)
    K = len(bases)
    rate = 1.0 / max(1, cfg.audit_every)
    st = _Round()
    pending: list[_Audit] = []
    problem: list[str] = []
    audited = [0]
    force = [False]
    seen = [0]   # audits so far

    def close_round() -> None:
        if not st.audit or st.cand_out is None or st.eager_out is None:
            st.audit = False
            return
        assert st.cand_state is not None and st.eager_state is not None
        for pristine, state in ((cand_pristine[st.k], st.cand_state), (eager_pristine[st.k], st.eager_state)):
            regen.redraw_(pristine, state)
            for dst, src in zip(regen.kept(pristine), kept_host[st.k]):
                cover(dst).copy_(src)
        st.pristine, st.eager_pristine = cand_pristine[st.k], eager_pristine[st.k]
        flags: list[tuple[str, str, torch.Tensor]] = []
        for (path, p), (_, c), (_, ep), (_, e) in zip(tensors_of(st.pristine), tensors_of(cand_slots[st.k]),
                                                      tensors_of(st.eager_pristine), tensors_of(eager_slots[st.k])):
            if path.split("[")[0] in check.written or path in shared:
                continue
            flags.append(("mutation", f"input {path} was modified during a timed call "
                          "(inputs must stay as they were)", _differs(p, c)))
            flags.append(("overrun", f"eager's own input {path} changed during timing: the "
                          "candidate wrote outside its buffers", _differs(ep, e)))
        seen[0] += 1
        ref64 = None
        if check.precision_applies(st.cand_out) and rng.random() < PRECISION_AUDITS / seen[0]:
            ref64 = check.reference64_of(st.pristine, host=False)   # before eager may write an argument
        # The reference: eager on the candidate's values, only now that the candidate's call is done (the
        # flags above are queued before it, in stream order, so eager writing an argument changes none).
        reference = as_list(check.eager(st.pristine))
        # What the op writes and does not return must end as eager leaves it, in timed calls too: an op returning
        # `()` (`_foreach_add_`) had nothing compared, and a kernel could skip its writes once timed.
        returned = {o.untyped_storage().data_ptr() for o in reference if isinstance(o, torch.Tensor)}
        written = [(path, c.clone(), p.clone())
                   for (path, p), (_, c) in zip(tensors_of(st.pristine), tensors_of(cand_slots[st.k]))
                   if (path.split("[")[0] in check.written or path in shared)
                   and p.untyped_storage().data_ptr() not in returned]
        if _lives_in(reference, st.pristine):
            # An op that writes an argument returns it, and one that returns views of its input (unsafe_split, an
            # LSTM cell's gates) returns those: the reference is then the slot's pristine buffer, which the slot's
            # next audit draws into again, maybe before this one is compared (an honest in-place relu_ and an honest
            # unsafe_split were called cheating, compared with eager's answer to a later call's values)
            reference = _snapshot(reference)
        cand_out = _snapshot(st.cand_out)
        allowed = check.allowing_ties(st.pristine, cand_out, reference)   # a tie broken otherwise is no cheat
        _scrub([r for r, w in zip(reference, allowed) if r is not w])
        reference = allowed
        a = _Audit(st.index, st.k, reference, cand_out, flags, written=written)
        if ref64 is not None:
            v = check.precision_against(f"timed call {st.index + 1} (input slot {st.k})", ref64, a.cand_out, reference)
            a.imprecise = v.message if v is not None else None
            _scrub(ref64)
        hit = slot_canaries[st.k].damaged() if slot_canaries[st.k] is not None else None
        if hit is not None:
            a.flags.append(("overrun", "the canary bytes around an input slot changed: the candidate wrote "
                            "outside its input buffers", hit))
        pending.append(a)
        st.audit, st.pristine, st.eager_pristine = False, None, None

    def before_round(r: int) -> None:
        close_round()
        k = abs(r) % K
        st.k, st.index, st.eager_out, st.cand_out = k, r, None, None
        st.cand_state = regen.state()
        regen.refill_(cand_slots[k])
        st.eager_state = regen.state()
        regen.refill_(eager_slots[k])   # values of its own: eager never computes the candidate's answer first
        if rewritten:
            for slot in (cand_slots[k], eager_slots[k]):
                kept = regen.kept(slot)
                for i in rewritten:
                    cover(kept[i]).copy_(kept_host[k][i])
        st.audit = force[0] or (r >= 0 and rng.random() < rate)
        st.prefill = rng.choice(PREFILLS)

    def eager_finish(out: Any) -> None:
        st.eager_out = st.stale = as_list(out)

    def cand_prepare() -> None:
        how: Any = st.prefill
        if how == "stale":
            how = st.stale if st.stale else "sentinel"   # copied into the fresh outputs (prefill_)
        st.launch = candidate.prepare(cand_slots[st.k], how)

    def cand_call() -> Any:
        assert st.launch is not None
        return st.launch()

    def cand_finish(out: Any) -> None:
        st.cand_out = as_list(out)
        st.launch = None
        if candidate.after is not None:
            candidate.after()

    def after_batch() -> bool:
        close_round()
        if candidate.overran is not None and candidate.overran():
            problem[:] = ["overrun", "a timed call wrote outside its output or workspace buffers (their canary "
                          "bytes changed)"]
        todo, pending[:] = list(pending), []
        for a in todo:
            if problem:
                break
            audited[0] += 1
            for category, message, flag in a.flags:
                if bool(flag):
                    problem[:] = [category, message]
                    break
            if problem:
                break
            reports = compare_outputs(a.cand_out, a.eager_out, check.tolerances(a.eager_out))
            bad = [r.message for r in reports if not r.ok]
            for path, got, want in a.written if not bad else ():
                r = compare_outputs([got], [want], check.tolerances([want]))[0]
                if not r.ok:
                    bad.append(f"written argument {path}: {r.message}")
                    break
            if bad:
                problem[:] = ["cheating", f"timed call {a.index + 1} (input slot {a.k}): {bad[0]}; "
                              "the same kernel passed verification, so it behaves differently when timed"]
            elif a.imprecise is not None:
                # values drawn as verification's fresh sets are: a kernel over the bar here may be one at its edge
                # in verification, not one that changes when timed, so this is a mismatch, not cheating
                problem[:] = ["mismatch", f"{a.imprecise} (on a timed call's values; it passed this check on "
                              "verification's sets)"]
        return bool(problem)

    eager = Arm(lambda: check.eager(eager_slots[st.k]), finish=eager_finish)
    cand = Arm(cand_call, prepare=cand_prepare, finish=cand_finish)
    ab = ab_time(eager, cand, flush, cfg, before_round=before_round, after_batch=after_batch)
    r = ab.reps
    while not problem and audited[0] < cfg.min_audits:  # rounds like the timed ones, every one audited
        force[0] = True
        before_round(r)
        for arm in ((eager, cand) if r % 2 == 0 else (cand, eager)):
            if arm.prepare is not None:
                arm.prepare()
            flush()
            out = arm.call()
            if arm.finish is not None:
                arm.finish(out)
        r += 1
        check.sync()
        after_batch()
    category, message = (problem[0], problem[1]) if problem else (None, "")
    return TimedRun(ab, category, message, audited[0], cand_slots[0])


def time_eager_alone(check: CardCheck, flush: L2Flusher, cfg: TimingConfig = TimingConfig()) -> tuple[TimingStats, int]:
    """Eager by itself, rotating over its own input slots as in `audited_ab` (values fixed)."""
    return time_alone(check, check.eager, flush, cfg)


def time_alone(check: CardCheck, fn: Callable[[Bound], Any], flush: L2Flusher,
               cfg: TimingConfig = TimingConfig()) -> tuple[TimingStats, int]:
    """`fn` (eager, or a reference such as eager under torch.compile) by itself on the card's inputs,
    rotating over its own input slots as eager's control does (values fixed: drawn once, as timed calls' are,
    not the verification sets' own, whose answers eager would otherwise leave in freed device memory for a
    candidate's first run to find)."""
    bases = _slot_bases(check, cfg.slots)
    slots = [clone_bound(b) for b in bases]
    regen = Regenerator(bases[0], int.from_bytes(os.urandom(8), "little") & ((1 << 62) - 1),
                        keep_ints=check.keep_ints, distinct=getattr(check, "distinct", None))
    for slot in slots:
        regen.refill_(slot)
    k = [0]

    def before_round(r: int) -> None:
        k[0] = abs(r) % len(slots)

    run = time_calls([lambda: fn(slots[k[0]])], flush, cfg, before_round=before_round)
    return summarize(run.times[0]), run.throttled


# Eager beside a candidate may read this much slower than eager alone before the speedup is taken
# against eager alone instead.
CONTROL_TOLERANCE = 1.10
CONTROL_SLACK_US = 0.5


def against_control(ab: ABResult, control: TimingStats) -> dict[str, Any] | None:
    """None when eager's median beside the candidate is within CONTROL_TOLERANCE (+ CONTROL_SLACK_US) of
    eager alone; otherwise the timing fields recomputed against eager alone (the speedup and its CI
    scaled by alone/beside), with both eager medians kept and `eager_corrected` set."""
    if ab.eager.median <= control.median * CONTROL_TOLERANCE + CONTROL_SLACK_US:
        return None
    f = control.median / ab.eager.median
    return {"speedup": ab.speedup * f, "speedup_ci": [ab.speedup_low * f, ab.speedup_high * f],
            "eager": {**control.__dict__}, "eager_beside": {**ab.eager.__dict__}, "eager_corrected": True,
            "eager_note": f"eager read {ab.eager.median:.2f} µs beside the candidate but {control.median:.2f} µs "
                          "alone: the speedup is against eager alone"}
