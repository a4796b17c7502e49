"""Lanes on Ray (engine.lane.ray_lanes), on a local Ray cluster with CPU-only lanes (conftest.ray_cluster): a
joining node adds a lane, a dry run spread over two compile actors evaluates every candidate exactly once, an
actor killed mid-run loses no candidate and counts none twice, GPU-style actors ship samples once and survive a
worker crash, and nothing imports Ray unless asked. Skipped where Ray is not installed (`pip install -e ".[ray]"`)."""

import asyncio
import sys
import time
from collections import Counter

import pytest
from conftest import ROOT

ray = pytest.importorskip("ray")

from engine.cards import OperatorCard  # noqa: E402
from engine.compile import CompileResult  # noqa: E402
from engine.errors import UsageError  # noqa: E402
from engine.lane.ray_lanes import LANE_LOST, RayLanes, require_ray  # noqa: E402
from engine.propose.base import Proposal  # noqa: E402
from engine.run.evaluators import RayLaneEvaluator, start_ray_evaluator  # noqa: E402
from engine.run.orchestrator import Budgets, NullRecorder, Orchestrator  # noqa: E402
from engine.run.plan import CardState  # noqa: E402

STANDIN = [sys.executable, str(ROOT / "tests" / "lane_standin.py")]


@pytest.fixture(scope="module")
def local_ray(ray_cluster):
    """This process connected to the shared local cluster (a head with 2 CPUs) for this module's tests, then
    disconnected: its actors end with it."""
    ray.init(address=ray_cluster.address, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.xdist_group("ray")  # conftest.ray_cluster: one cluster per worker
def test_a_joining_node_adds_a_lane(local_ray, ray_cluster, tmp_path):
    """A node of one CPU joins the shared cluster (a head of 2) under running lanes: a lane is started on it. The
    node is removed at the end, and the test waits until the cluster is its head alone again."""
    added = []

    async def main():
        lanes = await RayLanes.start(None, compile_only=True, arch="sm_90", cache_dir=str(tmp_path), poll_s=0.5)
        try:
            before = lanes.names()
            added.append(ray_cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20))
            for _ in range(120):  # the poll notices the node and starts an actor on it
                if len(lanes.names()) == 3:
                    break
                await asyncio.sleep(0.5)
            evs = await asyncio.gather(*(lanes.compile_only(CountingProposer().source(i)) for i in range(4)))
            return before, lanes.names(), evs
        finally:
            await lanes.close()

    try:
        before, after, evs = asyncio.run(main())
    finally:
        for node in added:
            ray_cluster.remove_node(node)
        for _ in range(120):  # the next test's lanes count the head's CPUs alone
            if ray.cluster_resources().get("CPU") == 2:
                break
            time.sleep(0.5)
    assert len(before) == 2 and len(after) == 3 and set(before) < set(after)
    assert [e.status for e in evs] == ["compiled"] * 4


class CountingProposer:
    """Distinct valid kernels, one per request (a stand-in proposer: the lanes are under test, not it)."""

    name = "counting"
    repairs = False

    def __init__(self):
        self.n = 0

    def supports(self, card):
        return True

    @staticmethod
    def source(n):
        return ('extern "C" __global__ void scale(float* y, const float* x, int n) {\n'
                '  int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
                f'  if (i < n) y[i] = x[i] * {n}.0f;\n}}\n')

    async def propose(self, request):
        self.n += 1
        return Proposal(source=self.source(self.n), spec="scale grid=(1) block=(32)", intent="fresh")


class WatchingRecorder(NullRecorder):
    """Keeps what a user's store would: each candidate's finish (and its status), each lane taken."""

    def __init__(self, on_busy=None):
        self.finished: Counter[str] = Counter()
        self.outcome: dict[str, tuple[str, str | None]] = {}
        self.proposed: list[str] = []
        self.busy: list[tuple[str, str]] = []
        self.freed: list[tuple[str, str | None]] = []
        self.on_busy = on_busy

    async def candidate_proposed(self, rec):
        self.proposed.append(rec.id)
        return rec.id

    async def candidate_finished(self, rec):
        self.finished[rec.id] += 1
        self.outcome[rec.id] = (rec.status, rec.category)

    async def lane_busy(self, candidate_id, lane):
        self.busy.append((candidate_id, lane))
        if self.on_busy is not None:
            self.on_busy(candidate_id, lane)
        return len(self.busy)

    async def lane_free(self, token, status, category):
        self.freed.append((status, category))


def _cards(n=2):
    return [CardState(OperatorCard(f"c{i}", "aten::relu", {}, bytes=100, eager_us=40.0, share=0.5),
                      [f"c{i}.safetensors"]) for i in range(n)]


async def _dry_run(lanes, recorder, iterations=4):
    ids = iter(range(10_000))
    o = Orchestrator(cards=_cards(), proposer=CountingProposer(), evaluate=RayLaneEvaluator(lanes),
                     recorder=recorder, new_id=lambda: f"cand{next(ids)}", budgets=Budgets(iterations),
                     max_proposals=4, poll_s=0.02)
    return await o.run()


@pytest.mark.xdist_group("ray")  # conftest.ray_cluster: one cluster per worker
def test_dry_run_over_two_compile_actors_evaluates_each_candidate_once(local_ray, tmp_path):
    async def main():
        ev = await start_ray_evaluator(None, dry=True, arch="sm_90", cache_dir=str(tmp_path), poll_s=0.5)
        try:
            rec = WatchingRecorder()
            stopped = await _dry_run(ev.lanes, rec)
            return stopped, rec, await ev.lanes.stats(), ev.lanes.names()
        finally:
            await ev.lanes.close()

    stopped, rec, stats, names = asyncio.run(main())
    assert stopped == "iterations"
    assert len(names) == 2
    assert len(rec.proposed) == 8
    assert rec.finished == Counter({c: 1 for c in rec.proposed})  # every candidate, exactly once
    assert {s for s, _ in rec.outcome.values()} == {"compiled"}
    assert sum(s["evaluations"] for s in stats) == 8  # no actor compiled one twice
    assert {lane for _, lane in rec.busy} == set(names)  # the work was spread over both actors


@pytest.mark.xdist_group("ray")  # conftest.ray_cluster: one cluster per worker
def test_actor_killed_mid_run_loses_no_candidate_and_counts_none_twice(local_ray, tmp_path):
    async def main():
        ev = await start_ray_evaluator(None, dry=True, arch="sm_90", cache_dir=str(tmp_path), poll_s=0.5)
        lanes = ev.lanes
        killed = []

        def kill_third(candidate_id, lane_name):
            if len(rec.busy) == 3:  # the third lane taken: its actor dies under the candidate
                killed.append((candidate_id, lane_name))
                ray.kill(lanes.lane(lane_name).actor)

        rec = WatchingRecorder(kill_third)
        try:
            stopped = await _dry_run(lanes, rec)
            await lanes.grow(wait=True)  # the lost actor's CPU is free again: a new lane takes it
            return stopped, rec, killed, lanes.lost, lanes.requeued, lanes.names()
        finally:
            await lanes.close()

    stopped, rec, killed, lost, requeued, names = asyncio.run(main())
    assert stopped == "iterations"
    assert rec.finished == Counter({c: 1 for c in rec.proposed})
    assert {s for s, _ in rec.outcome.values()} == {"compiled"}  # the killed one was re-queued and compiled
    (victim, lane), = killed
    assert lost == [lane] and requeued == 1
    assert [c for c, _ in rec.busy].count(victim) == 2  # two lanes taken for it, one finish
    assert ("interrupted", LANE_LOST) in rec.freed
    assert len(names) == 2 and lane not in names


@pytest.mark.xdist_group("ray")  # conftest.ray_cluster: one cluster per worker
def test_second_lost_lane_rejects_the_candidate_once(local_ray, tmp_path):
    async def main():
        lanes = await RayLanes.start(None, compile_only=True, arch="sm_90", cache_dir=str(tmp_path), poll_s=0.5)
        victim = []

        def kill_first_candidates_lanes(candidate_id, lane_name):
            victim[:1] = victim[:1] or [candidate_id]
            if candidate_id == victim[0]:  # every lane this candidate lands on dies under it
                ray.kill(lanes.lane(lane_name).actor)

        rec = WatchingRecorder(kill_first_candidates_lanes)
        try:
            stopped = await _dry_run(lanes, rec, iterations=2)
            return stopped, rec, victim[0], lanes.requeued
        finally:
            await lanes.close()

    stopped, rec, victim, requeued = asyncio.run(main())
    assert stopped == "iterations"
    assert rec.finished == Counter({c: 1 for c in rec.proposed})
    assert rec.outcome[victim][0] == "rejected" and rec.outcome[victim][1] == LANE_LOST
    assert requeued == 1
    others = {c: s for c, s in rec.outcome.items() if c != victim}
    assert others and {s for s, _ in others.values()} == {"compiled"}  # replacement lanes did the rest


@pytest.mark.xdist_group("ray")  # conftest.ray_cluster: one cluster per worker
def test_lane_actor_ships_samples_once_and_outlives_a_worker_crash(local_ray, tmp_path):
    """A GPU-style actor (here without a GPU, around the stand-in worker): the card's samples are sent
    once, a crashing request replaces only the worker, and the card is loaded again in the new one."""
    sample = tmp_path / "c0-0.safetensors"
    sample.write_bytes(b"not really safetensors: the stand-in worker does not read it")
    card = OperatorCard("c0", "aten::relu", {}, bytes=100).ref([str(sample)])
    compiled = CompileResult(ok=True, cubin=b"\x7fELF stand-in", ptx=None, log="", diagnostics=(), arch="sm_90",
                             compiler="nvrtc", seconds=0.0, source_hash="h", kernels=("k",))

    async def main():
        lanes = await RayLanes.start(None, worker=STANDIN, gpus_per_lane=0, max_lanes=1, poll_s=0)
        try:
            lane = lanes.lanes[0]
            first = await lanes.evaluate(card, compiled, "k grid=(1) block=(32)")
            crash = await lane.request("crash")
            second = await lanes.evaluate(card, compiled, "k grid=(1) block=(32)")
            return first, crash, second, lane._sent, await lanes.stats()
        finally:
            await lanes.close()

    first, crash, second, sent, stats = asyncio.run(main())
    assert first.status == "verified" and second.status == "verified"
    assert crash.category == "runtime-fault" and crash.restarted
    assert sent == {"c0"}
    (s,) = stats
    assert s["evaluations"] == 2 and s["worker_restarts"] == 1


def test_ray_missing_is_a_one_line_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(UsageError) as e:
        require_ray()
    assert 'pip install -e ".[ray]"' in str(e.value) and "\n" not in str(e.value)


@pytest.mark.xdist_group("engine_import_probe")
def test_engine_and_cli_help_never_import_ray(engine_import_probe):
    # conftest.IMPORT_PROBE: every engine module, `--help` and `run --help`, then the Ray modules loaded (said
    # before the probe goes on to a capture, whose own outcome test_import_hygiene reads)
    said = [line for line in engine_import_probe.stderr.splitlines() if line.startswith("RAY:")]
    assert said == ["RAY: []"], engine_import_probe.stderr[-2000:]
