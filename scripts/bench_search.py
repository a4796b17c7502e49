#!/usr/bin/env python3
"""Search ablation: MCTS vs greedy vs beam at equal evaluation budget, builtin proposer, several seeds.

    python scripts/bench_search.py --model resnet50 --budget 30 --seeds 3 --out docs/results/search-h200

Captures the model on the GPU (full size), keeps the cards the builtin proposer handles (top --cards by
share), and for every strategy and seed runs the real orchestrator with a real lane, recording the best
speedup found per card after each evaluation. Writes `<out>/bench_search.json` and `bench_search.md`.

The same ablation in two halves, so that it can take many seeds (scripts/search_landscape.py says how):

    python scripts/bench_search.py --model targets --only layer_norm --landscape OUT/landscape.json   # GPU, once
    python scripts/bench_search.py --replay OUT/landscape.json --seeds 30 --budget 12 --out OUT       # CPU

The first evaluates every distinct kernel of each card's builtin template once through the lane (no
search); the second runs the real orchestrator and proposer for every strategy and seed with an evaluator
that returns the landscape's outcomes, and writes `<out>/bench_search_replay.json` and `.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import search_landscape as landscape  # noqa: E402
import torch  # noqa: E402

from engine.cards import OperatorCard  # noqa: E402
from engine.compile import CompilePool, Compiler  # noqa: E402
from engine.lane.client import GpuLane, worker_argv  # noqa: E402
from engine.propose.base import Hardware  # noqa: E402
from engine.propose.builtin import BuiltinProposer  # noqa: E402
from engine.run.evaluators import LaneEvaluator  # noqa: E402
from engine.run.orchestrator import Budgets, NullRecorder, Orchestrator, Recorder  # noqa: E402
from engine.run.plan import CardState, SchedulePolicy  # noqa: E402
from engine.search.tree import SearchParams  # noqa: E402


class CurveRecorder(NullRecorder):
    """Keeps the best speedup per card after every evaluation; writes nothing durable."""

    def __init__(self):
        self.curve: dict[str, list[float]] = {}
        self.best: dict[str, float] = {}
        self.ids = 0

    async def candidate_finished(self, rec):
        if rec.speedup:
            self.best[rec.card_id] = max(self.best.get(rec.card_id, 0.0), rec.speedup)
        self.curve.setdefault(rec.card_id, []).append(self.best.get(rec.card_id, 0.0))


@contextlib.asynccontextmanager
async def lane_session(args) -> AsyncIterator[tuple[list[tuple[str, OperatorCard, list[str]]], dict, Hardware,
                                                    LaneEvaluator]]:
    """Capture the cards (`--model`, `--only`), start a lane; yields the first `--cards` the builtin proposer
    supports as (label, card, sample paths), the lane's hello, its GPU and the evaluator a search uses."""
    if args.model == "targets":  # the issue-4 target cards of bench_builtin.py (real-shaped single calls)
        from bench_builtin import _cases

        from engine.capture.single import capture_card

        refs = []
        for i, case in enumerate(c for c in _cases() if not args.only or any(s in c.label for s in args.only)):
            fn, x = case.make()
            refs.append((case.label, capture_card(Path(args.workspace) / f"card{i}", fn, samples=2)))
            del fn, x
    else:
        from bench_lane import model_cards  # the same capture path as the lane benchmark

        refs = [(f"{r.op} {r.card_id}", r) for r in model_cards(args.model, Path(args.workspace))]
    proposer = BuiltinProposer()
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    lane = GpuLane(worker_argv(0), timeout_s=120)
    await lane.start()
    try:
        hello = (await lane.request("hello")).payload
        compiler = Compiler(Path(args.workspace) / "cache", "nvrtc", arch=arch)
        from engine.capture.signature import signature_text

        copies: dict[str, dict] = {}
        if getattr(args, "landscape", None):  # the lane's copy of each card's bytes: what "% of copy" is against
            from engine.lane.eager import measure_copy

            copies = await measure_copy(lane, [r for _, r in refs if r.bytes])
        briefs = [(label, OperatorCard(r.card_id, r.op, r.signature, signature_text(r.signature), r.outputs,
                                       bytes=r.bytes, roofline_us=r.bytes / hello["copy_bw"] * 1e6,
                                       copy_us=(copies.get(r.card_id) or {}).get("copy", {}).get("median")),
                   r.samples)
                  for label, r in refs]
        briefs = [b for b in briefs if proposer.supports(b[1])][: args.cards]
        async with CompilePool() as pool:
            yield briefs, hello, Hardware.from_hello(hello), LaneEvaluator([lane], compiler, pool,
                                                                           timing={"max_seconds": args.timing_s})
    finally:
        await lane.close()


async def search_once(cards: Sequence[tuple[OperatorCard, Sequence[str]]], evaluate: Any, hw: Hardware,
                      strategy: str, seed: int, budget: int, recorder: Recorder) -> str:
    """One search of the ablation: the real orchestrator over the cards (equal shares), a fresh builtin
    proposer with this seed, `budget` evaluations a card, no early stopping."""
    states = [CardState(dataclasses.replace(c, share=1.0 / len(cards)), list(samples)) for c, samples in cards]
    ids = iter(range(10**9))
    # A fresh proposer per run: it remembers the kernels it proposed, which must not carry over from one
    # strategy or seed to the next.
    o = Orchestrator(cards=states, proposer=_Seeded(BuiltinProposer(), seed), evaluate=evaluate, recorder=recorder,
                     new_id=lambda: f"n{next(ids)}", hardware=hw, strategy=strategy, params=SearchParams(),
                     budgets=Budgets(iterations_per_card=budget),
                     policy=SchedulePolicy(patience=10**9, near_roofline=0.0), max_proposals=2)
    return await o.run()


async def main_async(args) -> dict:
    results: dict = {"model": args.model, "budget": args.budget, "seeds": args.seeds, "runs": []}
    async with lane_session(args) as (briefs, _hello, hw, evaluate):
        results["cards"] = [{"id": b.card_id, "op": b.op, "signature": b.signature_text} for _, b, _ in briefs]
        for strategy in args.strategies.split(","):
            for seed in range(args.seeds):
                rec = CurveRecorder()
                await search_once([(b, samples) for _, b, samples in briefs], evaluate, hw, strategy, seed,
                                  args.budget, rec)
                results["runs"].append({"strategy": strategy, "seed": seed, "curves": rec.curve})
                print(strategy, seed, {k: round(v, 3) for k, v in rec.best.items()}, flush=True)
    return results


async def landscape_async(args) -> dict:
    """`--landscape`: every distinct builtin kernel of each card evaluated once, written as it goes."""
    from reproduce import git_commit

    async with lane_session(args) as (briefs, hello, hw, evaluate):
        if args.resume and args.landscape.exists():
            doc = landscape.load_landscape(args.landscape)
            if (doc["hardware"]["name"], doc["hardware"]["arch"]) != (hello["name"], hello["arch"]):
                raise landscape.LandscapeError(f"{args.landscape} was measured on {doc['hardware']['name']}, "
                                               f"this lane is {hello['name']}: start a new file")
        else:
            commit, dirty = git_commit()
            doc = landscape.new_landscape(hello, torch=torch.__version__, cuda=torch.version.cuda, commit=commit,
                                          dirty=dirty, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                          model=args.model, only=args.only, timing={"max_seconds": args.timing_s},
                                          max_instances=args.max_instances)
        await landscape.measure(doc, args.landscape, briefs, hw, evaluate, max_instances=args.max_instances)
    return doc


async def replay_async(args) -> dict:
    """`--replay`: every strategy and seed searched over the landscape (no GPU); the runs and their summary."""
    paths = list(args.replay) if isinstance(args.replay, (list, tuple)) else [args.replay]
    doc = landscape.merge_landscapes([landscape.load_landscape(p) for p in paths], paths)
    entries = landscape.replay_cards(doc, args.only)
    hw = landscape.hardware_of(doc)
    outcomes = landscape.outcomes_of(entries)
    cards = [landscape.card_of(e["card"]) for e in entries]
    best = {e["card"]["card_id"]: landscape.best_instance(e) for e in entries}
    d: dict = {"landscape": {"path": ", ".join(map(str, paths)), **{k: doc.get(k) for k in
                                                         ("gpu", "torch", "cuda", "commit", "dirty", "created")}},
               "budget": args.budget, "seeds": args.seeds, "noise_scale": args.noise_scale, "cards": [], "runs": []}
    for e in entries:
        cid, b = e["card"]["card_id"], best[e["card"]["card_id"]]
        d["cards"].append({"id": cid, "label": e["label"], "op": e["card"]["op"],
                           "signature": e["card"]["signature_text"], "template": e["template"],
                           "distinct": e["distinct"], "verified": sum(i["status"] == "verified" for i in e["instances"]),
                           "best_speedup": b["speedup"] if b else None, "best_ci": b["speedup_ci"] if b else None,
                           "best_params": b["params"] if b else None})
    for strategy in args.strategies.split(","):
        for seed in range(args.seeds):
            evaluate = landscape.ReplayEvaluator(outcomes, seed, args.noise_scale)
            rec = landscape.ReplayRecorder()
            await search_once(cards, evaluate, hw, strategy, seed, args.budget, rec)
            if evaluate.misses:
                more = f" ({len(evaluate.misses)} misses in all)" if len(evaluate.misses) > 1 else ""
                raise landscape.LandscapeMiss(f"{strategy}, seed {seed}: {evaluate.misses[0]}{more}")
            d["runs"].append({"strategy": strategy, "seed": seed, "cards": {
                cid: landscape.run_outcome(rec.evaluated.get(cid, []), outcomes[cid], b["digest"] if b else None)
                for cid, b in best.items()}})
    d["summary"] = landscape.summarize(d)
    return d


class _Seeded:
    """The builtin proposer with a per-run seed, so seeds explore differently."""

    def __init__(self, inner, seed):
        self.inner, self.seed, self.name = inner, seed, inner.name

    def supports(self, card):
        return self.inner.supports(card)

    async def propose(self, request):
        from dataclasses import replace

        return await self.inner.propose(replace(request, seed=request.seed * 1000 + self.seed))


def report(d: dict) -> str:
    lines = [f"# Search ablation on {d['model']} (builtin proposer, {d['budget']} evaluations per card, "
             f"{d['seeds']} seeds)", "", "Best speedup per card after N evaluations, mean over seeds "
             "(geometric mean over cards):", "", "| strategy | " +
             " | ".join(f"N={n}" for n in _checkpoints(d['budget'])) + " |",
             "|---|" + "---:|" * len(_checkpoints(d["budget"]))]
    for strategy in dict.fromkeys(r["strategy"] for r in d["runs"]):
        runs = [r for r in d["runs"] if r["strategy"] == strategy]
        row = []
        for n in _checkpoints(d["budget"]):
            per_seed = []
            for r in runs:
                vals = [c[min(n, len(c)) - 1] for c in r["curves"].values() if c]
                vals = [v for v in vals if v > 0]
                if vals:
                    per_seed.append(statistics.geometric_mean(vals))
            row.append(f"{statistics.mean(per_seed):.3f}" if per_seed else "–")
        lines.append(f"| {strategy} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _checkpoints(budget: int) -> list[int]:
    return sorted({n for n in (1, 5, 10, 20, 30, 50, budget) if n <= budget})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50",
                    help="a reference config, or 'targets' for bench_builtin.py's issue-4 cards")
    ap.add_argument("--only", nargs="*", help="with --model targets: cases whose label contains one of these "
                    "(with --replay: the landscape's cards whose label does)")
    ap.add_argument("--timing-s", type=float, default=0.5, help="timing cap per evaluation (s)")
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cards", type=int, default=6)
    ap.add_argument("--workspace", default="/tmp/kforge-bench-search")
    ap.add_argument("--strategies", default="mcts,greedy,beam", help="comma-separated (default: all three)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                      help="no GPU work: merge bench_search.json files (e.g. strategies run on two GPUs)")
    mode.add_argument("--landscape", type=Path, metavar="JSON",
                      help="GPU, no search: evaluate every distinct builtin kernel of each card once into JSON, "
                      "written after every kernel (progress on stderr)")
    mode.add_argument("--replay", type=Path, nargs="+", metavar="JSON",
                      help="no GPU: replay every strategy for --seeds seeds over a landscape (or several of one "
                      "GPU, their cards together); writes <out>/bench_search_replay.json and .md")
    ap.add_argument("--max-instances", type=int, metavar="N",
                    help="with --landscape: at most N kernels a card (a card cut short cannot be replayed)")
    ap.add_argument("--resume", action="store_true",
                    help="with --landscape: continue an existing file, measuring only the kernels it lacks")
    ap.add_argument("--noise-scale", type=float, default=1.0,
                    help="with --replay: widen (>1) or remove (0) the timing noise drawn from each measured CI")
    ap.add_argument("--out", type=Path, help="the folder for the report (all modes but --landscape)")
    args = ap.parse_args()
    if args.out is None and not args.landscape:
        ap.error("--out is required (except with --landscape)")
    if args.merge:
        docs = [json.loads(p.read_text()) for p in args.merge]
        d = {**docs[0], "runs": [r for doc in docs for r in doc["runs"]]}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_search.json").write_text(json.dumps(d, indent=1))
        (args.out / "bench_search.md").write_text(report(d))
        print(report(d))
        return 0
    if args.replay:
        try:
            d = asyncio.run(replay_async(args))
        except (landscape.LandscapeError, landscape.LandscapeMiss) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_search_replay.json").write_text(json.dumps(d, indent=1))
        (args.out / "bench_search_replay.md").write_text(landscape.replay_report(d))
        print(landscape.replay_report(d))
        return 0
    if args.landscape and args.landscape.exists() and not args.resume:
        print(f"error: {args.landscape} exists: --resume to continue it, or name another file", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: bench_search needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.landscape:
        try:
            asyncio.run(landscape_async(args))
        except landscape.LandscapeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except landscape.MeasureStopped as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"landscape written to {args.landscape}", file=sys.stderr)
        return 0
    d = asyncio.run(main_async(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_search.json").write_text(json.dumps(d, indent=1))
    (args.out / "bench_search.md").write_text(report(d))
    print(report(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
