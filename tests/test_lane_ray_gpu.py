"""On the GPU: one Ray GPU actor (`num_gpus=1`, its own lane worker) runs a real search of a small card with
the builtin proposer, and a local lane gives every candidate of that search the same status and category.
Needs a CUDA GPU and Ray (`pip install -e ".[ray]"`)."""

import asyncio
import os

import pytest
import torch
from conftest import ROOT

ray = pytest.importorskip("ray")

from engine.capture.signature import signature_text  # noqa: E402
from engine.capture.single import capture_card  # noqa: E402
from engine.cards import OperatorCard  # noqa: E402
from engine.compile import CompilePool, Compiler  # noqa: E402
from engine.lane.client import GpuLane, worker_argv  # noqa: E402
from engine.propose.base import Hardware  # noqa: E402
from engine.propose.builtin import BuiltinProposer  # noqa: E402
from engine.run.evaluators import LaneEvaluator, start_ray_evaluator  # noqa: E402
from engine.run.orchestrator import Budgets, NullRecorder, Orchestrator  # noqa: E402
from engine.run.plan import CardState  # noqa: E402

TIMING = {"max_seconds": 1.0}


def worker_path() -> str:
    """The workers' PYTHONPATH: this checkout first, then the driver's own (where Ray itself may live)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


class Finished(NullRecorder):
    def __init__(self):
        self.done = []

    async def candidate_finished(self, rec):
        self.done.append(rec)


@pytest.mark.gpu
def test_one_ray_gpu_actor_searches_a_card_and_matches_the_local_lane(tmp_path):
    x = torch.randn(1 << 20, device="cuda")
    ref = capture_card(tmp_path / "card", lambda: torch.relu(x), samples=2)
    card = OperatorCard(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs,
                        bytes=ref.bytes, eager_us=20.0, share=1.0)
    assert BuiltinProposer().supports(card)
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, object_store_memory=200 * 2**20,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": worker_path()}})
    try:
        ray_done, local = asyncio.run(_both(tmp_path, card, ref.samples))
    finally:
        ray.shutdown()
    assert len(ray_done) >= 3
    assert any(r.status == "verified" for r in ray_done)
    assert [(r.status, r.category) for r in ray_done] == local


async def _both(tmp_path, card, samples):
    async with CompilePool() as pool:
        ev = await start_ray_evaluator(None, dry=False, arch="sm_90", timing=TIMING, poll_s=0, max_lanes=1)
        try:
            lanes = ev.lanes
            assert len(lanes.names()) == 1 and list(lanes.by_host()) and "/gpu" in lanes.names()[0]
            hello = (await lanes.lanes[0].request("hello")).payload
            hw = Hardware(hello["name"], hello["arch"], hello["sms"], hello["l2_bytes"], hello["copy_bw"],
                          hello["max_shared_per_block"])
            ev.compiler = Compiler(tmp_path / "cache", "nvrtc", arch=hello["arch"])
            ev.pool = pool
            rec = Finished()
            ids = iter(range(10**6))
            o = Orchestrator(cards=[CardState(card, samples)], proposer=BuiltinProposer(), evaluate=ev,
                             recorder=rec, new_id=lambda: f"n{next(ids)}", hardware=hw,
                             budgets=Budgets(iterations_per_card=6), max_proposals=2)
            await o.run()
        finally:
            await ev.lanes.close()
        # The same candidates, one by one, on a local lane of the same GPU (the actor has let go of it).
        lane = GpuLane(worker_argv(0), timeout_s=120)
        await lane.start()
        try:
            local = LaneEvaluator([lane], ev.compiler, pool, timing=TIMING)
            state = CardState(card, samples)
            out = []
            for r in rec.done:
                e = await local(state, r.proposal)
                out.append((e.status, e.category))
        finally:
            await lane.close()
    return rec.done, out
