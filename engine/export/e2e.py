"""The whole-model check at export: a cast must not make the model it was made for slower.

Per-variant confirmation times each op alone. A model can still lose: where the host is the bottleneck
(ResNet-50 at batch 32 on an H200 host), every Python-dispatched call adds host time that no GPU saving
buys back. So export builds the run's model from its config in a fresh process and times whole
forwards with and without the candidate cast, alternating; if the cast is slower with confidence, it
tries smaller sets (the variants with the most net gain first) and keeps the first set that is not.

    python -m engine.export.e2e --config CONFIG [--small] --cast FILE.cast --subsets JSON --out RESULT.json
           [--graphs] [--iters N (0: auto)]

`--graphs` compares CUDA-graph replays of the forward instead of eager forwards (a cast exported for
models run under CUDA graphs, where per-call host cost is gone). `--compile MODE` compares the forward
compiled by torch.compile (MODE: default, max-autotune-no-cudagraphs or reduce-overhead) without the
cast against the same compiled with the cast (`Cast.compile`, engine.cast.compose): a variant is kept
for that target only where the compiled model is faster with it. Output agreement is always against
eager PyTorch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.bench.agreement import (  # noqa: F401 - used and re-exported
    REPEAT_REL,
    compared,
    degenerate,
    rel_l2_err,
    unrepeatable,
)
from engine.outcomes import faster_with_confidence


def subsets(net_us: Sequence[tuple[str, float]], rounds: int = 3) -> list[list[str]]:
    """Variant sets to try, largest first: all of them, then repeatedly the better half by net gain per
    call (GPU time saved minus host time added; unknown counts as 0), never an empty set."""
    ranked = [vid for vid, _ in sorted(net_us, key=lambda x: -(x[1] if x[1] is not None else 0.0))]
    out, n = [], len(ranked)
    while n >= 1 and len(out) <= rounds:
        cut = ranked[:n]
        if not out or cut != out[-1]:
            out.append(cut)
        n //= 2
    return out


PRECISION = 0.02  # widest 95 % CI of a set's speedup the check settles for, time permitting
MAX_S = 30.0  # seconds of timed forwards per set at most


def not_slower(speedup_ci: Sequence[float]) -> bool:
    """A model is 'not slower with the cast' unless the whole 95 % CI of eager/cast lies below 1."""
    return len(speedup_ci) == 2 and math.isfinite(speedup_ci[1]) and speedup_ci[1] >= 1.0


def judge_output(eager_out: Any, cast_out: Any) -> tuple[bool, str | None]:
    """Whether a variant set's model output may stand, and what must be said about it: (False, why) when
    the cast's output is degenerate where eager's is not, or non-finite where eager's is finite; (True,
    caveat) when eager's own output is degenerate, so agreement with it proves nothing; (True, None)."""
    import torch

    e, c = degenerate(eager_out), degenerate(cast_out)
    if c is not None and e is None:
        return False, f"the model's output with the cast is {c}; eager's is not"
    if (c is not None and not bool(torch.isfinite(cast_out).all())
            and bool(torch.isfinite(eager_out).all())):
        return False, f"the model's output with the cast is {c}; eager's is finite ({e})"
    if e is not None:
        return True, eager_caveat(e)
    return True, None


def output_states(outputs: Sequence[Any]) -> list[tuple[str | None, bool]]:
    """Per output tensor after the first: (why it is degenerate or None, whether it is all finite). Kept instead of
    copies, so an output beside the compared one (a cache, an auxiliary head) costs no memory while sets run."""
    import torch

    with torch.no_grad():
        return [(degenerate(t), bool(torch.isfinite(t).all()) if t.is_floating_point() or t.is_complex() else True)
                for t in outputs]


def judge_other_outputs(eager: Sequence[tuple[str | None, bool]], cast_outputs: Sequence[Any]) -> str | None:
    """Why the model's outputs beside the compared one may not stand with a cast (None: they may): another count
    of tensors, or one degenerate or non-finite where eager's is not. The compared output is `judge_output`'s;
    these others (a KV cache, hidden states, an auxiliary head) had no check at all."""
    got = output_states(cast_outputs)
    if len(got) != len(eager):
        return f"the model's output with the cast holds {len(got) + 1} tensors; eager's holds {len(eager) + 1}"
    for i, ((e_why, e_fin), (c_why, c_fin)) in enumerate(zip(eager, got), start=2):
        if c_why is not None and e_why is None:
            return f"the model's output tensor {i} (depth first) with the cast is {c_why}; eager's is not"
        if e_fin and not c_fin:
            return f"the model's output tensor {i} (depth first) with the cast is {c_why}; eager's is finite"
    return None


# The model's output with a cast must be about as accurate as without it. Each kernel passed its op's tolerance
# on the model's own activations, in the lane; a kernel that computes honestly only where it can tell the lane's
# calls from a model's (by what its buffers hold, its launch count, the clock) passes there and gives the model
# wrong answers, faster, and an output that is merely not degenerate let it through. Against the model run once
# in the next wider format (engine.bench.accuracy.wider_output: a 16-bit model in float32, a float32 one in
# float64), the cast's error may be ACCURACY_RATIO times the larger of eager's and, under torch.compile, the
# compiled model's without the cast, plus a small floor per output dtype. The ratio sits above the lane's own
# precision check (PRECISION_FACTOR, 3x eager's error per op: a split-K GEMM rounding its partial sums to bf16
# read 2.84x there and 2.86x through a bf16 model, red team 2026-12-07), and the floor is relative to nothing:
# at 5e-4 a float32 model whose every GEMM ran on fp16 or TF32 operands (2.7e-4 from float64, eager 1.9e-7)
# stood. Without such a reference, the output may move from eager's by NO_REFERENCE_BAR at most.
ACCURACY_RATIO = 4.0
# A model whose output without the cast is this far from its wider run has routing flips or chaos in it (Qwen3.5
# decode: 0.02 to 0.62 by token; an honest cast of it failed the rule on 3 of 12 inputs, review 2026-12-07): there
# one forward is judged only for the egregious, and the audits' pooled errors decide.
CHAOTIC = 0.05
ACCURACY_FLOOR = {"bfloat16": 1e-3, "float16": 5e-4}
ACCURACY_FLOOR_OTHER = 1e-6
NO_REFERENCE_BAR = {"bfloat16": 0.1, "float16": 0.05}
NO_REFERENCE_BAR_OTHER = 1e-2


def allowed_error(base: float, dtype: str) -> float:
    """How far from the wider run an output of `dtype` with the cast may be, where without it it is `base`."""
    return ACCURACY_RATIO * base + ACCURACY_FLOOR.get(dtype, ACCURACY_FLOOR_OTHER)


def accuracy_rule(eager_out: Any, dtype: str, wider: tuple[Any, str] | None = None,
                  others: Sequence[Any] = ()) -> Callable[[Any], tuple[str | None, dict[str, Any]]]:
    """The accuracy rule of the whole-model check: `rule(cast_out)` -> (why the output may not stand or None,
    what was compared). `eager_out`: eager's output (as `compared` gives it); `dtype`: the output's own dtype;
    `wider`: (the model's output in the next wider format, its name) or None; `others`: outputs of the model
    without the cast that are as good as eager's (the compiled model's)."""
    if wider is not None and degenerate(wider[0]) is None:
        ref, name = wider
        base = max(rel_l2_err(o, ref) for o in (eager_out, *others))
        allowed = allowed_error(base, dtype)

        def accurate(got: Any) -> tuple[str | None, dict[str, Any]]:
            err = rel_l2_err(got, ref)
            facts = {"reference": name, "reference_err": err, "reference_err_without": base}
            if err <= allowed:
                return None, facts
            if base >= CHAOTIC and err <= EGREGIOUS * allowed:
                # one forward of a model this far from its wider run (routing flips, random weights) decides
                # nothing alone: the timed forwards' audits, pooled, judge it
                return None, {**facts, "chaotic": True}
            return (f"the model's output with the cast is {err:.1e} from the model run in {name} (relative L2); "
                    f"without the cast {base:.1e}, and {allowed:.1e} may stand"), facts
        return accurate
    bar = NO_REFERENCE_BAR.get(dtype, NO_REFERENCE_BAR_OTHER)

    def near(got: Any) -> tuple[str | None, dict[str, Any]]:
        d = rel_l2_err(got, eager_out)
        if d <= bar:
            return None, {"drift_bar": bar}
        return (f"the model's output with the cast moves {d:.1e} from eager's (relative L2; no wider reference "
                f"could be made), more than {bar:.1e}"), {"drift_bar": bar}
    return near


def other_values(outputs: Sequence[Any]) -> list[Any]:
    """The model's outputs after the first as the accuracy rule compares them (`compared`; None for one that is
    not floating)."""
    return [compared(t) if t.is_floating_point() or t.is_complex() else None for t in outputs]


def judge_other_accuracy(eager: Sequence[Any], wider: Sequence[Any], cast_outputs: Sequence[Any],
                         name: str) -> str | None:
    """Why one of the model's outputs after the first (a KV cache, a second head) with the cast is less accurate
    than eager's against the model run in the wider format (`name`), by `accuracy_rule`; None where each stands
    (or cannot be compared: not floating, another shape)."""
    for i, (e, w, c) in enumerate(zip(eager, wider, cast_outputs), start=2):
        if e is None or w is None or not (c.is_floating_point() or c.is_complex()):
            continue
        got = compared(c)
        if got.shape != e.shape or w.shape != e.shape:
            continue
        why, _ = accuracy_rule(e, str(c.dtype).removeprefix("torch."), (w, name))(got)
        if why:
            return f"output tensor {i} (depth first): {why}"
    return None


def eager_caveat(reason: str) -> str:
    """What the report says instead of an agreement figure when eager's own output is degenerate."""
    return f"eager's own output is {reason}: agreement of the model's output says nothing"


def choose_set(sets: Sequence[Sequence[str]], eager_out: Any,
               run_set: Callable[[list[str]], tuple],
               accept: Callable[[Sequence[float]], bool] = not_slower,
               accuracy: Callable[[Any], tuple[str | None, dict[str, Any]]] | None = None) -> tuple[list, Any]:
    """Try each set in order: `run_set(ids)` gives the model's output with that set and a function that
    times it (called only when the output may stand). A set whose output is rejected (degenerate, or, with
    `accuracy` (`accuracy_rule`), less accurate than the model without the cast) is recorded with `rejected`
    (why) and the next, smaller set is tried; the first set whose speedup CI `accept`s (default: not slower)
    is chosen. A set rejected for accuracy is searched for the one variant that makes it so
    (`inaccurate_variant`); one found is recorded as the set's `culprit`, left out of every later set, and the
    set without it is tried next. Returns (tried, chosen or None)."""
    tried: list[dict[str, Any]] = []
    queue = [list(ids) for ids in sets]
    dropped: set[str] = set()
    while queue:
        ids = [v for v in queue.pop(0) if v not in dropped]
        if not ids or any(t["variants"] == ids for t in tried):
            continue
        got = run_set(list(ids))  # (output, timer) or (output, timer, facts to record: which variants ran)
        cast_out, time_it = got[0], got[1]
        ok, note = judge_output(eager_out, cast_out)
        other = (got[2] if len(got) > 2 else {}).pop("other_outputs", None)  # judge_other_outputs' answer
        if ok and other:
            ok, note = False, other
        # How far the model's output moves with the cast (each kernel passed its op's tolerance; the drift
        # from eager's is recorded for the report, the accuracy against a wider run judged by `accuracy`).
        r: dict[str, Any] = {"variants": list(ids), "rel_l2_err": rel_l2_err(cast_out, eager_out),
                             **(got[2] if len(got) > 2 else {})}
        inaccurate = False
        if ok and accuracy is not None:
            why, facts = accuracy(cast_out)
            r.update(facts)
            if why:
                ok, note, inaccurate = False, why, True
        if ok:
            r.update(time_it(), **({"output_note": note} if note else {}))
            ok = not r.get("rejected")   # an audited timed forward that could not stand
        else:
            r["rejected"] = note
        del cast_out, time_it, got  # a set's CUDA graph goes before the next set captures its own
        tried.append(r)
        if ok and accept(r["speedup_ci"]):
            return tried, r
        if inaccurate and accuracy is not None:
            culprit = inaccurate_variant(ids, lambda h: run_set(list(h))[0], accuracy)
            if culprit is not None:
                r["culprit"] = culprit
                dropped.add(culprit)
                queue.insert(0, [v for v in ids if v != culprit])
    return tried, None


# The forwards a set is timed with are judged too: the check's own forward runs on the example inputs, which a
# kernel can recognise (or count its calls up to), and computing honestly only there it passed every judgement
# while its timed forwards, on varied inputs, computed nothing (red team 2026-12-07: 1.68x kept). Both arms'
# outputs of every timed pair are kept (copied after the call, outside the timed window) and
# - every pair is checked cheaply (`judge_cheap`): an output degenerate or non-finite where the other arm's is
#   not, or a first output as far from the other arm's as from zero, rejects at once; a first output beyond
#   max(CHEAP_FACTOR x its distance on the example, NO_REFERENCE_BAR) counts, and most pairs must not;
# - AUDITS_FIRST of the first round's pairs (drawn before it) and each later pair with probability AUDIT_SHARE
#   (drawn after it, on the host) are audited against the model run in the wider format on that pair's inputs
#   (`audit_excess`, every floating output). One audit beyond EGREGIOUS times what may stand rejects the set at
#   once (a float32 model's GEMMs on fp16 operands read 150x); otherwise the audits are pooled (`Auditor`), since
#   a routing flip moves one honest forward's output far now and then. Nothing a kernel sees tells an audited
#   forward from another. Where the check had a wider run and no audit could make one, the set is rejected.
AUDITS_FIRST = 2
AUDIT_SHARE = 0.125
CHEAP_FACTOR = 8.0
CHEAP_AT_ONCE = 1.0   # a pair's output this far from the other arm's (relative L2: as far as from zero) decides alone
EGREGIOUS = 25.0      # an audit this many times over what may stand decides alone (fp16-operand GEMMs: 150x)


class Auditor:
    """The judgement of a set's timed pairs: `after_pair()` after each (why the set cannot stand at once, or
    None); `verdict()` at the end. `cheap()` judges every pair: (why, at once) or None; `full()` an audited one:
    (err, allowed, what) or None where no wider run could be made.

    A routing flip (an MoE's top-k) moves one honest forward's output by tenths now and then (Qwen3.5 decode: the
    drift of an honest cast from eager over 48 tokens had median 0.085 and maximum 0.6, against 0.025 on the
    example; review 2026-12-07), so a single pair decides only where it is degenerate or beyond all measure;
    otherwise the cheap bar must be missed by most pairs, and the audits are pooled: the root of their errors'
    squares over the root of what each allows, above 1."""

    def __init__(self, iters: int, cheap: Callable[[], Any], full: Callable[[], Any],
                 need_reference: bool = False, rng: Any = None):
        import random

        self.rng = rng or random.SystemRandom()
        self.first = set(self.rng.sample(range(max(1, iters)), min(AUDITS_FIRST, max(1, iters))))
        self.cheap, self.full, self.need_reference = cheap, full, need_reference
        self.pairs = 0
        self.audited = 0
        self.over: list[str] = []     # the cheap bar's misses
        self.audits: list[tuple[float, float, str]] = []
        self.failed = 0

    def after_pair(self) -> str | None:
        k, self.pairs = self.pairs, self.pairs + 1
        got = self.cheap()
        if got is not None:
            why, at_once = got
            if at_once:
                return why
            self.over.append(why)
        if k in self.first or self.rng.random() < AUDIT_SHARE:
            self.audited += 1
            full = self.full()
            if full is None:
                self.failed += 1
                return None
            self.audits.append(full)
            err, allowed, what = full
            if err > EGREGIOUS * allowed:
                return what
        return None

    def verdict(self) -> str | None:
        if 2 * len(self.over) > self.pairs:
            return f"{len(self.over)} of {self.pairs} timed pairs: {self.over[0]}"
        if self.audits:
            err = math.sqrt(sum(e * e for e, _, _ in self.audits))
            allowed = math.sqrt(sum(a * a for _, a, _ in self.audits))
            if err > allowed:
                worst = max(self.audits, key=lambda t: t[0] / t[1] if t[1] else math.inf)
                return (f"its {len(self.audits)} audited forwards are {err / allowed:.1f}x as far from the model run "
                        f"in the wider format as may stand, pooled (the worst: {worst[2]})")
        if self.need_reference and self.failed and not self.audits:
            return f"no audit of its timed forwards could run the model in the wider format ({self.failed} tried)"
        return None


def judge_cheap(base_outs: Sequence[Any], cast_outs: Sequence[Any], dtype: str, example_drift: float,
                floating: bool) -> str | None:
    """(why, whether at once) where a timed pair's outputs with the cast miss what needs no wider run, else None:
    degenerate or non-finite where the other arm's are not (every output; at once), or the first output further
    from the other arm's than CHEAP_FACTOR x its distance on the example inputs (`example_drift`), never less
    than NO_REFERENCE_BAR (at once beyond CHEAP_AT_ONCE: as far as from zero)."""
    b, c = compared(base_outs[0]), compared(cast_outs[0])
    ok, note = judge_output(b, c)
    if not ok:
        return note, True
    other = judge_other_outputs(output_states(base_outs[1:]), cast_outs[1:])
    if other:
        return other, True
    if not floating:
        return None
    bar = max(CHEAP_FACTOR * example_drift, NO_REFERENCE_BAR.get(dtype, NO_REFERENCE_BAR_OTHER))
    d = rel_l2_err(c, b)
    if d > bar:
        return (f"the model's output with the cast moves {d:.1e} from the same inputs' without it (relative L2), "
                f"more than {bar:.1e} ({CHEAP_FACTOR:g}x its {example_drift:.1e} on the example inputs)",
                d > CHEAP_AT_ONCE)
    return None


def audit_excess(base_outs: Sequence[Any], cast_outs: Sequence[Any], wide: tuple[list[Any], str] | None
                 ) -> tuple[float, float, str] | None:
    """An audited pair against the model run in the wider format on its inputs (`wide`: `wider_outputs`' answer,
    None: none could be made): over the floating outputs of one shape on every side, the one whose error is
    largest against what `accuracy_rule` allows: (error, allowed, what was found there)."""
    if wide is None:
        return None
    worst: tuple[float, float, str] = (0.0, 1.0, "")
    for i, (b, c, w) in enumerate(zip(base_outs, cast_outs, wide[0]), start=1):
        if w is None or not (c.is_floating_point() or c.is_complex()):
            continue
        bc, cc, wc = compared(b), compared(c), compared(w)
        if not (bc.shape == cc.shape == wc.shape):
            continue
        dtype = str(c.dtype).removeprefix("torch.")
        base = rel_l2_err(bc, wc)
        allowed = allowed_error(base, dtype)
        err = rel_l2_err(cc, wc)
        if err * worst[1] >= worst[0] * allowed:   # the larger err / allowed
            where = "the model's output" if i == 1 else f"the model's output tensor {i} (depth first)"
            worst = (err, allowed, f"{where} with the cast is {err:.1e} from the model run in {wide[1]} (relative "
                                   f"L2); without the cast {base:.1e}, and {allowed:.1e} may stand")
    return worst


# The arm without the cast, timed beside the cast's, may read at most this much slower than it read alone before
# any cast was loaded (the lane's own control for an op: 10 %): red team 2026-12-07 had a cast whose arm left a
# thread running slow the eager arm, 0.69x read as 2.45x, every output right.
EAGER_SLOWED = 0.10
ALONE_CALLS = 7


def eager_slowed(alone_ms: float, beside_ms: float) -> str | None:
    """Why a set's timing cannot stand because the arm without the cast ran slower beside it than alone."""
    if beside_ms <= alone_ms * (1 + EAGER_SLOWED):
        return None
    return (f"the model without the cast ran {100 * (beside_ms / alone_ms - 1):.0f} % slower beside the cast's arm "
            f"({beside_ms:.3f} ms) than alone before any cast was loaded ({alone_ms:.3f} ms): the cast's arm leaves "
            "work behind that slows the other (more than the 10 % allowed)")


# Model runs the search for an inaccurate variant may make, at most (a bisection of 2 ** 6 variants and more).
CULPRIT_RUNS = 12


def inaccurate_variant(ids: Sequence[str], output_of: Callable[[list[str]], Any],
                       accuracy: Callable[[Any], tuple[str | None, dict[str, Any]]],
                       budget: int = CULPRIT_RUNS) -> str | None:
    """The one variant of `ids` (a set `accuracy` rejected) that makes the model's output inaccurate by itself:
    halves are run (`output_of(half)`: the model's output with those variants only), the first one rejected is
    searched further. None where neither half is rejected (the error is several variants' together) or the
    budget of runs is spent."""
    group, runs = list(ids), 0
    while len(group) > 1:
        halves = (group[: len(group) // 2], group[len(group) // 2:])
        bad = None
        for h in halves:
            if runs >= budget:
                return None
            runs += 1
            if accuracy(output_of(h))[0]:
                bad = h
                break
        if bad is None:
            return None
        group = bad
    return group[0] if group else None


# Calls of a reduce-overhead graph that run its Python (cudagraph trees: a warm-up run, then the recording);
# later calls replay the graph.
REPLAY_WARM_CALLS = 2


def ran_in_forward(stats: dict[str, Any], ids: Sequence[str], forwards: int = 1) -> dict[str, Any]:
    """From a cast's stats over `forwards` forwards: hits per variant of the set and forward, and the variants
    that never ran (a guard that never matched, a pattern Inductor's graph never held; `folds_reverted`: the
    convolution biases split off for conv-bias fold cards that no match took). A set whose speedup is
    no better than a smaller one's often has variants that never ran: this says so instead of leaving it to
    guesswork. Under CUDA graphs only the calls that run Python count (`forwards` of them)."""
    wanted = set(ids)
    hits = {v["id"]: int(v.get("hits") or 0) for v in stats.get("variants", []) if v["id"] in wanted}
    out: dict[str, Any] = {"hits_per_forward": {k: n // forwards or 1 for k, n in hits.items() if n},
                           "never_ran": [i for i in ids if not hits.get(i)]}
    if forwards != 1:
        out["hits_counted_over"] = f"{forwards} forwards that ran Python (warm-up and capture; replays run none)"
    if stats.get("pattern_matches"):
        out["pattern_matches"] = dict(stats["pattern_matches"])
    if stats.get("folds_reverted"):   # biases split off for conv-bias fold cards that no match took
        out["folds_reverted"] = stats["folds_reverted"]
    # a kernel that pays a layout copy in the compiled graph can gain less than its card said; one passed its
    # input as held (a convolution's bias kept for it) is the path that avoids the copy: both are kept
    copies = {k: v for k, v in (stats.get("layout_copies") or {}).items()
              if v.get("inputs_copied") or v.get("outputs_copied") or v.get("inputs_as_held") or v.get("biases_kept")}
    if copies:
        out["layout_copies"] = copies
    return out


def composition_alternative(ids: Sequence[str], overlaps: dict[str, Sequence[str]]) -> list[str] | None:
    """Under torch.compile, the set `ids` without its pattern cards whose member ops have op variants in it
    (`overlaps`: pattern variant -> those op variants): the op variants then serve the ops, Inductor generates
    the rest of the chain and may fuse it with its neighbours. None when no pattern card in `ids` overlaps."""
    present = set(ids)
    drop = {p for p in ids if any(o in present for o in overlaps.get(p, ()))}
    return [i for i in ids if i not in drop] if drop else None


def prefer_alternative(chosen: dict[str, Any], alt: dict[str, Any],
                       accept: Callable[[Sequence[float]], bool]) -> bool:
    """Whether a measured alternative set replaces the chosen one: its output stands, it passes the same
    acceptance, and its whole 95 % CI lies above the chosen set's speedup (faster, not a draw of the noise)."""
    return "rejected" not in alt and accept(alt["speedup_ci"]) and alt["speedup_ci"][0] > chosen["speedup"]


def acceptance(compile_mode: str | None) -> Callable[[Sequence[float]], bool]:
    """What a variant set's speedup CI must show to be kept. Under torch.compile the alternative is
    Inductor's own code for those ops, and a kept variant costs a veto on its decomposition: the compiled
    model must be faster with confidence (issue 19). In eager and CUDA graphs: not slower (docs/cast.md)."""
    return faster_with_confidence if compile_mode is not None else not_slower


def settled(speedup_ci: Sequence[float], precision: float = PRECISION) -> bool:
    """Whether a speedup's 95 % CI is narrow enough to act on: no wider than `precision` (0.02: ±1 %)."""
    low, high = speedup_ci
    return math.isfinite(low) and math.isfinite(high) and high - low <= precision


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")


def mode_name(graphs: bool, compile_mode: str | None) -> str:
    """The target a check measures: 'eager', 'cuda-graphs', 'compile' or 'compile:<mode>'."""
    if compile_mode:
        return "compile" if compile_mode == "default" else f"compile:{compile_mode}"
    return "cuda-graphs" if graphs else "eager"


def check(config: str, small: bool, cast_path: str, sets: list[list[str]], iters: int = 0,
          graphs: bool = False, precision: float = PRECISION, max_s: float = MAX_S,
          compile_mode: str | None = None, overlaps: dict[str, list[str]] | None = None,
          device: str = "cuda") -> dict[str, Any]:
    """Try each variant set in order (`choose_set`): a set whose model output is degenerate where eager's
    is not is rejected; the first whose model is not slower (under torch.compile: faster with confidence) is
    chosen ({'chosen': None} when none is). Under torch.compile, where the chosen set holds pattern cards
    whose member ops also have op variants in it (`overlaps`), the set without those pattern cards is
    measured too and replaces it where it is faster (`prefer_alternative`): which composition wins, our
    fused chain or our op kernel beside Inductor's code for the rest, is decided by measurement;
    `degenerate_eager` says why eager's own output cannot vouch for the cast (None when it can).
    `iters` forwards per arm per round, 0: about two seconds of forwards per arm (10 to 100); more rounds
    follow while the CI is wider than `precision` and less than `max_s` has passed for the set (a noisy host gave 0.886-1.139 from one round, where a 3 % loss was there to find)."""
    import torch

    from engine.bench.accuracy import wider_outputs
    from engine.bench.forward import auto_iters, capture_graph, settle, time_forward, time_steady
    from engine.bench.stats import speedup_ci
    from engine.bench.varied import Varied
    from engine.cast.loader import load
    from engine.config import build_target, load_config
    from engine.models.forwards import output_tensor, output_tensors

    if compile_mode is not None and compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {compile_mode!r}: use one of {', '.join(COMPILE_MODES)}")
    # (device "cpu": the check's plumbing in tests, on a wall clock, with no cast installed: no measurement)
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)
    target = build_target(load_config(config, small=small), dev)
    forward, model = target.forward, target.module
    compile_kw = {} if compile_mode in (None, "default") else {"mode": compile_mode}
    # Each set compiles the forward with a backend of its own, and a culprit search adds up to CULPRIT_RUNS more:
    # past Dynamo's recompile limit (8) the cast's arm ran uncompiled against a compiled baseline (review
    # 2026-12-07). This process compiles nothing else.
    limits = torch._dynamo.config.patch(recompile_limit=256, accumulated_recompile_limit=4096) \
        if compile_mode is not None else contextlib.nullcontext()
    with torch.no_grad(), limits:
        for _ in range(3):
            forward()
        whole = forward()
        out = output_tensor(whole)
        dtype = str(out.dtype).removeprefix("torch.")
        floating = out.is_floating_point() or out.is_complex()
        eager_out = compared(out)
        eager_others = output_states(output_tensors(whole)[1:])
        eager_other_vals = other_values(output_tensors(whole)[1:])
        del whole, out
        eager_bad = degenerate(eager_out) or unrepeatable(eager_out, compared(output_tensor(forward())))
        # the model once in the next wider format, before any cast binds the parameters it reads (none where
        # eager's own output cannot vouch for anything: the report says so instead); its other outputs too
        wide = wider_outputs(model, forward, output_tensors) if floating and not eager_bad else None
        wider = (compared(wide[0][0]), wide[1]) if wide is not None and wide[0] and wide[0][0] is not None else None
        wider_others = [compared(t) if t is not None else None for t in wide[0][1:]] if wider is not None else []
        del wide
        if wider is not None:
            again = forward()   # a model that kept something of the wider run (a cache it fills once) is not the same
            if unrepeatable(eager_out, compared(output_tensor(again))):
                wider, wider_others = None, []
                eager_out = compared(output_tensor(again))
                eager_others = output_states(output_tensors(again)[1:])
                eager_other_vals = other_values(output_tensors(again)[1:])
            del again
        # inputs varied from forward to forward while timing: a memo of whole answers gains nothing (varied.py)
        varied = Varied.record(model, forward, judge=None if eager_bad else
                               lambda o: degenerate(compared(output_tensor(o))))
        base = forward  # what the cast must beat: eager, or the model compiled without the cast
        without = []  # outputs without the cast as good as eager's
        if compile_mode is not None:
            torch._dynamo.reset()
            base = torch.compile(forward, **compile_kw)
            for _ in range(3):
                base()
            without.append(compared(output_tensor(base())))
        # an integer output (class ids, token ids) has no rounding to compare: the other checks judge it
        accuracy = accuracy_rule(eager_out, dtype, wider, without) if floating and not eager_bad else None
        if iters <= 0:  # a short model needs many pairs for a CI that can tell 1.0 from 1.1
            iters = auto_iters(sorted(time_forward(base) for _ in range(3))[1]) if device == "cuda" else 10
        eager_graph, eager_static = capture_graph(forward) if graphs else (None, None)
        # the arm without the cast run until its pace stops moving (a fresh process on a just-busy host issues a
        # host-bound forward slower for a while, which flatters the arm that issues less: engine.bench.forward)
        settle_info = settle(eager_graph.replay if graphs else base, device) if device == "cuda" else None
        # the arm without the cast timed alone, before any cast is loaded: a cast whose arm leaves work behind (a
        # host thread, a launch that outlives its call) slows the other arm instead of speeding its own
        alone_us = []
        try:
            for _ in range(ALONE_CALLS):
                varied.seek(varied.new_pair())
                alone_us.append(time_steady(eager_graph.replay if graphs else base, device, before=varied.before))
        finally:
            varied.restore()
        alone_ms = sorted(alone_us)[len(alone_us) // 2] / 1e3

        def run_set(ids: list[str]) -> tuple[Any, Callable[[], dict[str, Any]], dict[str, Any]]:
            cast = load(cast_path, only=set(ids))
            with cast.enabled(model):  # the model too: its module cards are patched only when it is named
                fast = cast.compile(forward, **compile_kw) if compile_mode is not None else forward
                # A CUDA graph's replay runs no Python, so no plan counts a hit there: under reduce-overhead
                # what ran is counted over the warm-up and the capture (the first calls), per forward.
                replayed = compile_mode == "reduce-overhead"
                if replayed:
                    cast.reset_stats()
                for _ in range(3):
                    fast()
                if replayed:
                    ran = ran_in_forward(cast.stats(), ids, forwards=REPLAY_WARM_CALLS)
                cast.reset_stats()
                whole = fast()
                cast_out = compared(output_tensor(whole))
                other = judge_other_outputs(eager_others, output_tensors(whole)[1:]) or (
                    judge_other_accuracy(eager_other_vals, wider_others, output_tensors(whole)[1:], wider[1])
                    if wider is not None and accuracy is not None else None)
                del whole
                if not replayed:
                    ran = ran_in_forward(cast.stats(), ids)
                if other:
                    ran = {**ran, "other_outputs": other}
                cast_graph, cast_static = capture_graph(forward) if graphs else (None, None)
            # the set's distance on the example inputs from what the timed pairs compare it with (the compiled
            # model's output without the cast, under torch.compile)
            example_drift = rel_l2_err(cast_out, without[0] if without else eager_out)

            def time_it() -> dict[str, Any]:
                eager_us, cast_us = [], []
                held: dict[str, Any] = {}   # each arm's outputs of its last timed call, copied after it
                audit = Auditor(
                    iters,
                    lambda: judge_cheap(held["eager"], held["cast"], dtype, example_drift, floating and not eager_bad),
                    lambda: audit_excess(held["eager"], held["cast"],
                                         wider_outputs(model, forward, output_tensors)
                                         if accuracy is not None and wider is not None else None),
                    need_reference=accuracy is not None and wider is not None)

                def keeping(arm: str, fn: Callable[[], Any]) -> Callable[[], None]:
                    def call() -> None:
                        held[arm] = fn()
                    return call

                arms = {"eager": keeping("eager", base), "cast": keeping("cast", fast)}
                # before each call, the arm's last output let go: a reduce-overhead graph whose prior output is
                # still alive cannot replay into that memory (and the warm call's output is not the one judged)
                befores = {arm: (lambda arm=arm: (held.pop(arm, None), varied.before())) for arm in arms}
                t0 = time.perf_counter()
                why = None
                try:
                    while why is None:  # rounds of `iters` pairs until the CI is narrow enough or the time is up
                        for i in range(iters):
                            pair = varied.new_pair()
                            for arm in (("eager", "cast") if i % 2 == 0 else ("cast", "eager")):
                                # each arm in its steady state: right after an untimed call of itself; both arms
                                # of a pair on the same variants of the inputs, each call on new ones
                                varied.seek(pair)
                                if graphs:
                                    g = eager_graph if arm == "eager" else cast_graph
                                    (eager_us if arm == "eager" else cast_us).append(
                                        time_steady(g.replay, device, before=varied.before))
                                    held[arm] = eager_static if arm == "eager" else cast_static
                                elif arm == "cast":
                                    with cast.enabled(model):
                                        cast_us.append(time_steady(arms["cast"], device, before=befores["cast"]))
                                else:
                                    eager_us.append(time_steady(arms["eager"], device, before=befores["eager"]))
                                # (a CUDA graph's outputs are overwritten by its next replay; a compiled one's too)
                                held[arm] = [t.detach().clone() for t in output_tensors(held[arm])]
                            why = audit.after_pair()
                            if why:
                                break
                        est = speedup_ci(eager_us, cast_us, paired=True)
                        if why or settled((est.low, est.high), precision) or time.perf_counter() - t0 >= max_s:
                            break
                    why = why or audit.verdict()
                finally:
                    varied.restore()
                    held.clear()
                timing = {"speedup": est.speedup, "speedup_ci": [est.low, est.high],
                          "eager_ms": sorted(eager_us)[len(eager_us) // 2] / 1e3,
                          "cast_ms": sorted(cast_us)[len(cast_us) // 2] / 1e3, "iters": len(eager_us),
                          "base": "torch.compile" if compile_mode is not None else "eager",
                          "precise": settled((est.low, est.high), precision), "audited": audit.audited}
                if why:
                    timing["rejected"] = f"timed forward {len(cast_us)} (inputs varied, judged after the fact): {why}"
                elif device == "cuda" and (slowed := eager_slowed(alone_ms, timing["eager_ms"])):   # (a CPU's clock: no)
                    timing["rejected"] = slowed
                timing["eager_alone_ms"] = alone_ms
                return timing

            return cast_out, time_it, ran

        accept = acceptance(compile_mode)
        tried, chosen = choose_set(sets, eager_out, run_set, accept, accuracy)
        alt_ids = composition_alternative(chosen["variants"], overlaps or {}) \
            if chosen is not None and compile_mode is not None else None
        if alt_ids:
            alt_tried, _ = choose_set([alt_ids], eager_out, run_set, accept, accuracy)
            alt = {**alt_tried[0], "alternative": "without the pattern cards whose ops have op variants in the set"}
            tried.append(alt)
            if prefer_alternative(chosen, alt, accept):
                chosen = alt
    return {"mode": mode_name(graphs, compile_mode), "tried": tried, "chosen": chosen,
            "degenerate_eager": eager_bad, "reference": wider[1] if wider is not None else None,
            "inputs": varied.describe(), "settled": settle_info}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Whole-model check of a cast in this (fresh) process")
    ap.add_argument("--config", required=True)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--cast", required=True)
    ap.add_argument("--subsets", required=True,
                    help="JSON file: a list of variant-id lists, tried in order, or {'sets': that list, "
                         "'overlaps': {pattern variant: [op variants of its member ops]}}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--compile", dest="compile_mode", choices=COMPILE_MODES,
                    help="compare torch.compile without and with the cast in this mode")
    ap.add_argument("--iters", type=int, default=0, help="forwards per arm and round (0: about 2 s per arm, 10 to 100)")
    ap.add_argument("--precision", type=float, default=PRECISION, help="widest CI to settle for (default 0.02)")
    ap.add_argument("--max-s", type=float, default=MAX_S, help="seconds of timing per set at most (default 30)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the plumbing's tests, no measurement
    args = ap.parse_args(argv)
    from engine.export.confirm import run_job

    def work() -> dict[str, Any]:
        job = json.loads(Path(args.subsets).read_text())
        sets, overlaps = (job, None) if isinstance(job, list) else (job["sets"], job.get("overlaps"))
        return check(args.config, args.small, args.cast, sets, args.iters, args.graphs, args.precision, args.max_s,
                     args.compile_mode, overlaps, device=args.device)

    return run_job(work, args.out)


if __name__ == "__main__":
    from engine.exits import leave_process

    sys.exit(leave_process(main()))
