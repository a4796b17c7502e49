"""Write the workspace database that `kforge-tui demo` opens.

    python scripts/make_demo_db.py --standin [--out kforge_tui/demo] [--iterations 12] [--delay 0]

`--standin` drives the real orchestrator and store with a scripted proposer and a CPU stand-in of the
GPU lane (a deterministic cost model, with failures of several categories). Its numbers are NOT
measurements: the run is labelled so in its config and provider name. The real demo is a run recorded
on the H200 (scripts/record_demo.py: written answers served as an LLM); copy that run's kforge.db over
kforge_tui/demo/kforge.db (one file, journal_mode DELETE) and nothing else changes.

The same stand-in also serves the TUI's live-refresh test (`--delay` slows it down so a reader sees
candidates arrive).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cards import OperatorCard
from engine.lane.evaluate import Evaluation  # noqa: E402
from engine.propose.base import Proposal, Usage  # noqa: E402
from engine.run.orchestrator import Budgets, Orchestrator  # noqa: E402
from engine.run.plan import CardState  # noqa: E402
from engine.run.store_recorder import StoreRecorder  # noqa: E402
from engine.store import Store, db_path, new_id, pack_single_file  # noqa: E402

LABEL = "STAND-IN: not a real run (CPU test double, synthetic numbers)"
CARDS = [  # (id, op, signature, calls, share, eager µs, roofline µs) — shapes only; times are synthetic
    ("standin-gn", "aten::native_group_norm", "f16[1,512,64,64] groups=32 eps=1e-06", 30, 0.34, 120.0, 30.0),
    ("standin-gelu", "aten::gelu", "f16[1,4096,1536] approximate='tanh'", 24, 0.26, 60.0, 18.0),
    ("standin-softmax", "aten::_softmax", "f16[1,24,1024,1024] dim=-1", 24, 0.22, 90.0, 35.0),
    ("standin-add", "aten::add.Tensor", "f16[1,512,64,64] + f16[1,512,64,64]", 60, 0.18, 14.0, 6.0),
]
KERNEL = """#include <cuda_fp16.h>
// {intent}
extern "C" __global__ void {name}(const __half* __restrict__ x, __half* __restrict__ y, long n) {{
    long i = (long)blockIdx.x * blockDim.x * {vec} + threadIdx.x;
    #pragma unroll
    for (int k = 0; k < {vec}; ++k) {{
        long j = i + (long)k * blockDim.x;
        if (j < n) y[j] = __float2half(__half2float(x[j]) * {scale}f);
    }}
}}
"""


class ScriptedProposer:
    """Deterministic proposals with a prompt and an answer, as an LLM proposer would record them."""

    name = "standin"
    repairs = False

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def supports(self, card) -> bool:
        return True

    async def propose(self, request) -> Proposal:
        await asyncio.sleep(self.delay)
        parent = request.parent.candidate_id if request.parent else "root"
        vec = 2 ** (request.seed % 4)
        intent = f"vectorise by {vec}, block {128 * (1 + request.seed % 4)} (from {parent})"
        src = KERNEL.format(intent=intent, name=f"k{request.seed}", vec=vec, scale=f"{1 + request.seed / 1000:.3f}")
        if request.seed % 11 == 5:  # a compile error the stand-in lane will report
            src = src.replace("blockDim.x * ", "blockDim_x * ", 1)
        spec = (f'[[launch]]\nkernel = "k{request.seed}"\ngrid = ["ceil_div(n, {128 * vec})", 1, 1]\n'
                'block = [128, 1, 1]\nargs = ["in0", "out0", "numel"]\n')
        prompt = (f"[stand-in prompt] Write a CUDA kernel for {request.card.op} {request.card.signature_text}.\n"
                  f"Parent: {parent}. Intent: {intent}.")
        answer = f"[stand-in answer] {intent}\n```cuda\n{src}```\n```toml\n{spec}```"
        return Proposal(source=src, spec=spec, intent=intent, provider="standin", model="scripted",
                        usage=Usage(tokens_in=1800 + 7 * request.seed, tokens_out=450 + 3 * request.seed,
                                    cost_usd=0.0, latency_s=self.delay), prompt=prompt, response=answer)


class StandInLane:
    """CPU test double of a GPU lane: verdicts and times from a hash of the source. Not a measurement."""

    FAILURES = ["mismatch", "runtime-fault", "timeout", "nan", "suspicious", "launch"]

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = asyncio.Lock()

    async def __call__(self, card: CardState, proposal: Proposal) -> Evaluation:
        async with self.lock:  # one evaluation at a time, like a lane
            await asyncio.sleep(self.delay)
        if "blockDim_x" in proposal.source:
            log = ('kernel.cu(4): error: identifier "blockDim_x" is undefined\n'
                   "1 error detected in the compilation of \"kernel.cu\".")
            return Evaluation("rejected", "compile", log, 0.05, log)
        h = int(hashlib.sha256(proposal.source.encode()).hexdigest()[:8], 16)
        eager = card.eager_us or 50.0
        if h % 10 < 3:
            cat = self.FAILURES[h % len(self.FAILURES)]
            verdict = {"ok": False, "category": cat, "message": f"stand-in {cat}", "input_set": "captured[0]",
                       "sets_checked": 1, "details": {"reports": [{
                           "name": "out0", "category": cat, "max_abs_err": 0.125, "max_rel_err": 0.04,
                           "mismatches": 96, "numel": 2097152, "first_bad_index": [0, 7, 3, 12],
                           "got": 0.8125, "expected": 0.6875}]} if cat in ("mismatch", "nan") else {}}
            return Evaluation("rejected", cat, f"stand-in {cat} (synthetic)", 0.05, payload={"verdict": verdict})
        roof = card.roofline_us or eager / 4
        t = roof * 1.2 + (eager * 1.3 - roof * 1.2) * ((h % 1000) / 1000) ** 2  # never faster than physics
        timing = {"eager": {"n": 100, "median": eager, "iqr": eager * 0.02, "min": eager * 0.98},
                  "candidate": {"n": 100, "median": t, "iqr": t * 0.02, "min": t * 0.98},
                  "speedup": eager / t, "speedup_ci": [eager / t * 0.98, eager / t * 1.02], "reps": 100,
                  "throttled": False}
        return Evaluation("verified", None, "", 0.05, payload={"timing": timing,
                                                                "verdict": {"ok": True, "sets_checked": 3}})


async def make_standin(workspace: Path, iterations: int, delay: float, announce: bool = False,
                       hold: bool = False) -> str:
    workspace.mkdir(parents=True, exist_ok=True)
    async with await Store.open(db_path(workspace)) as store:
        await store.save_capture({"id": "cap-standin", "model": "standin_model", "device": "cuda",
                                  "dtype": "float16"}, [
            {"card_id": cid, "op": op, "signature": {"op": op, "args": [], "aliases": []}, "signature_text": sig,
             "calls": calls, "share": share, "bytes": 1 << 20} for cid, op, sig, calls, share, _, _ in CARDS], [])
        for cid, _, _, _, _, eager, roof in CARDS:
            await store.update_card_eager("cap-standin", cid, eager_us=eager, roofline_us=roof, eager_stats=None)
        run = await store.create_run("cap-standin", "standin_model", "standin",
                                     {"label": LABEL, "iterations": iterations, "strategy": "mcts"})
        if announce:
            print(run["id"], flush=True)
        if hold:  # a reader gets ready first: no candidate is written before it says so on stdin
            await asyncio.to_thread(sys.stdin.readline)
        cards = [CardState(OperatorCard(cid, op, {}, sig, [], share=share, bytes=1 << 20, eager_us=eager,
                                        roofline_us=roof), ["s"]) for cid, op, sig, _, share, eager, roof in CARDS]
        recorder = StoreRecorder(store, run["id"])
        o = Orchestrator(cards=cards, proposer=ScriptedProposer(delay), evaluate=StandInLane(delay),
                         recorder=recorder, new_id=lambda: new_id("cand"),
                         budgets=Budgets(iterations_per_card=iterations), max_proposals=3, poll_s=0.01)
        recorder.orchestrator = o
        await o.run()
        return run["id"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--standin", action="store_true", required=True,
                    help="generate with the CPU stand-in (the only mode here; a real run is recorded on a GPU)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "kforge_tui" / "demo")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds per proposal and per evaluation")
    ap.add_argument("--announce", action="store_true", help="print the run id as soon as it exists")
    ap.add_argument("--hold", action="store_true", help="after announcing, wait for a line on stdin before searching")
    args = ap.parse_args()
    db = db_path(args.out)
    if not args.announce:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    run_id = asyncio.run(make_standin(args.out, args.iterations, args.delay, args.announce, args.hold))
    if not args.announce:  # one self-contained file to ship
        pack_single_file(db)
        print(f"wrote {db} (run {run_id}; {LABEL})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
