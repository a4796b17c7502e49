"""A run driven by the real orchestrator and store, with a scripted proposer and StandInLane (a CPU test
double of a GPU lane with a deterministic cost model). Used by the kill -9 / resume test.

    python tests/run_standin.py WORKSPACE (new|resume RUN_ID) [--hang-at N]

Appends one line per COMPLETED evaluation to WORKSPACE/evaluations.log; with --hang-at N the N-th
evaluation never completes (so the test can kill the process in the middle of it).
"""

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cards import OperatorCard
from engine.lane.evaluate import Evaluation  # noqa: E402
from engine.propose.base import Proposal  # noqa: E402
from engine.run.orchestrator import Budgets, Orchestrator  # noqa: E402
from engine.run.plan import CardState  # noqa: E402
from engine.run.store_recorder import StoreRecorder, load_records  # noqa: E402
from engine.store import Store, db_path, new_id  # noqa: E402

CARDS = ["card-a", "card-b"]


class Proposer:
    name = "scripted"

    def supports(self, card):
        return True

    async def propose(self, request):
        await asyncio.sleep(0.02)
        parent = request.parent.candidate_id if request.parent else "root"
        n = len(request.siblings)
        return Proposal(source=f"// {request.card.card_id} child {n} of {parent} seed {request.seed}\n",
                        spec="[[launch]]", provider="scripted")


async def _recorded(db: Path, n: int, limit_s: float = 60.0) -> None:
    """Wait until `n` candidates are verified in the store at `db`."""
    import sqlite3
    import time

    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0) as conn:
                if conn.execute("SELECT COUNT(*) FROM candidates WHERE status = 'verified'").fetchone()[0] >= n:
                    return
        except sqlite3.OperationalError:
            pass
        await asyncio.sleep(0.02)


class StandInLane:
    def __init__(self, log: Path, hang_at: int | None):
        self.log, self.hang_at, self.count, self.lock = log, hang_at, 0, asyncio.Lock()

    async def __call__(self, card, proposal):
        async with self.lock:
            self.count += 1
            if self.hang_at is not None and self.count == self.hang_at:
                # Say "hanging" (the test kills us then) only once the earlier evaluations are in the store:
                # an evaluation finished but not yet recorded is one a kill makes the resume repeat, and on a
                # loaded machine the kill could land in that window (CI saw a candidate evaluated twice).
                await _recorded(self.log.parent / "kforge.db", self.hang_at - 1)
                (self.log.parent / "hanging").write_text("1")
                await asyncio.sleep(3600)
            await asyncio.sleep(0.01)
            with open(self.log, "a") as f:
                f.write(proposal.source.strip() + "\n")
        h = int(hashlib.sha256(proposal.source.encode()).hexdigest()[:8], 16)
        t = 40.0 / (1.0 + (h % 100) / 50.0)
        return Evaluation("verified", None, "", 0.0, payload={"timing": {
            "eager": {"median": 40.0}, "candidate": {"median": t}, "speedup": 40.0 / t,
            "speedup_ci": [40.0 / t, 40.0 / t]}})


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("workspace", type=Path)
    ap.add_argument("mode", choices=("new", "resume"))
    ap.add_argument("run_id", nargs="?")
    ap.add_argument("--hang-at", type=int)
    ap.add_argument("--iterations", type=int, default=6)
    args = ap.parse_args()
    args.workspace.mkdir(parents=True, exist_ok=True)
    async with await Store.open(db_path(args.workspace)) as store:
        if args.mode == "new":
            await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float16"}, [
                {"card_id": c, "op": "aten::gelu", "signature": {"op": "aten::gelu", "args": [], "aliases": []},
                 "signature_text": "", "calls": 1, "share": 0.5, "bytes": 100} for c in CARDS], [])
            run = await store.create_run("cap-1", "m", "scripted", {"iterations": args.iterations})
            print(run["id"], flush=True)
        else:
            run = await store.get_run(args.run_id)
        cards = [CardState(OperatorCard(c, "aten::gelu", {}, bytes=100, eager_us=40.0, roofline_us=1.0, share=0.5),
                           ["s"]) for c in CARDS]
        o = Orchestrator(cards=cards, proposer=Proposer(), evaluate=StandInLane(args.workspace / "evaluations.log",
                                                                                  args.hang_at),
                         recorder=StoreRecorder(store, run["id"]), new_id=lambda: new_id("cand"),
                         budgets=Budgets(iterations_per_card=args.iterations), max_proposals=3, poll_s=0.01)
        resume = o.restore(await load_records(store, run["id"]))
        print("stopped:", await o.run(resume), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
