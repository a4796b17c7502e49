"""The search ablation in two halves: every builtin kernel of a card measured once (the landscape), and
searches replayed over that measurement on the CPU, as many seeds as wanted.

A landscape holds, for each card the builtin proposer supports, every distinct kernel its template renders
(every combination of the space's values, rendered for the GPU of the lane's `hello`), each evaluated once
through the evaluator a search uses (`LaneEvaluator` in `bench_search.py --landscape`). A kernel is its
source *and* launch spec: some templates (elementwise) render one source with several specs (block size,
waves), and those are different kernels on the GPU.

A replay runs the real orchestrator and builtin proposer; its evaluator (`ReplayEvaluator`) looks each
proposed kernel up by digest and returns the `Evaluation` the lane returned for it, its timing drawn again
(`noisy`). A kernel missing from the landscape is an error (`LandscapeMiss`), never an invented result.

Noise model: the lane's 95 % bootstrap CI of a speedup is read as ±1.96 σ of a normal log-speedup, so each
replayed evaluation reads speedup × exp(σ·z), z standard normal (the candidate's times divided by the same
factor, eager's kept). That is the spread of one more measurement in the same sitting; drift between
sittings (clocks, temperature, another GPU of the same model) is not in it, so `noise_scale` (> 1) widens
it, and 0 replays the measured values exactly. A failed kernel fails every time: statuses are replayed as
measured. The draw is keyed by (seed, card, kernel, how many times this run evaluated it), so the
strategies of one seed read the same value for the same kernel and their difference is a paired one.

What a replay does not reproduce: time. On the GPU the next kernel is proposed while another is being
timed; in a replay evaluations end at once, so a proposal may know one result more than it would have.
Nothing here needs a GPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import math
import os
import random
import statistics
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.cards import OperatorCard, card_from_row
from engine.lane.evaluate import Evaluation
from engine.propose.base import Hardware, Proposal
from engine.propose.builtin import BuiltinProposer
from engine.propose.builtin.proposer import _runs_on
from engine.propose.builtin.template import Rendered, Template
from engine.run.orchestrator import CandidateRecord, NullRecorder
from engine.run.plan import CardState

KIND = "kforge-search-landscape"
VERSION = 1
_Z95 = 1.959963984540054
_STOP_AFTER_INTERNAL = 3  # consecutive evaluator errors that end a landscape (a lane that is gone)


class LandscapeError(ValueError):
    """A landscape that cannot be replayed as asked (not one, incomplete, or the templates changed)."""


class MeasureStopped(RuntimeError):
    """The evaluator failed several kernels in a row: the lane is gone, measuring on would record nothing."""


class LandscapeMiss(LookupError):
    """A replayed search proposed a kernel the landscape does not hold."""


def kernel_digest(source: str, spec: str) -> str:
    """sha256 of a kernel: its source and its launch spec (one source may launch several ways)."""
    return hashlib.sha256(source.encode() + b"\0" + spec.encode()).hexdigest()


# ------------------------------------------------------------------------------------------ enumeration


@dataclass(frozen=True)
class Instance:
    """One distinct kernel of a card's template, as the first combination that renders it rendered it."""

    digest: str
    rendered: Rendered
    combinations: int  # how many combinations of the space render this kernel


@dataclass(frozen=True)
class Enumeration:
    """A card's template space, rendered: its distinct kernels and what the deduplication folded."""

    template: str
    combinations: int              # the product of the space (`Template.instances`)
    sources: int                   # distinct rendered sources
    instances: list[Instance]      # distinct kernels (source + spec) the proposer may propose, first seen first
    unlaunchable: int              # distinct kernels left out: cluster kernels where the GPU has no clusters


def enumerate_instances(template: Template, card: OperatorCard, hw: Hardware) -> Enumeration:
    """Every combination of the template's space for the card, rendered for `hw`, deduplicated by kernel."""
    space = template.space(card, hw=hw)
    keys = list(space)
    found: dict[str, list[Any]] = {}
    sources: set[str] = set()
    combinations = 0
    for values in itertools.product(*(space[k] for k in keys)):
        combinations += 1
        r = template.render(card, dict(zip(keys, values)), hw=hw)
        sources.add(r.source)
        d = kernel_digest(r.source, r.spec)
        if d in found:
            found[d][1] += 1
        else:
            found[d] = [r, 1]
    kept = [Instance(d, r, n) for d, (r, n) in found.items() if _runs_on(r.source, hw)]
    return Enumeration(template.name, combinations, len(sources), kept, len(found) - len(kept))


def instance_proposal(template: Template, inst: Instance) -> Proposal:
    """The proposal the builtin proposer makes for this kernel (a fresh one: its plan is its intent)."""
    r = inst.rendered
    return Proposal(source=r.source, spec=r.spec, intent=r.intent, params={**r.params, "template": template.name},
                    provider=BuiltinProposer.name, model=template.name)


# ---------------------------------------------------------------------------------------- the file


def card_record(card: OperatorCard, samples: Sequence[str]) -> dict[str, Any]:
    """The card as a landscape keeps it: its store row, the lane's figures, its samples' paths."""
    return {**card.row(), "eager_us": card.eager_us, "roofline_us": card.roofline_us,
            "compile_us": card.compile_us, "copy_us": card.copy_us, "samples": card.samples,
            "sample_paths": list(samples)}


def card_of(record: Mapping[str, Any]) -> tuple[OperatorCard, list[str]]:
    """The card and its samples' paths back from `card_record` (on any machine: nothing is opened)."""
    return card_from_row(record), list(record.get("sample_paths") or [])


def instance_record(inst: Instance, ev: Evaluation) -> dict[str, Any]:
    """One measured kernel: what it is (digest, rendered params) and what the evaluator returned for it."""
    timing = ev.payload.get("timing") if ev.status == "verified" else None
    return {"digest": inst.digest, "source_sha256": hashlib.sha256(inst.rendered.source.encode()).hexdigest(),
            "params": inst.rendered.params, "combinations": inst.combinations,
            "status": ev.status, "category": ev.category,
            "time_us": timing["candidate"]["median"] if timing else None,
            "eager_us": timing["eager"]["median"] if timing else None,
            "speedup": timing["speedup"] if timing else None,
            "speedup_ci": list(timing["speedup_ci"]) if timing and timing.get("speedup_ci") else None,
            "evaluation": dataclasses.asdict(ev)}


def evaluation_of(record: Mapping[str, Any]) -> Evaluation:
    """The Evaluation an instance record holds (what the lane evaluator returned)."""
    return Evaluation(**record["evaluation"])


def new_landscape(hello: Mapping[str, Any], **about: Any) -> dict[str, Any]:
    """An empty landscape for the GPU of this `hello` (`about`: torch, commit, model, timing …)."""
    return {"kind": KIND, "version": VERSION, "gpu": hello["name"], "hardware": dict(hello), **about, "cards": []}


def save(doc: Mapping[str, Any], path: Path) -> None:
    """Write the whole file through a temporary and a rename: a kill leaves the last complete copy."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))  # rewritten after every kernel: compact
    os.replace(tmp, path)


def load_landscape(path: Path) -> dict[str, Any]:
    """A landscape file, or LandscapeError saying why it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise LandscapeError(f"{path}: cannot read a landscape ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise LandscapeError(f"{path}: not a search landscape (write one with bench_search.py --landscape)")
    if doc.get("version") != VERSION:
        raise LandscapeError(f"{path}: landscape version {doc.get('version')}, this script reads {VERSION}")
    return doc


def merge_landscapes(docs: Sequence[Mapping[str, Any]], paths: Sequence[Any]) -> dict[str, Any]:
    """Landscapes of one GPU as one, for a replay over all their cards (each file measured its own cards, on
    its own day: their commits, torch builds and dates are kept side by side). LandscapeError where the GPUs
    differ or a card is in two files."""
    if len(docs) == 1:
        return dict(docs[0])
    gpus = {(d["hardware"]["name"], d["hardware"]["arch"]) for d in docs}
    if len(gpus) > 1:
        raise LandscapeError(f"{', '.join(map(str, paths))}: measured on {' and '.join(sorted(g[0] for g in gpus))}; "
                             "a replay takes landscapes of one GPU")
    seen: dict[str, Any] = {}
    for d, path in zip(docs, paths):
        for e in d["cards"]:
            cid = e["card"]["card_id"]
            if cid in seen:
                raise LandscapeError(f"card {cid} ({e['label']}) is in both {seen[cid]} and {path}: "
                                     "finish one file with --resume instead")
            seen[cid] = path

    def joined(key: str) -> str:
        return "; ".join(dict.fromkeys(str(d.get(key)) for d in docs if d.get(key)))

    return {**docs[0], "cards": [e for d in docs for e in d["cards"]], "torch": joined("torch"),
            "cuda": joined("cuda"), "commit": joined("commit"), "created": joined("created"),
            "dirty": any(d.get("dirty") for d in docs)}


def hardware_of(doc: Mapping[str, Any]) -> Hardware:
    """The GPU the landscape's kernels were rendered for and measured on."""
    return Hardware.from_hello(doc["hardware"])


# ------------------------------------------------------------------------------------------- measure


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def measure(doc: dict[str, Any], path: Path, cards: Sequence[tuple[str, OperatorCard, Sequence[str]]],
                  hw: Hardware, evaluate: Callable[[CardState, Proposal], Awaitable[Evaluation]], *,
                  max_instances: int | None = None, concurrency: int = 2,
                  log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Evaluate each card's distinct kernels once (at most `max_instances` a card), writing `path` after
    every evaluation. Kernels `doc` already holds (a resumed file) are kept, except evaluator errors
    ('internal'), which are measured again. `concurrency` evaluations in flight overlap compiles with
    GPU work, as the search does (the lane itself runs one at a time)."""
    proposer = BuiltinProposer()
    entries = {e["card"]["card_id"]: e for e in doc["cards"]}
    for n, (label, card, samples) in enumerate(cards, 1):
        where = f"[{n}/{len(cards)} {label}]"
        template = proposer.template_for(card, hw=hw)[0]
        if template is None:
            log(f"{where} no builtin template accepts it on {hw.name}: skipped")
            continue
        enum = enumerate_instances(template, card, hw)
        entry = entries.get(card.card_id)
        if entry is None:
            entry = entries[card.card_id] = {"label": label, "card": card_record(card, samples)}
            doc["cards"].append(entry)
        elif entry["template"] != enum.template:
            raise LandscapeError(f"card {card.card_id} ({label}): measured with template {entry['template']}, "
                                 f"the proposer now picks {enum.template}; start a new landscape")
        current = {i.digest for i in enum.instances}
        kept = [i for i in entry.get("instances", []) if i["category"] != "internal" and i["digest"] in current]
        entry.update(template=enum.template, combinations=enum.combinations, sources=enum.sources,
                     distinct=len(enum.instances), unlaunchable=enum.unlaunchable, instances=kept,
                     complete=len(kept) == len(enum.instances))
        done = {i["digest"] for i in kept}
        todo = [i for i in enum.instances if i.digest not in done]
        if max_instances is not None:
            todo = todo[: max(0, max_instances - len(done))]
        save(doc, path)
        log(f"{where} {enum.template}: {enum.combinations} combinations, {len(enum.instances)} distinct kernels, "
            f"{len(done)} measured already, {len(todo)} to measure")
        await _measure_card(doc, path, entry, template, CardState(card, list(samples)), todo, evaluate,
                            concurrency=concurrency, log=lambda line, where=where: log(f"{where} {line}"))
        said = copy_line(entry)
        if said:
            log(f"{where} {said}")
    return doc


def copy_line(entry: Mapping[str, Any]) -> str | None:
    """The card's best verified kernel (by speedup) against the lane's copy of the same bytes (issue 21's measure),
    where the landscape has both."""
    best, copy_us = best_instance(entry), entry["card"].get("copy_us")
    if best is None or not copy_us:
        return None
    return (f"best verified kernel {best['time_us']:.2f} us; the lane's copy of the same bytes {copy_us:.2f} us: "
            f"{100 * copy_us / best['time_us']:.0f} % of copy bandwidth ({best['params']})")


async def _measure_card(doc: dict[str, Any], path: Path, entry: dict[str, Any], template: Template,
                        state: CardState, todo: Sequence[Instance],
                        evaluate: Callable[[CardState, Proposal], Awaitable[Evaluation]], *,
                        concurrency: int, log: Callable[[str], None]) -> None:
    queue = iter(todo)
    in_a_row = 0

    async def worker() -> None:
        nonlocal in_a_row
        for inst in queue:
            try:
                ev = await evaluate(state, instance_proposal(template, inst))
            except Exception as e:  # as the orchestrator does: an evaluator error fails this kernel
                ev = Evaluation("rejected", "internal", f"{type(e).__name__}: {e}", 0.0)
            rec = instance_record(inst, ev)
            entry["instances"].append(rec)
            entry["complete"] = len(entry["instances"]) == entry["distinct"]
            save(doc, path)
            speed = (f" {rec['speedup']:.3f}× ({rec['speedup_ci'][0]:.3f}–{rec['speedup_ci'][1]:.3f})"
                     if rec["speedup"] and rec["speedup_ci"] else "")
            log(f"{len(entry['instances'])}/{entry['distinct']} {inst.digest[:12]}: {rec['status']}"
                f"{' ' + rec['category'] if rec['category'] else ''}{speed}")
            in_a_row = in_a_row + 1 if rec["category"] == "internal" else 0
            if in_a_row >= _STOP_AFTER_INTERNAL:
                raise MeasureStopped(f"{in_a_row} evaluator errors in a row (last: {ev.message}); what was "
                                     f"measured is in {path}: --resume it once the lane works")

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))


# -------------------------------------------------------------------------------------------- replay


def ci_sigma(timing: Mapping[str, Any]) -> float:
    """σ of log(speedup) that the measured 95 % CI implies (0 without a usable CI)."""
    ci = timing.get("speedup_ci") or ()
    if len(ci) != 2 or not ci[0] or ci[0] <= 0 or ci[1] < ci[0]:
        return 0.0
    return math.log(ci[1] / ci[0]) / (2 * _Z95)


_CANDIDATE_TIMES = ("median", "q1", "q3", "min", "max", "mean", "iqr")


def noisy(ev: Evaluation, rng: random.Random, scale: float = 1.0) -> Evaluation:
    """`ev` as one more measurement might have read it (the module's noise model); failures unchanged."""
    timing = ev.payload.get("timing")
    if ev.status != "verified" or not timing or scale == 0:
        return ev
    f = math.exp(rng.gauss(0.0, scale * ci_sigma(timing)))
    cand = dict(timing["candidate"])
    for k in _CANDIDATE_TIMES:
        if isinstance(cand.get(k), (int, float)):
            cand[k] = cand[k] / f
    t = {**timing, "candidate": cand, "speedup": timing["speedup"] * f}
    if timing.get("speedup_ci"):
        t["speedup_ci"] = [v * f for v in timing["speedup_ci"]]
    return dataclasses.replace(ev, payload={**ev.payload, "timing": t, "replay_noise": f})


class ReplayEvaluator:
    """The evaluate callable of a replayed search: the landscape's outcome of the proposed kernel."""

    def __init__(self, outcomes: Mapping[str, Mapping[str, Mapping[str, Any]]], seed: int,
                 noise_scale: float = 1.0):
        """`outcomes`: card id → kernel digest → instance record."""
        self.outcomes = outcomes
        self.seed = seed
        self.noise_scale = noise_scale
        self.misses: list[str] = []
        self._seen: Counter[tuple[str, str]] = Counter()

    async def __call__(self, card: CardState, proposal: Proposal) -> Evaluation:
        digest = kernel_digest(proposal.source, proposal.spec)
        rec = self.outcomes.get(card.card_id, {}).get(digest)
        if rec is None:
            msg = (f"card {card.card_id} ({card.card.op} {card.card.signature_text}): the proposed kernel "
                   f"{digest[:16]} (params {proposal.params}) is not in the landscape: it was measured with "
                   "other templates, or only in part; measure it again with bench_search.py --landscape")
            self.misses.append(msg)
            raise LandscapeMiss(msg)
        k = self._seen[(card.card_id, digest)]
        self._seen[(card.card_id, digest)] += 1
        rng = random.Random(f"{self.seed}:{card.card_id}:{digest}:{k}")
        return noisy(evaluation_of(rec), rng, self.noise_scale)


class ReplayRecorder(NullRecorder):
    """Keeps, per card, each evaluated kernel's digest and the speedup the search read (None: failed)."""

    def __init__(self) -> None:
        self.evaluated: dict[str, list[tuple[str, float | None]]] = {}

    async def candidate_finished(self, rec: CandidateRecord) -> None:
        p = rec.proposal
        self.evaluated.setdefault(rec.card_id, []).append((kernel_digest(p.source, p.spec), rec.speedup))


def replay_cards(doc: Mapping[str, Any], only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The landscape's cards to replay (labels containing one of `only`), each checked to hold every kernel
    the templates render now; LandscapeError names the first that does not."""
    hw = hardware_of(doc)
    proposer = BuiltinProposer()
    entries = [e for e in doc["cards"] if not only or any(s in e["label"] for s in only)]
    if not entries:
        raise LandscapeError(f"no card of the landscape matches {list(only or [])}: its cards are "
                             f"{[e['label'] for e in doc['cards']]}")
    for e in entries:
        card, _ = card_of(e["card"])
        measured = {i["digest"] for i in e["instances"] if i["category"] != "internal"}
        if not e.get("complete") or len(measured) < e["distinct"]:
            raise LandscapeError(f"card {card.card_id} ({e['label']}): {len(measured)} of {e['distinct']} kernels "
                                 "measured (--max-instances, a timeout or lane errors cut it): finish it with "
                                 "bench_search.py --landscape FILE --resume, or leave it out with --only")
        template = proposer.template_for(card, hw=hw)[0]
        now = enumerate_instances(template, card, hw) if template is not None else None
        missing = [i for i in now.instances if i.digest not in measured] if now is not None else []
        if now is None or now.template != e["template"] or missing:
            raise LandscapeError(
                f"card {card.card_id} ({e['label']}): the templates render other kernels than when the landscape "
                f"was measured (commit {doc.get('commit') or '?'}): "
                + (f"{len(missing)} kernels missing, e.g. params {missing[0].rendered.params}" if missing
                   else f"template {now.template if now else 'none'} instead of {e['template']}"))
    return entries


def outcomes_of(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """card id → kernel digest → instance record."""
    return {e["card"]["card_id"]: {i["digest"]: i for i in e["instances"]} for e in entries}


def best_instance(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The card's fastest verified kernel as measured (None: none verified)."""
    return max((i for i in entry["instances"] if i["status"] == "verified" and i["speedup"]),
               key=lambda i: i["speedup"], default=None)


def run_outcome(evaluated: Sequence[tuple[str, float | None]], outcomes: Mapping[str, Mapping[str, Any]],
                best: str | None) -> dict[str, Any]:
    """One run on one card: after each evaluation, the measured speedup of the kernel the search would keep
    (the best it read; 1.0 while none verified: eager stays), and whether it evaluated the best kernel."""
    curve, kept, read = [], None, -math.inf
    for digest, speedup in evaluated:
        if speedup is not None and speedup > read:
            kept, read = digest, speedup
        curve.append(outcomes[kept]["speedup"] if kept else 1.0)
    return {"evaluations": len(evaluated), "curve": curve, "kept": kept,
            "found_best": best is not None and any(d == best for d, _ in evaluated)}


# -------------------------------------------------------------------------------------------- report


def bootstrap_mean_ci(values: Sequence[float], *, n_boot: int = 10_000, seed: int = 0,
                      confidence: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean over `values` (resampled with replacement); None under 2 values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def wilson(k: int, n: int) -> tuple[float, float] | None:
    """95 % Wilson score interval of a proportion k/n (None for n = 0)."""
    if n == 0:
        return None
    p, z2 = k / n, _Z95 ** 2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def checkpoints(budget: int) -> list[int]:
    return sorted({n for n in (1, 5, 10, 20, 30, 50, budget) if n <= budget})


def _at(curve: Sequence[float], n: int) -> float:
    return curve[min(n, len(curve)) - 1] if curve else 1.0


def summarize(d: Mapping[str, Any]) -> dict[str, Any]:
    """Per strategy: the geometric mean over cards of the kept kernel's speedup after N evaluations, mean over
    seeds with a bootstrap CI over seeds; how often each card's best kernel was evaluated; and the paired
    per-seed differences of MCTS with each other strategy."""
    budget = d["budget"]
    cards = [c["id"] for c in d["cards"]]
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in d["runs"]:
        by.setdefault(r["strategy"], {})[r["seed"]] = r["cards"]
    out: dict[str, Any] = {"optimum": statistics.geometric_mean([c["best_speedup"] or 1.0 for c in d["cards"]]),
                           "strategies": {}, "differences": {}}
    final: dict[str, dict[int, float]] = {}
    for s, runs in by.items():
        per_n = {n: {seed: statistics.geometric_mean([_at(cs[c]["curve"], n) for c in cards])
                     for seed, cs in runs.items()} for n in checkpoints(budget)}
        final[s] = per_n[budget]
        vals = list(final[s].values())
        evals = [cs[c]["evaluations"] for cs in runs.values() for c in cards]
        out["strategies"][s] = {
            "seeds": len(runs), "final": {"mean": statistics.mean(vals), "ci": bootstrap_mean_ci(vals)},
            "checkpoints": {str(n): statistics.mean(v.values()) for n, v in per_n.items()},
            "found_best": {c: [sum(cs[c]["found_best"] for cs in runs.values()), len(runs)] for c in cards},
            "evaluations": [min(evals), max(evals)]}
    if "mcts" in final:
        for other in (s for s in final if s != "mcts"):
            seeds = sorted(set(final["mcts"]) & set(final[other]))
            diff = [final["mcts"][k] - final[other][k] for k in seeds]
            out["differences"][f"mcts-{other}"] = {"mean": statistics.mean(diff) if diff else None,
                                                   "ci": bootstrap_mean_ci(diff), "seeds": len(seeds)}
    return out


def _ci(ci: Sequence[float] | None, fmt: str = ".3f") -> str:
    return f"[{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "–"


def conclusion(summary: Mapping[str, Any], d: Mapping[str, Any]) -> list[str]:
    """What the replay lets one say, and what it does not, in plain sentences."""
    lines = []
    for pair, diff in summary["differences"].items():
        other = pair.split("-", 1)[1]
        ci = diff["ci"]
        if ci is None:
            lines.append(f"MCTS against {other}: one seed, no interval; nothing can be concluded.")
        elif ci[0] > 0 or ci[1] < 0:
            lines.append(f"MCTS ends {'ahead of' if ci[0] > 0 else 'behind'} {other} by {abs(diff['mean']):.3f} in the "
                         f"geometric-mean speedup (95 % CI {_ci(ci)} over {diff['seeds']} seeds): on these cards, at "
                         f"{d['budget']} evaluations a card and under this noise model, not seed luck.")
        else:
            lines.append(f"MCTS and {other} cannot be told apart: the 95 % CI of their difference ({_ci(ci)}, "
                         f"{diff['seeds']} seeds) includes 0.")
    near = [s for s, v in summary["strategies"].items() if v["final"]["mean"] >= 0.99 * summary["optimum"]]
    if near:
        lines.append(f"{', '.join(near)} end within 1 % of the landscape's best ({summary['optimum']:.3f}) on average: "
                     "at this budget the ceiling is near, and a smaller --budget tells the strategies apart better.")
    lines.append("What this cannot say: how the strategies fare on fresh GPU timings beyond the spread of one "
                 "measurement (drift between sittings is not modelled), on other cards or budgets, or with a "
                 "proposer whose revisions are not the builtin templates' neighbourhoods (an LLM).")
    return lines


def replay_report(d: Mapping[str, Any]) -> str:
    """bench_search_replay.md: first line says these are replays, not fresh GPU timings."""
    lay, summ = d["landscape"], d["summary"]
    names = list(summ["strategies"])
    commits = "; ".join(c[:12] for c in (lay.get("commit") or "?").split("; "))  # several: merged landscapes
    lines = [f"# Search ablation: replays over a landscape measured once on {lay['gpu']}, not fresh GPU timings", "",
             f"Landscape `{lay['path']}` (torch {lay.get('torch') or '?'}, commit {commits}"
             f"{' + local changes' if lay.get('dirty') else ''}, {lay.get('created') or '?'}): every distinct kernel of "
             "each card's builtin template evaluated once through the lane. Each replay runs the real orchestrator and "
             f"builtin proposer: {d['budget']} evaluations a card, {d['seeds']} seeds per strategy; an evaluation returns "
             "the landscape's outcome of the proposed kernel, its speedup drawn again as speedup × exp(σ·z) with σ from "
             f"the measured 95 % CI (noise scale {d['noise_scale']}; see scripts/search_landscape.py). A run's value on a "
             "card is the measured speedup of the kernel it would keep (the best it read; 1.0 where none verified).", "",
             "| card | template | distinct kernels | verified | best measured (95 % CI) |", "|---|---|---:|---:|---:|"]
    for c in d["cards"]:
        best = f"{c['best_speedup']:.3f}× ({_ci(c['best_ci'])})" if c["best_speedup"] else "none verified"
        lines.append(f"| {c['label']} | {c['template']} | {c['distinct']} | {c['verified']} | {best} |")
    cps = checkpoints(d["budget"])
    lines += ["", f"Geometric mean over cards, mean over seeds (landscape optimum {summ['optimum']:.3f}); "
              "95 % CI over seeds (bootstrap) at the full budget:", "",
              "| strategy | " + " | ".join(f"N={n}" for n in cps) + " | 95 % CI | evaluations a card |",
              "|---|" + "---:|" * (len(cps) + 2)]
    for s in names:
        v = summ["strategies"][s]
        lo, hi = v["evaluations"]
        lines.append(f"| {s} | " + " | ".join(f"{v['checkpoints'][str(n)]:.3f}" for n in cps)
                     + f" | {_ci(v['final']['ci']) if v['seeds'] > 1 else '– (one seed)'} | "
                     f"{lo if lo == hi else f'{lo}–{hi}'} |")
    lines += ["", "Runs that evaluated the card's best measured kernel (95 % Wilson interval):", "",
              "| strategy | " + " | ".join(c["label"] for c in d["cards"]) + " |", "|---|" + "---:|" * len(d["cards"])]
    for s in names:
        cells = []
        for c in d["cards"]:
            k, n = summ["strategies"][s]["found_best"][c["id"]]
            cells.append(f"{k}/{n} ({_ci(wilson(k, n), '.0%')})")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    if summ["differences"]:
        lines += ["", "Paired per seed (same seed: same proposer seed, same noise draw per kernel):", "",
                  "| difference | mean | 95 % CI | seeds |", "|---|---:|---:|---:|"]
        for pair, diff in summ["differences"].items():
            mean = f"{diff['mean']:+.4f}" if diff["mean"] is not None else "–"
            lines.append(f"| {pair.replace('-', ' − ')} | {mean} | {_ci(diff['ci'], '+.4f')} | {diff['seeds']} |")
    lines += ["", *conclusion(summ, d)]
    return "\n".join(lines) + "\n"
