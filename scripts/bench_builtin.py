#!/usr/bin/env python3
"""Issue-4 targets: the builtin proposer after search, on the operator variants of the H200 baselines.

    python scripts/bench_builtin.py --out docs/results/builtin-h200

Each card is one real-shaped call captured on the GPU (samples on disk, as a model capture makes them).
The real orchestrator runs MCTS over all cards with the builtin proposer and a real lane (default budget:
50 evaluations per card, the default stopping policy), then the best verified candidate of every card is
reported with its A/B timing against eager (median, 95 % CI of the speedup), the bandwidth it reached
and the target it is held to. Writes `<out>/bench_builtin.json` and `<out>/bench_builtin.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Issue 21: a memory-bound kernel moving >= 32 MB reaches this fraction of the bandwidth of the lane's own copy
# of the same bytes (PyTorch's clone of the card's main input, timed in the lane as the kernel is).
COPY_TARGET = 0.90

from engine.run.orchestrator import NullRecorder  # noqa: E402

COPY_BW = 4.25e12  # bytes/s, device-to-device copy on the H200 (../shared/reference/h200-baselines.md)


@dataclass
class Case:
    label: str
    make: Callable[[], tuple[Callable[[], Any], torch.Tensor]]  # inputs → (the call, its main input)
    target: str                             # what issue 4 asks of it
    min_speedup: float | None = None
    compile_us: float | None = None         # torch.compile µs from the baselines table, for comparison


def _cases() -> list[Case]:
    dev = "cuda"

    def gn(shape, dtype, channels_last=False):
        def make():
            g = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(*shape, device=dev, dtype=dtype, generator=g) * 0.7 + 0.2
            if channels_last:  # as torch.compile hands it over after a convolution
                x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(shape[1], device=dev, dtype=dtype, generator=g) * 0.2 + 1
            b = torch.randn(shape[1], device=dev, dtype=dtype, generator=g) * 0.1
            return (lambda: F.group_norm(x, 32, w, b, 1e-6)), x
        return make

    def softmax(shape):
        def make():
            x = torch.randn(*shape, device=dev) * 3
            return (lambda: torch.softmax(x, dim=-1)), x
        return make

    def layer_norm():
        x = torch.randn(2, 4250, 1536, device=dev, dtype=torch.bfloat16)
        return (lambda: F.layer_norm(x, (1536,), None, None, 1e-6)), x

    def rms_norm():
        x = torch.randn(1, 2048, 1536, device=dev, dtype=torch.bfloat16)
        w = torch.randn(1536, device=dev, dtype=torch.bfloat16) * 0.1 + 1
        return (lambda: F.rms_norm(x, (1536,), w, 1e-6)), x

    def pool():
        x = torch.randn(32, 2048, 7, 7, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
        return (lambda: F.adaptive_avg_pool2d(x, 1)), x

    def relu():
        x = torch.randn(32, 256, 56, 56, device=dev, dtype=torch.float16)
        return (lambda: torch.relu(x)), x

    def add():
        a = torch.randn(32, 256, 56, 56, device=dev, dtype=torch.float16)
        b = torch.randn(32, 256, 56, 56, device=dev, dtype=torch.float16)
        return (lambda: torch.add(a, b)), a

    def gelu():
        x = torch.randn(1, 2048, 8192, device=dev, dtype=torch.bfloat16)
        return (lambda: F.gelu(x, approximate="tanh")), x

    bw = f"≥ {100 * COPY_TARGET:.0f} % of the copy's bandwidth (moves ≥ 32 MB)"
    return [
        Case("group_norm fp16 [1,512,128,128] g32 (SD3.5 VAE)", gn((1, 512, 128, 128), torch.float16),
             "≥ 8× eager, faster than torch.compile", 8.0, 87.9),
        Case("group_norm fp16 [1,256,512,512] g32 (SD3.5 VAE)", gn((1, 256, 512, 512), torch.float16),
             "≥ 8× eager, faster than torch.compile; " + bw, 8.0, 172.6),
        Case("group_norm bf16 [1,128,1024,1024] g32 (SD3.5 VAE, largest)", gn((1, 128, 1024, 1024), torch.bfloat16),
             "≥ 8× eager; " + bw, 8.0),
        Case("group_norm bf16 [1,128,1024,1024] g32 channels-last (SD3.5 VAE under torch.compile)",
             gn((1, 128, 1024, 1024), torch.bfloat16, channels_last=True), "≥ 8× eager; " + bw, 8.0),
        Case("softmax fp32 [4,262144]", softmax((4, 262144)), "≥ 10× eager", 10.0, 252.4),
        Case("layer_norm bf16 [2,4250,1536] (SD3.5 MMDiT)", layer_norm, "≥ 2× eager; " + bw, 2.0, 27.9),
        Case("rms_norm bf16 [1,2048,1536] (Gemma-sized)", rms_norm, "≥ 2× eager", 2.0, 38.1),
        Case("adaptive_avg_pool2d fp16 [32,2048,7,7] channels_last (ResNet-50)", pool, "≥ 2× eager", 2.0, 11.7),
        Case("softmax fp32 [1,8,2048,2048] (attention scores)", softmax((1, 8, 2048, 2048)), bw, None, 73.0),
        Case("softmax fp32 [4096,256] (MoE router)", softmax((4096, 256)), "–", None, 8.6),
        Case("relu fp16 [32,256,56,56] (ResNet-50)", relu, bw, None, 30.8),
        Case("add fp16 [32,256,56,56] (ResNet-50)", add, bw, None, 43.2),
        Case("gelu(tanh) bf16 [1,2048,8192]", gelu, bw, None, 52.2),
    ]


class BestRecorder(NullRecorder):
    """Keeps every finished candidate's outcome per card in memory (nothing durable)."""

    def __init__(self):
        self.finished: dict[str, list[Any]] = {}

    async def candidate_finished(self, rec):
        self.finished.setdefault(rec.card_id, []).append(rec)
        mark = f"{rec.speedup:.2f}x" if rec.speedup else f"{rec.status} [{rec.category}]"
        print(f"  {rec.card_id[:8]} {rec.proposal.intent[:60]}: {mark}", flush=True)


async def main_async(args) -> dict:
    from engine.capture.signature import signature_text
    from engine.capture.single import capture_card
    from engine.cards import OperatorCard
    from engine.compile import CompilePool, Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.lane.evaluate import ensure_loaded
    from engine.propose.base import Hardware
    from engine.propose.builtin import BuiltinProposer
    from engine.run.evaluators import LaneEvaluator
    from engine.run.orchestrator import Budgets, Orchestrator
    from engine.run.plan import CardState
    from engine.search.tree import SearchParams

    work = Path(args.workspace)
    cases = [c for c in _cases() if not args.only or any(s in c.label for s in args.only)]
    refs, floors = [], []
    for i, case in enumerate(cases):
        fn, x = case.make()
        refs.append(capture_card(work / f"card{i}", fn, samples=2))
        # The copy floor under the same timing protocol: eager clone of the main input (reads and writes
        # its bytes once), and a 4-byte clone (what any kernel costs here, however little it moves).
        floors.append(capture_card(work / f"floor{i}", lambda x=x: x.clone(), samples=1))
        del fn, x
        torch.cuda.empty_cache()
    tiny = torch.zeros(1, device="cuda")
    launch_floor = capture_card(work / "floor-tiny", lambda: tiny.clone(), samples=1)
    proposer = BuiltinProposer()
    lane = GpuLane(worker_argv(0), timeout_s=120)
    await lane.start()
    hello = (await lane.request("hello")).payload
    hw = Hardware(hello["name"], hello["arch"], hello["sms"], hello["l2_bytes"], hello["copy_bw"],
                  hello["max_shared_per_block"])
    compiler = Compiler(work / "cache", "nvrtc", arch=hello["arch"])
    states, briefs = [], {}
    for case, r in zip(cases, refs):
        b = OperatorCard(r.card_id, r.op, r.signature, signature_text(r.signature), r.outputs, bytes=r.bytes,
                         roofline_us=r.bytes / COPY_BW * 1e6, share=1.0 / len(cases))
        briefs[r.card_id] = (case, b)
        if not proposer.supports(b):
            print(f"declined: {case.label}: {r.op}", flush=True)
        states.append(CardState(b, r.samples))
    floor_us: dict[str, float] = {}
    for ref in floors + [launch_floor]:
        await ensure_loaded(lane, ref)
        r = await lane.request("time_eager", {"card_id": ref.card_id})
        if r.ok:
            floor_us[ref.card_id] = r.payload["eager"]["median"]
    rec = BestRecorder()
    ids = iter(range(10**9))
    t0 = time.monotonic()
    try:
        async with CompilePool() as pool:
            evaluate = LaneEvaluator([lane], compiler, pool, timing={"max_seconds": args.timing_s})
            o = Orchestrator(cards=states, proposer=proposer, evaluate=evaluate, recorder=rec,
                             new_id=lambda: f"n{next(ids)}", hardware=hw, strategy=args.strategy,
                             params=SearchParams(), budgets=Budgets(iterations_per_card=args.budget,
                                                                    wall_s=args.wall_time),
                             max_proposals=4)
            stopped_by = await o.run()
    finally:
        await lane.close()
    wall = time.monotonic() - t0
    rows = []
    for st, floor in zip(states, floors):
        case, b = briefs[st.ref.card_id]
        done = rec.finished.get(st.ref.card_id, [])
        ok = [r for r in done if r.status == "verified" and r.best_us]
        best = min(ok, key=lambda r: r.best_us) if ok else None
        fails: dict[str, int] = {}
        for r in done:
            if r.status != "verified":
                fails[r.category or "?"] = fails.get(r.category or "?", 0) + 1
        row = {"label": case.label, "op": b.op, "signature": b.signature_text, "bytes": st.ref.bytes,
               "roofline_us": st.ref.bytes / COPY_BW * 1e6, "evaluations": len(done), "verified": len(ok),
               "failures": fails, "stopped": st.done_reason, "target": case.target,
               "min_speedup": case.min_speedup, "compile_us_baseline": case.compile_us,
               "clone_us": floor_us.get(floor.card_id), "clone_bytes": floor.bytes}
        if best:
            row.update({"best_us": best.best_us, "eager_us": best.eager_us, "speedup": best.speedup,
                        "speedup_ci": list(best.speedup_ci) if best.speedup_ci else None,
                        "intent": best.proposal.intent, "params": best.proposal.params,
                        "bandwidth_frac": st.ref.bytes / (best.best_us * 1e-6) / COPY_BW})
            row["of_copy"] = of_copy(row)
        rows.append(row)
    return {"gpu": hello["name"], "torch": torch.__version__, "strategy": args.strategy, "budget": args.budget,
            "stopped_by": stopped_by, "wall_s": wall, "launch_floor_us": floor_us.get(launch_floor.card_id), "evaluations": sum(r["evaluations"] for r in rows),
            "cards": rows}


def of_copy(r: dict) -> float | None:
    """The kernel's bandwidth (the card's bytes over its time) as a fraction of the lane's copy of the same bytes
    (the clone's bytes over the clone's time): 1.0 moves its bytes as fast as PyTorch's own copy does, on this
    GPU, under this timing protocol. None without a clone timing or a verified kernel."""
    if not r.get("best_us") or not r.get("clone_us") or not r.get("clone_bytes") or not r.get("bytes"):
        return None
    return (r["bytes"] / r["best_us"]) / (r["clone_bytes"] / r["clone_us"])


def current_target(target: str) -> str:
    """A recorded target with its bandwidth clause as this version states it (older records said ≥ 75 % of a
    fixed copy bandwidth): --report-only then judges an old measurement by today's target, and says so."""
    import re

    return re.sub(r"≥ \d+ % of (the )?copy('s)? bandwidth", f"≥ {100 * COPY_TARGET:.0f} % of the copy's bandwidth", target)


def verdict(r: dict) -> str:
    if "speedup" not in r:
        return "no verified kernel"
    notes = []
    if r["min_speedup"]:
        notes.append("met" if r["speedup"] >= r["min_speedup"] else "MISSED")
    if "copy" in r["target"] and "bandwidth" in r["target"]:  # either wording: judged at COPY_TARGET
        frac = of_copy(r)
        notes.append("bw unknown (no clone timing)" if frac is None else
                     f"bw {'met' if frac >= COPY_TARGET else 'MISSED'}")
    if r["compile_us_baseline"] and "torch.compile" in r["target"]:
        notes.append("beats compile" if r["best_us"] < r["compile_us_baseline"] else "SLOWER than compile")
    return ", ".join(notes) or "–"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def _us(v: float | None) -> str:
    return f"{v:.1f}" if v else "–"


def report(d: dict) -> str:
    lines = [f"# Builtin proposer after search on the {d['gpu']} (torch {d['torch']})", "",
             f"Strategy {d['strategy']}, budget {d['budget']} evaluations per card with the default stopping "
             f"policy; {d['evaluations']} evaluations in {d['wall_s']:.0f} s "
             f"({60 * d['evaluations'] / max(d['wall_s'], 1e-9):.0f} per minute); run stopped by "
             f"{d['stopped_by']}.", "",
             "Clone µs: PyTorch's own copy of the card's main input, timed in the lane with the same protocol "
             "(L2 flushed, GPU kept busy before the call): what merely reading and writing those bytes costs "
             f"here. A 4-byte clone took {d['launch_floor_us'] or float('nan'):.1f} µs: the floor of any "
             "kernel under this protocol.", "",
             "% of copy bw: the kernel's bytes per second against the clone's (the card's bytes over its time, the "
             "clone's over the clone's): how close it comes to moving its bytes as fast as PyTorch's copy does here. "
             "% of spec: against a fixed copy bandwidth measured once per lane (an earlier report's column).", "",
             "| card | eager µs | best µs | speedup (95 % CI) | % of copy bw | % of spec | clone µs | torch.compile µs* | "
             "evals | target | verdict |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|"]
    for r in d["cards"]:
        if "speedup" in r:
            ci = r["speedup_ci"] or [r["speedup"], r["speedup"]]
            lines.append(f"| {r['label']} | {r['eager_us']:.1f} | {r['best_us']:.1f} | {r['speedup']:.2f}× "
                         f"({ci[0]:.2f}–{ci[1]:.2f}) | {_pct(of_copy(r))} | {100 * r['bandwidth_frac']:.0f} % | "
                         f"{_us(r['clone_us'])} | "
                         f"{r['compile_us_baseline'] or '–'} | {r['evaluations']} | {current_target(r['target'])} | {verdict(r)} |")
        else:
            lines.append(f"| {r['label']} | – | – | – | – | – | {_us(r['clone_us'])} | {r['compile_us_baseline'] or '–'} | "
                         f"{r['evaluations']} | {current_target(r['target'])} | {verdict(r)} |")
    lines += ["", "\\* torch.compile (max-autotune-no-cudagraphs) from `../shared/reference/h200-baselines.md`, "
              "not re-measured here.", "", "Best kernels:", ""]
    for r in d["cards"]:
        if "speedup" in r:
            lines.append(f"- {r['label']}: {r['intent']}; failures {r['failures'] or 'none'}; "
                         f"stopped: {r['stopped']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=50, help="evaluations per card (default 50)")
    ap.add_argument("--strategy", default="mcts", choices=("mcts", "greedy", "beam"))
    ap.add_argument("--wall-time", type=float, default=None, help="stop the search after this many seconds")
    ap.add_argument("--timing-s", type=float, default=0.5, help="timing cap per evaluation (s)")
    ap.add_argument("--only", nargs="*", help="only cases whose label contains one of these strings")
    ap.add_argument("--workspace", default="/tmp/kforge-bench-builtin")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite OUT/bench_builtin.md from OUT/bench_builtin.json (no GPU): the same measurement, "
                         "this version's columns and verdicts")
    args = ap.parse_args()
    if args.report_only:
        src = args.out / "bench_builtin.json"
        if not src.is_file():
            print(f"error: --report-only: {src} does not exist; run bench_builtin.py --out {args.out} on a GPU first",
                  file=sys.stderr)
            return 2
        d = json.loads(src.read_text())
        (args.out / "bench_builtin.md").write_text(report(d))
        print(report(d))
        return 0
    if not torch.cuda.is_available():
        print("error: bench_builtin needs a CUDA GPU", file=sys.stderr)
        return 2
    d = asyncio.run(main_async(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_builtin.json").write_text(json.dumps(d, indent=1))
    (args.out / "bench_builtin.md").write_text(report(d))
    print(report(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
