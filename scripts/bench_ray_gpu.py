#!/usr/bin/env python3
"""Candidates per minute of one Ray GPU lane against one local lane of the same GPU (issue 22's target: within
10 %), on the same search.

    python scripts/bench_ray_gpu.py --out DIR [--iterations 24] [--rounds 2]

One card (relu over 4 Mi floats, captured here), the builtin proposer, `--iterations` candidates per search; the
same search runs on a local lane (`LaneEvaluator`) and on a Ray GPU actor's lane (`start_ray_evaluator`, a local
Ray instance with one GPU), in alternating order over `--rounds` rounds, each arm with its own empty compile
cache (no arm reuses the other's compiles). A search's rate is its candidates over the wall time from its first
proposal to its last result. Writes DIR/bench_ray_gpu.json and .md. Needs a CUDA GPU and Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TIMING = {"max_seconds": 1.0}


def worker_path() -> str:
    """The workers' PYTHONPATH: this checkout first, then the driver's own (where Ray itself may live)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def log(msg: str) -> None:
    print(f"[bench_ray_gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def search(kind: str, card, samples, iterations: int, cache: Path) -> dict:
    from engine.compile import CompilePool, Compiler
    from engine.lane.client import GpuLane, worker_argv
    from engine.propose.base import Hardware
    from engine.propose.builtin import BuiltinProposer
    from engine.run.evaluators import LaneEvaluator, start_ray_evaluator
    from engine.run.orchestrator import Budgets, NullRecorder, Orchestrator
    from engine.run.plan import CardState

    class Finished(NullRecorder):
        def __init__(self):
            self.done = []

        async def candidate_finished(self, rec):
            self.done.append(rec)

    async with CompilePool() as pool:
        if kind == "ray":
            ev = await start_ray_evaluator(None, dry=False, arch="sm_90", timing=TIMING, poll_s=0, max_lanes=1)
            lane0, close = ev.lanes.lanes[0], ev.lanes.close
        else:
            lane = GpuLane(worker_argv(0), timeout_s=120)
            await lane.start()
            ev, lane0, close = None, lane, lane.close
        try:
            hello = (await lane0.request("hello")).payload
            hw = Hardware(hello["name"], hello["arch"], hello["sms"], hello["l2_bytes"], hello["copy_bw"],
                          hello["max_shared_per_block"])
            compiler = Compiler(cache, "nvrtc", arch=hello["arch"])
            if ev is None:
                ev = LaneEvaluator([lane0], compiler, pool, timing=TIMING)
            else:
                ev.compiler, ev.pool = compiler, pool
            rec = Finished()
            ids = iter(range(10**6))
            o = Orchestrator(cards=[CardState(card, samples)], proposer=BuiltinProposer(), evaluate=ev,
                             recorder=rec, new_id=lambda: f"n{next(ids)}", hardware=hw,
                             budgets=Budgets(iterations_per_card=iterations), max_proposals=2)
            t0 = time.perf_counter()
            await o.run()
            wall = time.perf_counter() - t0
        finally:
            await close()
    n = len(rec.done)
    return {"arm": kind, "candidates": n, "wall_s": wall, "per_min": 60 * n / wall,
            "verified": sum(r.status == "verified" for r in rec.done)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--iterations", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: bench_ray_gpu: no CUDA GPU is visible", file=sys.stderr)
        return 2
    import ray

    from engine.capture.signature import signature_text
    from engine.capture.single import capture_card
    from engine.cards import OperatorCard

    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="kforge-raygpu-"))
    x = torch.randn(1 << 22, device="cuda")
    ref = capture_card(tmp / "card", lambda: torch.relu(x), samples=2)
    card = OperatorCard(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs,
                        bytes=ref.bytes, eager_us=20.0, share=1.0)
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, object_store_memory=400 * 2**20,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": worker_path()}})
    rows = []
    try:
        for r in range(args.rounds):
            for kind in (("local", "ray") if r % 2 == 0 else ("ray", "local")):
                res = asyncio.run(search(kind, card, ref.samples, args.iterations, tmp / f"cache-{kind}-{r}"))
                res["round"] = r
                rows.append(res)
                log(f"round {r} {kind}: {res['candidates']} candidates in {res['wall_s']:.1f} s = "
                    f"{res['per_min']:.1f}/min ({res['verified']} verified)")
    finally:
        ray.shutdown()
    rate = {k: sum(x["candidates"] for x in rows if x["arm"] == k) * 60
            / sum(x["wall_s"] for x in rows if x["arm"] == k) for k in ("local", "ray")}
    doc = {"gpu": torch.cuda.get_device_name(), "ray": ray.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
           "rows": rows, "per_min": rate, "ray_over_local": rate["ray"] / rate["local"]}
    (args.out / "bench_ray_gpu.json").write_text(json.dumps(doc, indent=1))
    md = ["# bench_ray_gpu", "", f"{doc['gpu']}, Ray {doc['ray']}, {doc['date']}", "",
          "| round | arm | candidates | verified | wall s | per min |", "|---:|---|---:|---:|---:|---:|"]
    md += [f"| {x['round']} | {x['arm']} | {x['candidates']} | {x['verified']} | {x['wall_s']:.1f} | "
           f"{x['per_min']:.1f} |" for x in rows]
    md += ["", f"Ray lane over local lane: {doc['ray_over_local']:.3f} (target: within 10 %, ≥ 0.90)"]
    (args.out / "bench_ray_gpu.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
