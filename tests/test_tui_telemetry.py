"""What the engine records for the TUI and what the user then sees: proposer calls in flight, GPU lanes
busy or idle, and the compiler's full log of a candidate that failed to compile (a real NVRTC failure).

The engine side is real (Store, Orchestrator, StoreRecorder, LaneEvaluator with NVRTC); only the
proposer is scripted and the lane's GPU work is a stand-in (no GPU here)."""

import asyncio

import pytest
from tui_helpers import screen_text

import engine.run.evaluators as evaluators
from engine.cards import OperatorCard
from engine.lane.evaluate import Evaluation
from engine.propose.base import Proposal
from engine.run.evaluators import CompileOnlyEvaluator, LaneEvaluator
from engine.run.orchestrator import Budgets, Orchestrator
from engine.run.plan import CardState
from engine.run.store_recorder import StoreRecorder
from engine.store import Store, db_path, new_id
from kforge_tui.app import KforgeApp

GOOD = r'''
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
'''
BROKEN = r'''
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim_x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
'''


class GatedProposer:
    """Answers only when the test opens the gate; `sources` are handed out in order."""

    name = "scripted"

    def __init__(self, sources):
        self.sources = list(sources)
        self.gate = asyncio.Event()
        self.waiting = 0

    def supports(self, card):
        return True

    async def propose(self, request):
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        return Proposal(source=self.sources.pop(0), spec={"launches": []}, provider="scripted")


class Lane:
    def __init__(self, name):
        self.name = name


def _card(card_id="card-a"):
    return CardState(OperatorCard(card_id, "aten::mul.Tensor", {}, bytes=100, eager_us=40.0, roofline_us=1.0,
                                  share=0.5), ["s"])


async def _workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    store = await Store.open(db_path(ws))
    await store.save_capture({"id": "cap-1", "model": "m", "device": "cuda", "dtype": "float32"}, [
        {"card_id": "card-a", "op": "aten::mul.Tensor", "signature": {"op": "aten::mul.Tensor", "args": [],
                                                                   "aliases": []},
         "signature_text": "f32[1024] * 2", "calls": 1, "share": 1.0, "bytes": 8192}], [])
    run = await store.create_run("cap-1", "m", "scripted", {"iterations": 1}, status="running")
    return ws, store, run["id"]


async def _until(pilot, app, cond, what, timeout=20.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        app.poll_now()
        await pilot.pause(0.05)
        if cond():
            return
    pytest.fail(f"timed out waiting for: {what}\n{screen_text(app)}")


@pytest.fixture
def compiler(tmp_path):
    from engine.compile import Compiler

    return Compiler(tmp_path / "cache", "nvrtc", arch="sm_90")


async def test_overview_shows_proposer_calls_in_flight_and_lanes_busy_or_idle(tmp_path, compiler, monkeypatch):
    ws, store, run_id = await _workspace(tmp_path)
    lane_gate, on_lane = asyncio.Event(), asyncio.Event()

    async def gpu_work(lane, card, compiled, spec, **kw):  # stands in for the lane's GPU check
        on_lane.set()
        await lane_gate.wait()
        return Evaluation("verified", None, "", 0.0, payload={"timing": {
            "eager": {"median": 40.0}, "candidate": {"median": 20.0}, "speedup": 2.0, "speedup_ci": [2.0, 2.0]}})

    monkeypatch.setattr(evaluators, "evaluate", gpu_work)
    proposer = GatedProposer([GOOD])
    recorder = StoreRecorder(store, run_id)
    await recorder.event("lanes", {"lanes": ["lane0", "lane1"]})
    orch = Orchestrator(cards=[_card()], proposer=proposer, recorder=recorder, new_id=lambda: new_id("cand"),
                        evaluate=LaneEvaluator([Lane("lane0"), Lane("lane1")], compiler),
                        budgets=Budgets(iterations_per_card=1), max_proposals=1, poll_s=0.01)
    recorder.orchestrator = orch
    app = KforgeApp(db_path(ws), run_id, refresh_s=0)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            task = asyncio.create_task(orch.run())
            await _until(pilot, app, lambda: "1 proposer call in flight" in screen_text(app),
                         "the blocked proposer call shows as in flight")
            assert proposer.waiting == 1
            assert "idle lane0 lane1" in screen_text(app), "no evaluation yet: both lanes idle"

            proposer.gate.set()
            await asyncio.wait_for(on_lane.wait(), 30)
            await _until(pilot, app, lambda: "lane0 busy cand-" in screen_text(app), "lane0 busy")
            text = screen_text(app)
            assert "0 proposer calls in flight" in text
            assert "idle lane1" in text
            cand = app.snapshot.stats.lanes[0].candidate_id
            assert cand in text and cand in app.model.nodes

            lane_gate.set()
            assert await asyncio.wait_for(task, 30) == "iterations"
            await _until(pilot, app, lambda: "idle lane0 lane1" in screen_text(app), "both lanes idle again")
        rows = await store.evaluations(run_id)
        assert [(r["lane"], r["candidate_id"], r["verdict"]) for r in rows] == [("lane0", cand, "verified")]
        assert rows[0]["finished_at"] >= rows[0]["started_at"]
    finally:
        await store.close()


async def test_compile_log_tab_shows_the_nvrtc_error_of_a_failed_compile(tmp_path, compiler):
    ws, store, run_id = await _workspace(tmp_path)
    proposer = GatedProposer([BROKEN])
    proposer.gate.set()
    recorder = StoreRecorder(store, run_id)
    orch = Orchestrator(cards=[_card()], proposer=proposer, recorder=recorder, new_id=lambda: new_id("cand"),
                        evaluate=CompileOnlyEvaluator(compiler), budgets=Budgets(iterations_per_card=1),
                        max_proposals=1, poll_s=0.01)
    try:
        assert await orch.run() == "iterations"
        (cand,) = await store.candidates(run_id)
    finally:
        await store.close()
    assert cand["status"] == "rejected" and cand["category"] == "compile"
    log = cand["compile_log"]
    error_line = next(line for line in log.splitlines() if 'identifier "blockDim_x" is undefined' in line)

    app = KforgeApp(db_path(ws), run_id, refresh_s=0)
    async with app.run_test(size=(160, 40)) as pilot:
        app.open_candidate(cand["id"])
        await pilot.pause(0.3)
        text = screen_text(app)
    assert "Log" in text, "a compile failure opens on the compile log tab"
    assert error_line.strip()[:100] in text, text
    assert "summary as stored by the engine" not in text, "the full log, not the one-line summary"


async def test_resume_frees_lanes_a_killed_engine_left_busy(tmp_path):
    ws, store, run_id = await _workspace(tmp_path)
    try:
        cid, _ = await store.add_candidate(run_id, "card-a", parent_id=None, source=GOOD, launch_spec={},
                                           proposer="scripted", status="evaluating")
        await store.start_evaluation(run_id, cid, "lane0")  # then the engine was killed
        await StoreRecorder(store, run_id).status("running")  # a new engine process resumes the run
        (row,) = await store.evaluations(run_id)
        assert row["verdict"] == "interrupted" and row["finished_at"] is not None
    finally:
        await store.close()
